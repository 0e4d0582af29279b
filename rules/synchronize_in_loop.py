from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import child_nodes, dotted_name, method_name, walk
from gpulint.semantic.frequency import gated
from gpulint.semantic.vocab import SYNCHRONIZE_CALLS, TIMER_READS

_TIMING = re.compile(r"\b(time|perf_counter|perf_counter_ns|monotonic|monotonic_ns|process_time|time_ns|"
                     r"default_timer|timeit|elapsed_time|Event|record|tic|toc|timer|Timer|elapsed|stopwatch)\b")
_TOOL_PATH = re.compile(r"(^|[\\/_])(bench\w*|benchmarks?|profil\w*)(\.py$|[\\/_])", re.I)
_WINDOW = 3  # statements either side that count as "adjacent"
_CONDITIONAL = (cst.If, cst.IfExp, cst.For, cst.While, cst.ExceptHandler, cst.BooleanOperation, cst.CompFor)


class SynchronizeInLoop(Rule):
    """
    ## What it does
    Finds `torch.cuda.synchronize()` on every training step (in a training loop, a step function or a
    `forward`) that is not part of timing code: timing calls within a few statements, or a clock read
    (`time.time()`, `time.perf_counter()`, `time.monotonic()`, `event.elapsed_time(...)`) anywhere later in
    the same loop body with no other synchronize in between, whose value computes an elapsed time
    (`time.time() - start`, or `t1 = time.time()` with `t1 - t0` in the loop). A bare timestamp read later
    in the loop (`log["wall"] = time.time()`) does not make the synchronize timing code.

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
    priority = "P2"
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
        Valid(  # the clock read a few statements later measures the step
            """
            import time
            import torch
            end = time.time()
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
                losses.append(loss.detach())
                stats.update(step=len(losses))
                meter.count += 1
                epoch_log.mark()
                step_times.append(time.time() - end)
                end = time.time()
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
        Invalid(  # a timestamp read later in the loop measures no elapsed time
            """
            import time
            import torch
            for step, (x, y) in enumerate(loader):
                model(x).sum().backward()
                optimizer.step()
                torch.cuda.synchronize()
                history.append(step)
                stats.update(step=step)
                meter.count += 1
                epoch_log.mark()
                records.append({"step": step, "wall": time.time()})
            """
        ),
        Invalid(  # the clock is read only every N steps: the other steps' synchronize serves nothing
            """
            import time
            import torch
            for i, (x, y) in enumerate(loader):
                model(x).sum().backward()
                optimizer.step()
                torch.cuda.synchronize()
                losses.append(1)
                stats.update(step=i)
                meter.count += 1
                epoch_log.mark()
                if i % 100 == 0:
                    print(time.perf_counter() - start)
            """
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.analysis.call_qualname(node)
        if qual not in SYNCHRONIZE_CALLS and not (
                isinstance(node.func, cst.Attribute) and node.func.attr.value == "synchronize"
                and (dotted_name(node.func.value) or "").endswith(("current_stream", "default_stream"))):
            return
        if _TOOL_PATH.search(self.ctx.path) or not self.ctx.in_hot_region() or gated(self.ctx.ancestors):
            return
        if self._near_timing() or self._timer_read_follows(node):
            return
        self.report(node)

    def _is_synchronize(self, node: cst.Call) -> bool:
        return self.ctx.analysis.call_qualname(node) in SYNCHRONIZE_CALLS or (
            isinstance(node.func, cst.Attribute) and node.func.attr.value == "synchronize"
            and (dotted_name(node.func.value) or "").endswith(("current_stream", "default_stream")))

    def _is_timer_read(self, node: cst.Call) -> bool:
        return self.ctx.analysis.call_qualname(node) in TIMER_READS or method_name(node) == "elapsed_time"

    def _timer_read_follows(self, sync: cst.Call) -> bool:
        """A clock read (`time.time()`, `time.perf_counter()`, `event.elapsed_time(...)`) later in the same loop
        body (or step function), with no other synchronize in between, that runs whenever the synchronize does:
        the synchronize makes that measurement cover the GPU work, however many statements apart they are."""
        body = None
        for node in reversed(self.ctx.ancestors[:-1]):
            if isinstance(node, (cst.For, cst.While, cst.FunctionDef)):
                body = node.body
                break
            if isinstance(node, (cst.ClassDef, cst.Lambda)):
                return False
        if body is None:
            return False
        seen = False
        # depth-first in source order, remembering how many conditional constructs enclose each node
        pending: list[tuple[cst.CSTNode, int]] = [(body, 0)]
        while pending:
            node, conditional = pending.pop()
            if node is sync:
                seen = True
                continue
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                continue
            if seen and isinstance(node, cst.Call):
                if self._is_synchronize(node):
                    return False
                if self._is_timer_read(node) and self._measures_elapsed(node, body):
                    return conditional == 0
            depth = conditional + (1 if isinstance(node, _CONDITIONAL) else 0)
            pending.extend((child, depth) for child in reversed(child_nodes(node)))
        return False

    def _measures_elapsed(self, read: cst.Call, body: cst.CSTNode) -> bool:
        """The clock value is used to compute an elapsed time: `time.time() - start` (or `end - t`), or it is
        bound to a name (`t1 = time.perf_counter()`) that a subtraction in the loop body reads;
        `event.elapsed_time(...)` is one. A bare timestamp (`log["wall"] = time.time()`) times nothing."""
        if method_name(read) == "elapsed_time":
            return True
        names: set[str] = set()
        for node in walk(body, into_functions=False):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract):
                if any(child is read for child in walk(node, into_functions=False)):
                    return True
            if isinstance(node, cst.Assign) and node.value is read:
                names.update(t.target.value for t in node.targets if isinstance(t.target, cst.Name))
        if not names:
            return False
        return any(isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract)
                   and any(isinstance(operand, cst.Name) and operand.value in names
                           for operand in (node.left, node.right))
                   for node in walk(body, into_functions=False))

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
