from __future__ import annotations

import libcst as cst

from gpulint import HotKind, Invalid, Rule, Severity, Valid
from gpulint.analysis import call_arg, method_name
from gpulint.semantic.masks import numpy_in_file, tensor_verdict
from gpulint.semantic.placement import HOST, Placement, on_error_path

# torch functions whose output size depends on the data (x[mask] and masked_select are GPU001)
_FUNCTIONS = {"torch.nonzero": "nonzero", "torch.argwhere": "argwhere", "torch.unique": "unique",
              "torch.unique_consecutive": "unique_consecutive", "torch.bincount": "bincount",
              "torch.repeat_interleave": "repeat_interleave"}
_METHODS = {"nonzero", "argwhere", "unique", "unique_consecutive", "bincount", "repeat_interleave"}


class DynamicShapeOp(Rule):
    """
    ## What it does
    Finds operators whose output size depends on tensor values in the training step, the forward pass or
    compiled code: `nonzero`/`argwhere`, one-argument `torch.where(cond)`, `unique`/`unique_consecutive`,
    `bincount` without `minlength`, and `repeat_interleave` with tensor repeats and no `output_size`.
    (Boolean-mask indexing and `masked_select` are GPU001.) Operands known to be host data (a CPU tensor from
    `torch.tensor(...)`, `torch.from_numpy(...)` or `torch.arange(...)` without `device=`, never moved) need
    no device sync and are only reported in compiled code, as a graph break. Code that runs only when the run
    fails is not reported: a branch that always ends in `raise`, `sys.exit()`, `assert False` or
    `torch._assert(False, ...)` (locating the bad element for the error message).

    ## Why is this slow
    The host cannot size the output until the GPU has counted it, so each call synchronizes (an H100 shows one
    synchronizing call per `nonzero`). Under `torch.compile` it is a graph break ("Dynamic shape operator")
    and CUDA-graph capture fails.

    ## Example
    ```python
    idx = (scores > thr).nonzero()
    ```

    ## Use instead
    Keep shapes static: `torch.nonzero_static(x, size=K, fill_value=-1)` with a known bound, masked arithmetic
    (`torch.where(cond, a, b)`), a fixed-size `topk`, `bincount(x, minlength=n)`, or
    `repeat_interleave(..., output_size=n)`.

    ## Fix safety
    No automatic fix: a static size bound has to come from the model's semantics.
    """

    code = "GPU007"
    name = "dynamic-shape-op"
    message = "Data-dependent output shape: one host sync per call, a graph break under torch.compile"
    severity = Severity.INFO
    priority = "P2"
    triggers = ("nonzero", "argwhere", "where(", "unique", "bincount", "repeat_interleave")
    examples = [
        Valid(  # static-size variants
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    idx = torch.nonzero_static(x > 0, size=8, fill_value=-1)
                    counts = torch.bincount(idx.flatten() + 1, minlength=9)
                    return torch.where(x > 0, x, 0.0), counts
            """
        ),
        Valid(  # NumPy in a rollout loop
            """
            import numpy as np
            for it in range(10):
                dones = np.zeros(8)
                finished = np.nonzero(dones)[0]
                ids = np.unique(finished)
                loss = agent(ids).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # CPU tensors built from Python data: sized on the host, no device sync
            """
            import torch
            class Splitter(torch.nn.Module):
                def forward(self, crops):
                    widths = torch.tensor([c.shape[-1] for c in crops])
                    _, counts = torch.unique_consecutive(widths, return_counts=True)
                    order = torch.arange(len(crops))
                    evens = torch.nonzero(order % 2 == 0)
                    return counts, evens
            """
        ),
        Valid(  # only on the error path: finding the offending element for the message
            """
            import torch
            class Detector(torch.nn.Module):
                def forward(self, images, boxes):
                    bad = boxes[:, 2:] <= boxes[:, :2]
                    if bad.any():
                        first = torch.where(bad.any(dim=1))[0][0]
                        torch._assert(False, f"degenerate box at index {first}")
                    if (boxes < 0).any():
                        where = boxes.nonzero()
                        assert False, f"negative coordinates at {where}"
                    return self.head(images, boxes)
            """
        ),
        Invalid(
            """
            import torch
            class Router(torch.nn.Module):
                def forward(self, x, scores):
                    chosen = torch.where(scores > 0.5)[0]
                    return x[chosen]
            """
        ),
        Invalid(
            """
            import torch
            @torch.compile
            def count(labels):
                ids = torch.unique(labels)
                return ids.numel()
            """
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        op = self._dynamic_op(node)
        if op is None or not self.ctx.in_hot_region() or on_error_path(self.ctx):
            return
        compiled = self.ctx.is_compiled()
        if self._host_operand(node):
            if compiled:  # no device sync, but still a graph break
                self.report(node, f"`{op}` has a data-dependent output shape: a graph break under torch.compile",
                            severity=Severity.WARNING)
            return
        severity = Severity.WARNING if compiled else Severity.INFO
        self.report(node, f"`{op}` has a data-dependent output shape: one host sync per call, a graph break "
                          f"under torch.compile", severity=severity)

    def _host_operand(self, node: cst.Call) -> bool:
        """Is the operand known host data (a CPU tensor built from Python/NumPy data, a CPU factory without
        `device=`, a DataLoader batch not yet moved)? Sizing its output needs no device sync."""
        if isinstance(node.func, cst.Attribute) and self.ctx.qualname(node.func) is None:
            operand = node.func.value  # `t.unique()`
        else:
            arg = call_arg(node, "input", 0)
            if arg is None or arg.keyword is not None and arg.keyword.value != "input":
                return False
            operand = arg.value
        if self.ctx.evidence.is_cpu_source(operand):
            return True
        return Placement(self.ctx).of(operand) == HOST

    def _dynamic_op(self, node: cst.Call) -> str | None:
        qual = self.ctx.qualname(node.func) or ""
        if qual == "torch.where":
            positional = [a for a in node.args if a.keyword is None and not a.star]
            return "torch.where(cond)" if len(node.args) == 1 and len(positional) == 1 else None
        if qual in _FUNCTIONS:
            op = _FUNCTIONS[qual]
            return None if self._bounded(op, node, function=True) else f"torch.{op}"
        if qual.startswith(("numpy.", "np.")) or qual:
            return None  # np.nonzero, pandas, ... (a qualified name that is not torch's)
        name = method_name(node)
        if name not in _METHODS or not isinstance(node.func, cst.Attribute):
            return None
        receiver = tensor_verdict(self.ctx, node.func.value)
        if receiver is False:
            return None
        if receiver is None and not (self.ctx.hot_kind() in (HotKind.FORWARD, HotKind.COMPILED)
                                     and not numpy_in_file(self.ctx)):
            return None  # `.nonzero()` / `.unique()` exist on NumPy arrays and pandas objects too
        return None if self._bounded(name, node, function=False) else f".{name}()"

    def _bounded(self, op: str, node: cst.Call, *, function: bool) -> bool:
        """Forms with a static output size."""
        if op == "bincount":
            return call_arg(node, "minlength", 2 if function else 1) is not None
        if op == "repeat_interleave":
            if call_arg(node, "output_size") is not None:
                return True
            repeats = call_arg(node, "repeats", 1 if function else 0)
            if repeats is None:
                return not function or len(node.args) != 1  # torch.repeat_interleave(repeats_tensor)
            if isinstance(repeats.value, (cst.Integer, cst.UnaryOperation)):
                return True
            return tensor_verdict(self.ctx, repeats.value) is not True
        return False
