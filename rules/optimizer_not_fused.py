from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg
from gpulint.builders import add_keyword
from gpulint.rules.cudnn_benchmark import program_texts

# Adagrad is left out: its fused kernel gained CUDA support only recently (torch 2.11 on an H200 raises
# "`fused=True` requires all the params to be floating point Tensors of supported devices: ['mps', 'xpu', ...]").
_FUSABLE = {"torch.optim.Adam", "torch.optim.AdamW", "torch.optim.SGD"}
# Arguments that conflict with `fused=True` (RuntimeError) or show the implementation was chosen on purpose.
_CONFLICTS = ("fused", "foreach", "differentiable", "capturable")
_TEST_PATH = re.compile(r"(^|[\\/])tests?[\\/]|(^|[\\/])test_[^\\/]*\.py$|_test\.py$")
# complex parameters (complex activations, e.g. FFTs or rotary embeddings, do not matter)
_COMPLEX_PARAMETER = re.compile(r"Parameter\([^\n]*\btorch\.(complex32|complex64|complex128|cfloat|cdouble|chalf)\b")
# CUDA text evidence, including the device-generic API (torch >= 2.6) and NCCL: CUDA on NVIDIA machines
_CUDA_TEXT = re.compile(
    r"""["']cuda(:\d+)?["']|\.cuda\(|torch\.cuda\.is_available\(|\btorch\.accelerator\.|["']nccl["']""")
_SPARSE_GRADS = re.compile(r"\bsparse\s*=\s*True\b")


class OptimizerNotFused(Rule):
    """
    ## What it does
    Finds `torch.optim.Adam`, `AdamW` and `SGD` built without `fused=` (and without `foreach=`) in a program
    that trains on CUDA, and adds `fused=True`. (`Adagrad` is not included: its fused kernel rejects CUDA
    parameters in torch 2.11.)

    ## Why is this slow
    By default these optimizers use the `foreach` implementation: a few multi-tensor kernels per update
    phase, with intermediate tensors. The fused implementation does the whole update of each parameter in
    one kernel. Measured on an H100, `AdamW.step` over 105M parameters in 200 tensors: for-loop 13.70 ms,
    foreach (the default) 3.24 ms, fused 1.19 ms. With `fused=True`, `GradScaler.step` also skips its
    `.item()` host sync. End to end the gain is small but free (torchtitan: +2.6% on Llama-8B).

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    ```

    ## Fix safety
    Unsafe: the fused kernel rounds differently, so parameters are equal to about 1e-7 relative, not bitwise
    (AdamW, 50 steps). `fused=True` raises for complex parameters, sparse gradients, and together with
    `foreach=True` or `differentiable=True`; the rule does not fire when any of `fused=`, `foreach=`,
    `differentiable=` or `capturable=` is given, nor in test files (which may compare parameters bitwise with
    a reference run), and offers no fix where the program creates complex parameters. Torch before 2.4 lacks fused
    SGD (check the version you pin).
    """

    code = "GPU032"
    name = "optimizer-not-fused"
    message = "Optimizer without `fused=True` in a CUDA program; the fused update kernel is ~2.7x faster"
    fix_title = "Add `fused=True`"
    severity = Severity.INFO
    safety = Safety.UNSAFE
    priority = "P2"
    triggers = ("Adam", "SGD")
    examples = [
        Valid(
            """
            import torch
            model = Net().cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
            """
        ),
        Valid(  # foreach chosen explicitly
            """
            import torch
            model = Net().to("cuda")
            optimizer = torch.optim.Adam(model.parameters(), foreach=False)
            """
        ),
        Valid(  # no CUDA in the program
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
        Invalid(
            """
            import torch
            from torch import optim
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            optimizer = optim.Adam(model.parameters(), lr=1e-3)
            """,
            fixed="""
            import torch
            from torch import optim
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            optimizer = optim.Adam(model.parameters(), lr=1e-3, fused=True)
            """,
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup=(
            "torch.manual_seed(0)\n"
            "w0 = [torch.randn(64, 32), torch.randn(32)]\n"
            "grads = [[torch.randn_like(w) for w in w0] for _ in range(50)]\n"
            "def train(**kw):\n"
            "    params = [w.clone().requires_grad_() for w in w0]\n"
            "    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, **kw)\n"
            "    for g in grads:\n"
            "        for p, gi in zip(params, g):\n"
            "            p.grad = gi.clone()\n"
            "        opt.step()\n"
            "    return torch.cat([p.detach().flatten() for p in params])"
        ),
        before="params = train()",
        after="params = train(fused=True)",
        compare=("params",),
        options={"rtol": 1e-5, "atol": 1e-7},
    )

    def visit_Call(self, node: cst.Call) -> None:
        qualified = self.ctx.qualname(node.func)
        if qualified not in _FUSABLE:
            return
        if any(arg.star for arg in node.args) or any(call_arg(node, key) is not None for key in _CONFLICTS):
            return
        program = self.ctx.program
        if not _trains_on_cuda(self.ctx):
            return
        if _TEST_PATH.search(self.ctx.path):
            return
        if qualified == "torch.optim.SGD" and program.search(_SPARSE_GRADS):
            return  # sparse embeddings: fused raises on sparse gradients
        if program.search(_COMPLEX_PARAMETER):
            self.report(node, note="the program has complex parameters: `fused=True` raises for them")
            return
        self.report(node, replacement=add_keyword(node, "fused", "True"))


def _trains_on_cuda(ctx) -> bool:
    """CUDA evidence in this file or in its program (the files connected to it by imports): a CPU example in a
    repository of examples does not fire because a sibling script uses CUDA."""
    analysis = ctx.analysis
    if analysis.cuda_evidence or analysis.maybe_cuda_evidence:
        return True
    return any(_CUDA_TEXT.search(text) for text in program_texts(ctx))
