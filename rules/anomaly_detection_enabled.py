from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg, dotted_name, walk
from gpulint.rule import is_test_path
from gpulint.semantic.loaders import LoaderFlow

_SET_ANOMALY = {"torch.autograd.set_detect_anomaly", "torch.autograd.anomaly_mode.set_detect_anomaly"}
_DETECT_ANOMALY = {"torch.autograd.detect_anomaly", "torch.autograd.anomaly_mode.detect_anomaly"}
_PROFILERS = {"torch.profiler.profile", "torch.autograd.profiler.profile", "torch.autograd.profiler.emit_nvtx",
              "torch.autograd.profiler_legacy.profile", "torch.cuda.profiler.profile", "torch.profiler.profiler.profile"}
_GRADCHECK = {"torch.autograd.gradcheck", "torch.autograd.gradgradcheck", "torch.autograd.gradcheck.gradcheck",
              "torch.autograd.gradcheck.gradgradcheck"}
_TOOL_PATH = re.compile(r"(^|[\\/_])(bench\w*|benchmarks?|profil\w*)(\.py$|[\\/_])", re.I)
_TRAIN_CALL = re.compile(r"^_?(train|fit|run_epoch|train_epoch|train_one_epoch)")


class AnomalyDetectionEnabled(Rule):
    """
    ## What it does
    Finds autograd debugging switched on in training code: `torch.autograd.set_detect_anomaly(True)`,
    `with torch.autograd.detect_anomaly():`, a profiler (`torch.profiler.profile`,
    `torch.autograd.profiler.profile`, `emit_nvtx`) wrapping a whole training loop without a schedule, and
    `torch.autograd.gradcheck` inside the training step. Debug-flag-gated uses, tests, and benchmark or
    profiling scripts are left alone.

    ## Why is this slow
    Anomaly mode records a Python traceback for every autograd node in the forward pass and checks every
    backward output for NaNs (a device-to-host sync per op); torch's own warning says it "will increase the
    runtime and should only be enabled for debugging". `set_detect_anomaly(True)` does not even warn. An
    unscheduled profiler records every op of every step. The tuning guide's advice: "Disable debugging APIs".

    ## Example
    ```python
    torch.autograd.set_detect_anomaly(True)
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    if args.detect_anomaly:  # only while debugging
        torch.autograd.set_detect_anomaly(True)
    ```

    ## Fix safety
    Unsafe: anomaly mode also turns a NaN-producing backward into an error that names the forward op, so
    removing it changes how a broken run fails (it keeps running with NaNs instead). The fix deletes the
    `set_detect_anomaly(True)` statement or unwraps the `detect_anomaly()` block. Profilers and gradcheck are
    reported without a fix (their results are usually used afterwards).
    """

    code = "GPU071"
    name = "anomaly-detection-enabled"
    message = "Autograd anomaly detection is enabled in training code; it slows every forward and backward"
    fix_title = "Remove anomaly detection"
    severity = Severity.WARNING
    safety = Safety.UNSAFE
    priority = "P2"
    triggers = ("anomaly", "profile", "emit_nvtx", "gradcheck")
    examples = [
        Valid(
            """
            import torch
            if args.debug:
                torch.autograd.set_detect_anomaly(True)
            """
        ),
        Valid(  # a scheduled profiler records a few steps only
            """
            import torch
            with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3)) as prof:
                for x, y in loader:
                    model(x).sum().backward()
                    optimizer.step()
                    prof.step()
            """
        ),
        Invalid(
            """
            import torch

            torch.autograd.set_detect_anomaly(True)
            for x, y in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            fixed="""
            import torch

            for x, y in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch
            def train(model, loader, optimizer):
                for x, y in loader:
                    with torch.autograd.detect_anomaly():
                        loss = model(x).sum()
                        loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            def train(model, loader, optimizer):
                for x, y in loader:
                    loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
            """,
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ", "WARN"),
        setup="x = torch.randn(16, 8, requires_grad=True)\nw = torch.randn(8, 4, requires_grad=True)",
        before="with torch.autograd.detect_anomaly():\n    y = (x @ w).tanh()",
        after="y = (x @ w).tanh()",
        compare=("y",),
    )

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.analysis.call_qualname(node)
        if qual is None or is_test_path(self.ctx.path):
            return
        if qual in _SET_ANOMALY:
            mode = call_arg(node, "mode", 0)
            if mode is None or not (isinstance(mode.value, cst.Name) and mode.value.value == "True"):
                return
            if self._gated():
                return
            parent = self.ctx.parent()
            if isinstance(parent, cst.WithItem):
                self._with_item(node, parent)
                return
            self._statement(node)
        elif qual in _DETECT_ANOMALY:
            if self._gated():
                return
            parent = self.ctx.parent()
            if isinstance(parent, cst.WithItem):
                self._with_item(node, parent)
            else:
                self.report(node)
        elif qual in _PROFILERS:
            self._profiler(node)
        elif qual in _GRADCHECK:
            if self.ctx.in_hot_region() and not self._gated():
                self.report(node, "`gradcheck` runs inside the training step; it evaluates the function many times "
                                  "in float64 and belongs in tests", note="remove it or move it to a test")

    # -- anomaly mode ------------------------------------------------------------------------------

    def _gated(self) -> bool:
        """Inside an `if` (other than the `__main__` guard) or an `except`: behind a debug flag or an error."""
        for node in reversed(self.ctx.ancestors[:-1]):
            if isinstance(node, cst.If) and node is not self.ctx.analysis.main_guard:
                return True
            if isinstance(node, (cst.IfExp, cst.ExceptHandler)):
                return True
        return False

    def _statement(self, call: cst.Call) -> None:
        """`torch.autograd.set_detect_anomaly(True)` as a statement: delete it."""
        expression = self.ctx.parent()
        line = self.ctx.parent(2)
        if not (isinstance(expression, cst.Expr) and isinstance(line, cst.SimpleStatementLine)
                and len(line.body) == 1):
            self.report(call)
            return
        removal = _removal(self.ctx, line, None)
        if removal is None:
            self.report(call)
            return
        self.report(call, replacements=[removal])

    def _with_item(self, call: cst.Call, item: cst.WithItem) -> None:
        statement = self.ctx.parent(2)
        if not isinstance(statement, cst.With) or item.asname is not None:
            self.report(call)
            return
        if len(statement.items) > 1:
            items = [i for i in statement.items if i is not item]
            items[-1] = items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            self.report(call, replacements=[(statement, statement.with_changes(items=items))])
            return
        if not isinstance(statement.body, cst.IndentedBlock):
            self.report(call)
            return
        removal = _removal(self.ctx, statement, list(statement.body.body))
        if removal is None:
            self.report(call)
            return
        self.report(call, replacements=[removal])

    # -- profilers ---------------------------------------------------------------------------------

    def _profiler(self, call: cst.Call) -> None:
        item = self.ctx.parent()
        statement = self.ctx.parent(2)
        if not isinstance(item, cst.WithItem) or not isinstance(statement, cst.With):
            return
        if _TOOL_PATH.search(self.ctx.path) or self._gated():
            return
        if call_arg(call, "schedule") is not None:
            return
        enabled = call_arg(call, "enabled", 0 if (self.ctx.analysis.call_qualname(call) or "").endswith(
            ("emit_nvtx", "autograd.profiler.profile", "profiler_legacy.profile")) else None)
        if enabled is not None and not (isinstance(enabled.value, cst.Name) and enabled.value.value == "True"):
            return
        flow = LoaderFlow.of(self.ctx.analysis)
        wraps_training = False
        for node in walk(statement.body):
            if isinstance(node, (cst.For, cst.While)) and flow.is_training_loop(node):
                wraps_training = True
                break
            if isinstance(node, cst.Call):
                name = dotted_name(node.func) or ""
                if _TRAIN_CALL.match(name.rsplit(".", 1)[-1]):
                    wraps_training = True
                    break
        if wraps_training:
            self.report(call, "A profiler without a schedule wraps the whole training loop; it records every op of "
                              "every step", note="profile a few steps with `schedule=torch.profiler.schedule(...)` "
                                                 "or remove it")


def _removal(ctx, statement: cst.BaseStatement,
             replacement: list[cst.BaseStatement] | None) -> tuple[cst.CSTNode, cst.CSTNode] | None:
    """Replace `statement` by `replacement` statements (None: delete it) by rebuilding the statement that owns
    its block (or the module): (owner, new owner). Comments above the statement stay, on the next statement."""
    ancestors = ctx.ancestors
    index = next((i for i in range(len(ancestors) - 1, -1, -1) if ancestors[i] is statement), None)
    if index is None or index < 1:
        return None
    block = ancestors[index - 1]
    if not isinstance(block, (cst.Module, cst.IndentedBlock)):
        return None
    body = list(block.body)
    position = next((i for i, s in enumerate(body) if s is statement), None)
    if position is None:
        return None
    leading = list(getattr(statement, "leading_lines", ()))
    new_statements = list(replacement or [])
    new_block = block
    if new_statements:
        first = new_statements[0]
        new_statements[0] = first.with_changes(leading_lines=leading + list(getattr(first, "leading_lines", ())))
    elif position + 1 < len(body):
        following = body[position + 1]
        body[position + 1] = following.with_changes(
            leading_lines=leading + list(getattr(following, "leading_lines", ())))
    elif isinstance(block, cst.Module):
        new_block = block.with_changes(footer=leading + list(block.footer))
    body[position:position + 1] = new_statements
    if isinstance(block, cst.Module):
        return block, new_block.with_changes(body=body)
    new_block = new_block.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])])
    owner = next((n for n in reversed(ancestors[:index - 1]) if isinstance(n, cst.BaseCompoundStatement)), None)
    if owner is None:
        return None
    if position == len(block.body) - 1 and replacement is None and _has_trailing_comment(statement):
        # the owner's last line (and its comment) would change, which a statement replacement must keep:
        # rebuild the module instead
        module = ancestors[0]
        if not isinstance(module, cst.Module):
            return None
        return module, module.deep_replace(block, new_block)
    return owner, owner.deep_replace(block, new_block)


def _has_trailing_comment(statement: cst.CSTNode) -> bool:
    while isinstance(statement, cst.BaseCompoundStatement):
        body = statement.body
        if not isinstance(body, cst.IndentedBlock) or not body.body:
            return True  # one-line compound statement: be careful
        statement = body.body[-1]
    return isinstance(statement, cst.SimpleStatementLine) and statement.trailing_whitespace.comment is not None
