from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import dotted_name
from gpulint.rules.empty_cache_in_loop import gated

_SYNCHRONIZE = {"torch.cuda.synchronize", "torch.accelerator.synchronize"}
_TIMING = re.compile(r"\b(time|perf_counter|perf_counter_ns|monotonic|monotonic_ns|process_time|time_ns|"
                     r"default_timer|timeit|elapsed_time|Event|record|tic|toc|timer|Timer|elapsed|stopwatch)\b")
_TOOL_PATH = re.compile(r"(^|[\\/_])(bench\w*|benchmarks?|profil\w*)(\.py$|[\\/_])", re.I)
_WINDOW = 3  # statements either side that count as "adjacent"


class SynchronizeInLoop(Rule):
    """
    ## What it does
    Finds `torch.cuda.synchronize()` on every training step (in a training loop, a step function or a
    `forward`) that is not part of timing code (`time.time()`, `time.perf_counter()`, `torch.cuda.Event`
    within a few statements).

    ## Why is this slow
    `synchronize()` blocks the host until every queued kernel has finished. The CPU then starts queueing the
    next step's kernels only after the GPU went idle, so the launch latency of each step is no longer hidden
    behind the previous step's work. The tuning guide: "Avoid unnecessary CPU-GPU synchronization".

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
    ```

    ## Use instead
    Remove it; synchronize only where the host reads results or measures time, e.g. every N steps for logging.

    ## Fix safety
    No automatic fix: a synchronize can be load-bearing (host code reading pinned buffers written by
    non-blocking copies, multi-stream code). Calls next to timing code, behind a condition, or in benchmark and
    profiling scripts are not reported.
    """

    code = "GPU073"
    name = "synchronize-in-loop"
    message = "`torch.cuda.synchronize()` on every training step stalls the host until the GPU is idle"
    severity = Severity.INFO
    safety = Safety.SUGGEST
    priority = "P3"
    default_enabled = False
    triggers = ("synchronize",)
    examples = [
        Valid(
            """
            import time
            import torch
            for x, y in loader:
                t0 = time.perf_counter()
                model(x).sum().backward()
                optimizer.step()
                torch.cuda.synchronize()
                step_time = time.perf_counter() - t0
            """
        ),
        Valid(  # every N steps for logging
            """
            import torch
            for i, (x, y) in enumerate(loader):
                model(x).sum().backward()
                optimizer.step()
                if i % 100 == 0:
                    torch.cuda.synchronize()
                    print(torch.cuda.max_memory_allocated())
            """
        ),
        Invalid(
            """
            import torch
            for x, y in loader:
                model(x).sum().backward()
                optimizer.step()
                torch.cuda.synchronize()
            """
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.analysis.call_qualname(node)
        if qual not in _SYNCHRONIZE and not (
                isinstance(node.func, cst.Attribute) and node.func.attr.value == "synchronize"
                and (dotted_name(node.func.value) or "").endswith(("current_stream", "default_stream"))):
            return
        if _TOOL_PATH.search(self.ctx.path) or not self.ctx.in_hot_region() or gated(self.ctx.ancestors):
            return
        if self._near_timing():
            return
        self.report(node)

    def _near_timing(self) -> bool:
        """Timing calls within a few statements of the synchronize, in its block or the enclosing blocks of the
        same loop iteration."""
        ancestors = self.ctx.ancestors
        for index in range(len(ancestors) - 1, 0, -1):
            node, block = ancestors[index], ancestors[index - 1]
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.For, cst.While)):
                break  # do not look outside the loop body that runs every step
            if not isinstance(block, (cst.IndentedBlock, cst.Module)) or not isinstance(node, cst.BaseStatement):
                continue
            body = list(block.body)
            position = next((i for i, s in enumerate(body) if s is node), None)
            if position is None:
                continue
            window = body[max(0, position - _WINDOW):position + _WINDOW + 1]
            if any(_TIMING.search(self.ctx.code(s)) for s in window):
                return True
        return False
