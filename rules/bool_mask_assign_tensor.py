from __future__ import annotations

import libcst as cst

from gpulint import Device, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg, method_name, walk
from gpulint.semantic.masks import (
    hot_mask_assignment,
    mask_index_layout,
    mask_rewrite,
    same_code,
    tensor_verdict,
)

# Full reductions: called without arguments they return a 0-d tensor on the receiver's device.
_FULL_REDUCTIONS = {"sum", "mean", "max", "min", "amax", "amin", "prod", "norm", "std", "var", "median",
                    "nansum", "nanmean"}
_SUGGEST_NOTE = ("use `x.copy_(torch.where(mask, values, x))` when the values broadcast over `x`, or "
                 "`x.masked_scatter_(mask, values)` when they hold one element per selected position")


class BoolMaskAssignTensor(Rule):
    """
    ## What it does
    Finds boolean-mask assignments of tensor values in the training step, the forward pass or compiled code:
    `x[mask] = y[mask]`, `x[mask] = <0-d tensor on the device>`, `x[mask] = values`. The first two are
    rewritten to `x.copy_(torch.where(mask, y, x))`.

    ## Why is this slow
    `x[mask] = y[mask]` reads `y[mask]` (data-dependent shape: the host waits for the GPU to count the
    selected elements) and scatters it back: 2-3 host syncs per statement (H100 and H200, torch 2.11), a graph
    break under `torch.compile` and a failed CUDA-graph capture. Assigning a 0-d CUDA tensor costs one sync
    (the value is read back to the host to call `masked_fill_`). The `torch.where` forms cost none and capture.

    ## Example
    ```python
    terminal = dones.bool()
    target[terminal] = returns[terminal]
    ```

    ## Use instead
    ```python
    terminal = dones.bool()
    target.copy_(torch.where(terminal.reshape(terminal.shape + (1,) * (target.dim() - terminal.dim())),
                             returns, target))
    ```
    (No reshape when the mask is a comparison of `target` itself or of the tensor it was made `*_like` from.)
    A compound mask that has to be reshaped is bound to a name first (`mask = tokens == 0`), so it is evaluated
    once; `x[~name] = ...`, whose mask is known only by its name, is rewritten under a dtype guard
    (`if name.dtype == torch.bool:` the rewrite, `else:` the original statement).

    ## Fix safety
    Safe when the mask is a boolean tensor by construction and the receiver is a tensor: the result is copied
    back in place (views of `x` see it), values cast to `x`'s dtype exactly as index assignment does, and
    gradients flow to `y` at the selected positions and to the old `x` elsewhere, as before. The mask is
    reshaped to broadcast over `x`'s trailing dimensions. A mask from a comparison or a logical op needs no
    proof of its dtype; a name under `~` gets the dtype guard, exact for integer indices too. Masks known only by
    their name are not reported (`x[idx] = y[idx]` with integer indices does not sync), except `x[~name]`. Other
    tensor values are reported without a fix: whether they broadcast over `x` (`where`) or hold one element
    per selected position (`masked_scatter_`) depends on shapes gpulint cannot see.
    """

    code = "GPU002"
    name = "bool-mask-assign-tensor"
    message = "Boolean-mask assignment of a tensor value syncs the host; use `torch.where` / `masked_scatter_`"
    fix_title = "Rewrite as `x.copy_(torch.where(mask, value, x))`"
    severity = Severity.WARNING
    safety = Safety.SAFE
    priority = "P1"
    triggers = ("] =", "]=")
    examples = [
        Valid(  # receiver and mask built on the CPU by this code (moved afterwards): the nonzero runs on the host
            """
            import torch
            class Scaled(torch.nn.Module):
                def forward(self, ids):
                    kinds = self.kind_list
                    kinds = torch.Tensor(kinds).long()
                    scale = torch.ones_like(kinds).to(torch.float32)
                    scale[torch.remainder(kinds, 3) == 0] = torch.sqrt(torch.tensor([0.25]))
                    return self.embed(ids) * scale.to(ids.device)[:, None]
            model = Scaled().cuda()
            """
        ),
        Valid(  # scalar values are GPU003
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    x = x.float()
                    x[x < 0] = 0.0
                    return x
            """
        ),
        Valid(  # NumPy arrays in an RL loop
            """
            import numpy as np
            values = np.zeros(16)
            returns = np.ones(16)
            for it in range(100):
                values[returns > 0] = returns[returns > 0]
                loss = model(batch).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            class Blend(torch.nn.Module):
                def forward(self, x, y):
                    out = torch.zeros_like(x)
                    keep = y > 0
                    out[keep] = y[keep]
                    return out
            """,
            fixed="""
            import torch
            class Blend(torch.nn.Module):
                def forward(self, x, y):
                    out = torch.zeros_like(x)
                    keep = y > 0
                    out.copy_(torch.where(keep.reshape(keep.shape + (1,) * (out.dim() - keep.dim())), y, out))
                    return out
            """,
        ),
        Invalid(  # a compound mask is bound to a name first
            """
            import torch
            class Blend(torch.nn.Module):
                def forward(self, x, y, tokens):
                    out = torch.zeros_like(x)
                    out[tokens == 0] = y[tokens == 0]
                    return out
            """,
            fixed="""
            import torch
            class Blend(torch.nn.Module):
                def forward(self, x, y, tokens):
                    out = torch.zeros_like(x)
                    mask = tokens == 0
                    out.copy_(torch.where(mask.reshape(mask.shape + (1,) * (out.dim() - mask.dim())), y, out))
                    return out
            """,
        ),
        Invalid(
            """
            import torch
            class Clip(torch.nn.Module):
                def forward(self, x):
                    x = x.clone()
                    x[x > 3] = x.mean()
                    return x
            """,
            fixed="""
            import torch
            class Clip(torch.nn.Module):
                def forward(self, x):
                    x = x.clone()
                    x.copy_(torch.where(x > 3, x.mean(), x))
                    return x
            """,
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ", "ALIAS", "GB", "CG", "SYNC"),
        setup=("x = torch.randn(6, 4, requires_grad=True)\n"
               "y = torch.randn(6, 4, requires_grad=True)\n"
               "rows = torch.rand(6) > 0.5\n"
               "tokens = torch.randint(0, 3, (6,))\n"
               "w = torch.randn(6, 4, requires_grad=True)\n"
               "base = torch.randn(6, 4)\n"
               "view = base[2:]"),
        before=("out = x * 1\n"
                "out[rows] = y[rows]\n"
                "out[tokens == 0] = w[tokens == 0]\n"
                "out[out > 1] = y.mean()\n"
                "z = base[2:] * 2\n"
                "m2 = z < 0\n"
                "view[m2] = z[m2]"),
        after=("out = x * 1\n"
               "out.copy_(torch.where(rows.reshape(rows.shape + (1,) * (out.dim() - rows.dim())), y, out))\n"
               "mask = tokens == 0\n"
               "out.copy_(torch.where(mask.reshape(mask.shape + (1,) * (out.dim() - mask.dim())), w, out))\n"
               "out.copy_(torch.where(out > 1, y.mean(), out))\n"
               "z = base[2:] * 2\n"
               "m2 = z < 0\n"
               "view.copy_(torch.where(m2.reshape(m2.shape + (1,) * (view.dim() - m2.dim())), z, view))"),
        compare=("out", "base"),
    )

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if self.ctx.evidence.is_scalar_literal(value):
            return  # GPU003
        site = hot_mask_assignment(self.ctx, node)
        if site is None:
            return
        layout = site.layout
        same_mask_read = self._same_mask_read(value, layout)
        if same_mask_read is None and self._reads_same_mask(value, layout):
            return  # `out[m] = f(x[m])`: gather-compute-scatter, GPU004
        if same_mask_read is not None:
            if tensor_verdict(self.ctx, same_mask_read.value) is False:
                return
            source: cst.BaseExpression | None = same_mask_read.value
            zero_dim = False
        else:
            kind = self._value_kind(value)
            if kind is None:
                return
            zero_dim = kind == "0d"
            source = value if zero_dim else None
        replacement, imports, note = None, (), None
        if source is None:
            note = _SUGGEST_NOTE
        elif _mutates(source):
            note = "the value mutates a tensor in place; the rewrite would evaluate it in another order"
        else:
            where, imports = self.ctx.spell("torch.where")
            receiver, value_text = self.ctx.code(site.receiver), self.ctx.code(source)
            replacement, note, more = mask_rewrite(
                self.ctx, node, site, "torch.where",
                lambda mask: f"{receiver}.copy_({where}({mask}, {value_text}, {receiver}))")
            imports = tuple(dict.fromkeys(tuple(imports) + tuple(more))) if replacement is not None else ()
        message = None
        if zero_dim:
            message = ("Boolean-mask assignment of a 0-d device tensor reads it back to the host; "
                       "use `torch.where`")
        self.report(node, message, replacement=replacement, imports=imports, note=note)

    def _same_mask_read(self, value: cst.BaseExpression, layout) -> cst.Subscript | None:
        if not isinstance(value, cst.Subscript):
            return None
        other = mask_index_layout(value)
        if other is None or other.leading != layout.leading or other.ellipsis != layout.ellipsis:
            return None
        return value if same_code(self.ctx, other.mask, layout.mask) else None

    def _reads_same_mask(self, value: cst.BaseExpression, layout) -> bool:
        for node in walk(value):
            if isinstance(node, cst.Subscript):
                other = mask_index_layout(node)
                if other is not None and same_code(self.ctx, other.mask, layout.mask):
                    return True
        return False

    def _value_kind(self, value: cst.BaseExpression) -> str | None:
        """'0d': a 0-d tensor on the device of a tensor; 'tensor': another tensor; None: not known to be one
        (Python numbers in variables, CPU 0-d tensors: ATen already uses `masked_fill_` for those)."""
        if isinstance(value, cst.Call):
            qual = self.ctx.qualname(value.func) or ""
            if qual in ("torch.tensor", "torch.as_tensor", "torch.scalar_tensor"):
                device = call_arg(value, "device")
                if device is None or self.ctx.device_of(device.value) is Device.CPU:
                    return None  # a CPU value: ATen already takes the `masked_fill_` path
                first = value.args[0].value if value.args else None
                if first is not None and self.ctx.evidence.is_scalar_literal(first):
                    return "0d"
                return None
            name = method_name(value)
            if name in ("to", "cuda", "type_as") and isinstance(value.func, cst.Attribute) and \
                    isinstance(value.func.value, cst.Call) and \
                    self.ctx.qualname(value.func.value.func) in ("torch.tensor", "torch.as_tensor") and \
                    value.func.value.args and self.ctx.evidence.is_scalar_literal(value.func.value.args[0].value):
                return "0d"  # torch.tensor(-math.inf).to(x): a 0-d tensor moved to the device
            if name in _FULL_REDUCTIONS and not value.args and isinstance(value.func, cst.Attribute):
                if tensor_verdict(self.ctx, value.func.value) is True:
                    return "0d"
                return None
            if name == "new_tensor" and len(value.args) == 1 and \
                    self.ctx.evidence.is_scalar_literal(value.args[0].value):
                return "0d" if tensor_verdict(self.ctx, value.func.value) else None
        verdict = tensor_verdict(self.ctx, value)
        return "tensor" if verdict is True else None


def _mutates(node: cst.BaseExpression) -> bool:
    """An in-place call (`x.add_(1)`) inside the value: evaluation order would matter."""
    return any(isinstance(n, cst.Call) and (method_name(n) or "").endswith("_")
               and not (method_name(n) or "").startswith("__") for n in walk(node))
