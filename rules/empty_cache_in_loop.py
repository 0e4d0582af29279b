from __future__ import annotations

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.semantic.frequency import gated

_EMPTY_CACHE = {"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"}


def in_loader_loop(ctx) -> bool:
    """Inside (the same function) a loop over a DataLoader-like iterable: once per batch."""
    evidence = ctx.evidence
    for node in reversed(ctx.ancestors[:-1]):
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return False
        if isinstance(node, cst.For) and evidence.is_loader(node.iter):
            return True
    return False


class EmptyCacheInLoop(Rule):
    """
    ## What it does
    Finds `torch.cuda.empty_cache()` called on every iteration of a training loop (or a per-batch loop, or a
    `forward`), unconditionally.

    ## Why is this slow
    `empty_cache()` hands every cached, currently unused block back to the driver. The next iteration needs
    the same blocks again and has to get them with fresh `cudaMalloc` calls, which are slow and synchronize
    the device. It does not give the training process more memory: the CUDA notes say the memory occupied
    by tensors "will not be freed so it can not increase the amount of GPU memory available for PyTorch".

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()
    ```

    ## Use instead
    Remove the call. If another process shares the GPU, release the cache at most once per epoch, or cap this
    process with `torch.cuda.set_per_process_memory_fraction`.

    ## Fix safety
    No automatic fix: other processes on the same GPU may rely on the memory being returned. Calls behind a
    condition (a flag, every N steps, after an out-of-memory error) are not reported.
    """

    code = "GPU072"
    name = "empty-cache-in-loop"
    message = "`torch.cuda.empty_cache()` on every step forces fresh cudaMalloc calls next step; remove it"
    severity = Severity.INFO
    safety = Safety.SUGGEST
    priority = "P3"
    default_enabled = False
    triggers = ("empty_cache",)
    examples = [
        Valid(
            """
            import torch
            for epoch in range(epochs):
                for x, y in loader:
                    model(x).sum().backward()
                    optimizer.step()
                torch.cuda.empty_cache()  # once per epoch
            """
        ),
        Valid(  # recovery after an out-of-memory error
            """
            import torch
            for x, y in loader:
                try:
                    model(x).sum().backward()
                    optimizer.step()
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
            """
        ),
        Invalid(
            """
            import torch
            for x, y in loader:
                model(x).sum().backward()
                optimizer.step()
                torch.cuda.empty_cache()
            """
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.analysis.call_qualname(node) not in _EMPTY_CACHE:
            return
        if not (self.ctx.in_hot_region() or in_loader_loop(self.ctx)):
            return
        if gated(self.ctx.ancestors):
            return
        self.report(node)
