from __future__ import annotations

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid

# torch 2.13 `torch.backends.cuda.sdp_kernel`: parameters in signature order, every one defaulting to True, and
# the order in which the implementation appends the backends to the list it hands to `sdpa_kernel`.
_PARAMETERS = ("enable_flash", "enable_math", "enable_mem_efficient", "enable_cudnn")
_BACKEND_ORDER = (("enable_flash", "FLASH_ATTENTION"), ("enable_mem_efficient", "EFFICIENT_ATTENTION"),
                  ("enable_math", "MATH"), ("enable_cudnn", "CUDNN_ATTENTION"))


class DeprecatedSdpKernel(Rule):
    """
    ## What it does
    Finds `torch.backends.cuda.sdp_kernel(...)` (also when imported as `sdp_kernel`) and rewrites it to
    `torch.nn.attention.sdpa_kernel([...])` with the same set of enabled SDPA backends.

    ## Why is this slow
    It is not slow: it is deprecated. Every call emits `FutureWarning: torch.backends.cuda.sdp_kernel() is
    deprecated. In the future, this context manager will be removed.`, and the replacement is the supported
    way to pin the attention kernel (for example to make sure FlashAttention is used).

    ## Example
    ```python
    with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False):
        y = F.scaled_dot_product_attention(q, k, v)
    ```

    ## Use instead
    ```python
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION,
                                         torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
        y = F.scaled_dot_product_attention(q, k, v)
    ```

    ## Fix safety
    Safe for literal `True`/`False` arguments: torch's own `sdp_kernel` builds exactly this list (flash, memory
    efficient, math, cuDNN, for the flags that are true) and calls `sdpa_kernel` with it. Every flag defaults
    to True, including `enable_cudnn`, so a call that only disables some backends keeps `CUDNN_ATTENTION`; a
    mapping that dropped it would change which kernels may run. Flags given as variables or `**kwargs` are
    reported without a fix.
    """

    code = "GPU031"
    name = "deprecated-sdp-kernel"
    message = "`torch.backends.cuda.sdp_kernel()` is deprecated; use `torch.nn.attention.sdpa_kernel()`"
    fix_title = "Replace with `torch.nn.attention.sdpa_kernel([...])`"
    severity = Severity.INFO
    safety = Safety.SAFE
    priority = "P2"
    triggers = ("sdp_kernel",)
    examples = [
        Valid(
            """
            import torch
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            """
        ),
        Valid(  # a function of the project that happens to have the name
            """
            def sdp_kernel(**flags):
                return flags
            ctx = sdp_kernel(enable_flash=True)
            """
        ),
        Invalid(
            """
            import torch
            with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False):
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            """,
            fixed="""
            import torch
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION, torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            """,
        ),
        Invalid(
            """
            from torch.backends.cuda import sdp_kernel
            from torch.nn.attention import SDPBackend
            with sdp_kernel(enable_math=False):
                pass
            """,
            fixed="""
            from torch.backends.cuda import sdp_kernel
            from torch.nn.attention import SDPBackend
            import torch
            with torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
                pass
            """,
        ),
        Invalid(  # flags chosen at run time: reported without a fix
            """
            import torch
            with torch.backends.cuda.sdp_kernel(enable_flash=use_flash):
                pass
            """
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ", "WARN"),
        setup="import warnings",
        before=(
            "with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False):\n"
            "    flags = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),\n"
            "             torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())"
        ),
        after=(
            "with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION,\n"
            "                                     torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):\n"
            "    flags = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),\n"
            "             torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())"
        ),
        compare=("flags",),
        options={"warning": "FutureWarning"},
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.backends.cuda.sdp_kernel":
            return
        flags = dict.fromkeys(_PARAMETERS, True)
        positional = 0
        for arg in node.args:
            if arg.star:
                self.report(node, note="flags passed with `*`/`**`: rewrite by hand")
                return
            if arg.keyword is None:
                if positional >= len(_PARAMETERS):
                    return  # more arguments than the function takes: it raises anyway
                key = _PARAMETERS[positional]
                positional += 1
            else:
                key = arg.keyword.value
                if key not in flags:
                    return
            value = arg.value
            if not (isinstance(value, cst.Name) and value.value in ("True", "False")):
                self.report(node, note=f"`{key}` is not a literal True/False: rewrite by hand")
                return
            flags[key] = value.value == "True"
        function, imports = self.ctx.spell("torch.nn.attention.sdpa_kernel")
        backend, more = self.ctx.spell("torch.nn.attention.SDPBackend")
        names = [f"{backend}.{member}" for key, member in _BACKEND_ORDER if flags[key]]
        backends = cst.parse_expression(f"[{', '.join(names)}]")
        # keep the call's own layout: what follows `(` (a comment, a newline) and what precedes `)`
        last = node.args[-1] if node.args else None
        arg = cst.Arg(backends, comma=last.comma if last else cst.MaybeSentinel.DEFAULT,
                      whitespace_after_arg=last.whitespace_after_arg if last else cst.SimpleWhitespace(""))
        replacement = node.with_changes(func=cst.parse_expression(function), args=[arg])
        requests = tuple(dict.fromkeys((*imports, *more)))
        self.report(node, replacement=replacement, imports=requests)
