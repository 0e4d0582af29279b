from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, Rule, Severity, Valid
from gpulint.analysis import BindingKind, HotKind, call_arg, dotted_name, method_name, walk
from gpulint.rule import RuleContext
from gpulint.semantic.placement import (
    HOST,
    Placement,
    after_init_once_guard,
    amortised,
    calls_of,
    collective_only,
    last_name,
    on_error_path,
)
from gpulint.semantic.vocab import ENV_METHODS, SYNCHRONIZE_CALLS


def _unconditional(block: cst.BaseSuite) -> list[cst.SimpleStatementLine | cst.SimpleStatementSuite]:
    """The simple statements of a block that run every time it runs (through `with` and `try` bodies, not into
    branches or loops)."""
    if isinstance(block, cst.SimpleStatementSuite):
        return [block]
    found: list[cst.SimpleStatementLine | cst.SimpleStatementSuite] = []
    for statement in block.body:
        if isinstance(statement, cst.SimpleStatementLine):
            found.append(statement)
        elif isinstance(statement, (cst.With, cst.Try)):
            found.extend(_unconditional(statement.body))
    return found


# -- tensors that exist only to agree across ranks ----------------------------------------------------------------


_HOST_BUILT = {"tensor", "as_tensor", "asarray", "full", "zeros", "ones", "empty"}
_HOST_FACTORIES = {"tensor", "as_tensor", "asarray", "from_numpy", "Tensor", "FloatTensor", "DoubleTensor",
                   "LongTensor", "IntTensor", "BoolTensor"}


def built_from_host_on_device(ctx: RuleContext, value: cst.BaseExpression | None) -> bool:
    """`torch.tensor(x, device=d)`, `torch.full((1,), x, device=d)`, `torch.tensor(x).to(d)` / `.cuda()`."""
    if not isinstance(value, cst.Call):
        return False
    qual = ctx.qualname(value.func) or ""
    if qual.startswith("torch.") and qual.count(".") == 1:
        return qual[len("torch."):] in _HOST_BUILT and call_arg(value, "device") is not None
    if method_name(value) in ("to", "cuda") and isinstance(value.func, cst.Attribute):
        inner = value.func.value
        while isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) \
                and method_name(inner) in ("float", "double", "long", "int", "bool", "view", "reshape"):
            inner = inner.func.value
        if isinstance(inner, cst.Call):
            inner_qual = ctx.qualname(inner.func) or ""
            return inner_qual.startswith("torch.") and inner_qual.count(".") == 1 \
                and inner_qual[len("torch."):] in _HOST_FACTORIES
    return False


def collective_read_back(ctx: RuleContext, value: cst.BaseExpression) -> bool:
    """Reading back (`.item()`, `bool(t)`) a tensor built from host data whose only other uses are
    torch.distributed collectives: a cross-rank agreement whose result the host needs."""
    while isinstance(value, cst.Subscript):
        value = value.value
    if not isinstance(value, cst.Name):
        return False
    bindings = ctx.analysis.bindings_of(value.value, ctx.ancestors)
    if not bindings or any(b.kind is not BindingKind.ASSIGN or not built_from_host_on_device(ctx, b.value)
                           for b in bindings):
        return False
    return collective_only(ctx, value.value)


# ---------------------------------------------------------------------------------------------

_LOG_RECEIVERS = re.compile(r"^(logging|logger|log|_logger|LOGGER|_LOGGER|LOG)$")
_ENV_NAME = re.compile(r"env", re.I)
_ACTING_METHODS = frozenset({"step", "step_async", *ENV_METHODS})


def _acts_in_environment(call: cst.Call) -> bool:
    """`envs.step(actions)`, `self.venv.step_async(actions)`, `game.play(move)`."""
    return method_name(call) in _ACTING_METHODS and isinstance(call.func, cst.Attribute) \
        and bool(_ENV_NAME.search(last_name(call.func.value) or ""))
_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log"}


class HostSyncInHotLoop(Rule):
    """
    ## What it does
    Finds operations that copy a GPU tensor's value to the host inside the training step or a model's
    `forward`: `.item()`, `.tolist()`, `.cpu()`, `.to("cpu")`, `float(t)` / `int(t)` / `bool(t)`, and
    printing or formatting a tensor (`print(loss)`, `f"{loss}"`, `"%f" % loss`, `logger.info(..., loss)`,
    `writer.add_scalar(tag, loss)`). It fires only on values with tensor evidence in a program that uses
    CUDA; values the code keeps on the CPU (NumPy arrays, Python numbers, DataLoader batches not yet moved,
    results of an earlier `.item()`) are not syncs and are ignored. Code in `if step % N == 0:` blocks and
    evaluation passes over a loader outside the training step is not reported; an evaluation loop nested in
    the training loop, or a `@torch.no_grad()` function called per step, gets an informational finding.
    In a rollout or tree search (per environment step or simulation) the finding says how to read back less
    often: one copy per evaluation, many positions per call, or a small network on the CPU. Code that runs
    only when the run fails is ignored: a `raise` statement, or an `if`/`else` branch that always ends in
    `raise`, `sys.exit()`, `exit()`, `os._exit()`, `assert False` or `torch._assert(False, ...)` (the branch's test
    still runs every step and is checked). So is reading back a tensor built from host data whose only other
    uses are `torch.distributed` collectives (`t = torch.tensor(flag, device=d)`, `dist.all_reduce(t)`,
    `bool(t.item())`): agreeing across ranks needs the value on the device for NCCL and back on the host for
    the decision. Tensors made on the CPU by a factory without `device=` (`torch.rand(1)`,
    `torch.empty(1).uniform_(a, b)`) are not GPU values either. A loop whose body calls
    `torch.cuda.synchronize()` on every iteration (timing code, directly or through a name bound to it) already
    waits for the GPU each step, so its reads cost nothing more and are not reported.

    ## Why is this slow
    The host must wait for every queued kernel before it can read a GPU value, so each such call drains the
    GPU's work queue and stops the CPU from running ahead. On an H100, a small model's step with
    `loss.item()` every step took 1080 µs vs 962 µs when accumulating on the device (x1.12); the cost grows
    when the CPU is the bottleneck. Under `torch.compile` each `.item()`/`.tolist()`/`print` also breaks the
    graph.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        total += loss.item()
    ```

    ## Use instead
    ```python
    total = torch.zeros((), device=device)
    for x, y in loader:
        loss = criterion(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        total += loss.detach()
    print(total.item())  # once per epoch
    ```
    Read values every N steps, use `torch._assert_async` for checks and `torch.cuda.Event` for timing.

    ## Fix safety
    No automatic fix: where to accumulate and when to read back is a decision about the program's output.
    """

    code = "GPU005"
    name = "host-sync-in-hot-loop"
    message = "Host sync in the training step: this reads a GPU value on the host and waits for the GPU"
    severity = Severity.WARNING
    priority = "P1"
    triggers = (".item(", ".tolist(", ".cpu(", ".to(", "print(", "float(", "int(", "bool(", "f\"", "f'", "%",
                ".format(", "log", "add_scalar", "numpy(", "math.")
    examples = [
        Valid(  # Python numbers and NumPy values are not syncs
            """
            import torch
            device = torch.device("cuda")
            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x.to(device)), y.to(device))
                loss.backward()
                optimizer.step()
                lr = float(scheduler.get_last_lr()[0])
                n = int(x.shape[0])
                print(step, lr, n)
            """
        ),
        Valid(  # a DataLoader batch that is still on the CPU
            """
            import torch
            for x, y in loader:
                labels = y.tolist()
                out = model(x.cuda())
                out.sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # no CUDA anywhere in the program
            """
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss.item()
            """
        ),
        Valid(  # only on the error path: in the raised exception, or in a branch that ends the run
            """
            import sys
            import torch
            import torch.nn.functional as F
            for x, y in loader:
                loss = F.cross_entropy(model(x.cuda()), y.cuda())
                if not torch.isfinite(loss).all():
                    raise RuntimeError(f"diverged: {loss.item()}")
                if bad_batch(x):
                    print("stopping at loss", loss.item())
                    sys.exit(1)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a host value agreed on across ranks: NCCL needs a device tensor, the host needs the result
            """
            import torch
            import torch.distributed as dist
            device = torch.device("cuda")
            for step in range(num_steps):
                loss = model(next(batches).to(device)).mean()
                loss.backward()
                optimizer.step()
                stop = torch.tensor(time_is_up(), dtype=torch.int32, device=device)
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                if bool(stop.item()):
                    break
            """
        ),
        Valid(  # already amortised, as the message advises; a snapshot moves a module, not a value
            """
            import copy
            import torch
            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda()).mean()
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    print(f"step {step} loss {loss.item():.4f}")
                snapshot = copy.deepcopy(ema).eval().requires_grad_(False)
                snapshots.append(snapshot.cpu())
            """
        ),
        Valid(  # the step already waits for the GPU on every iteration (timing): the read waits for nothing more
            """
            import time
            import torch
            synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
            for x, y in loader:
                t0 = time.time()
                loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
                synchronize()
                meter.update(loss.item(), time.time() - t0)
            """
        ),
        Valid(  # PackedSequence.batch_sizes always lives on the CPU
            """
            import torch
            class PackedRNN(torch.nn.Module):
                def forward(self, packed):
                    data, batch_sizes, _, _ = packed
                    return self.run(data, batch_sizes)
                def run(self, x, batch_sizes):
                    batch_sizes = batch_sizes.flip(0)
                    for t in range(len(batch_sizes)):
                        n = batch_sizes[t].item()
                        x = self.cell(x[:n])
                    return x
            model = PackedRNN().cuda()
            """
        ),
        Valid(  # an evaluation result copied out to be saved; CPU tensors in the legacy Variable wrapper
            """
            import torch
            from torch.autograd import Variable
            model = get_model().cuda().eval()
            with torch.no_grad():
                for i, batch in enumerate(test_loader):
                    restored = model(batch.cuda()).clamp(0, 1).cpu().numpy()
                    save_image(f"{i}.png", restored)
            x = Variable(torch.randn(64, 1000))
            w = Variable(torch.randn(1000, 10), requires_grad=True)
            for t in range(500):
                loss = x.mm(w).pow(2).sum()
                print("loss", loss.data)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a test's assertion is its purpose
            """
            import torch
            def test_loss_goes_down():
                for x in loader:
                    loss = model(x.cuda()).mean()
                    loss.backward()
                    optimizer.step()
                    assert loss.item() < 10
            """
        ),
        Valid(  # random draws made on the CPU (no `device=`): reading them is no GPU sync
            """
            import torch
            device = torch.device("cuda")
            for x, y in loader:
                scale = torch.empty(1).uniform_(0.8, 1.2).item()
                if torch.rand(1).item() < 0.5:
                    x = x.flip(-1)
                loss = criterion(model(x.to(device) * scale), y.to(device))
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(  # the same draw made on the device is read back every step
            """
            import torch
            device = torch.device("cuda")
            for x, y in loader:
                scale = torch.empty(1, device=device).uniform_(0.8, 1.2).item()
                loss = criterion(model(x.to(device) * scale), y.to(device))
                loss.backward()
                optimizer.step()
            """,
            count=1,
        ),
        Invalid(  # the check itself reads the loss every step; the message in the exiting branch does not count
            """
            import math
            import sys
            import torch
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                if not math.isfinite(loss.item()):
                    print("loss is", loss.item())
                    sys.exit(1)
                loss.backward()
                optimizer.step()
            """,
            count=1,
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss.item()
            """,
            count=1,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    scale = x.abs().max().item()
                    return x / scale
            net = Net().to("cuda")
            """,
        ),
    ]

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self._enabled = ctx.targets_cuda()
        self._reported_statements: set[int] = set()
        self._synchronizing_loops: dict[int, bool] = {}

    # -- where are we ------------------------------------------------------------------------

    def _region_severity(self) -> Severity | None:
        kind = self.ctx.hot_kind()
        if (kind is not None or self._innermost_loop() is not None) and on_error_path(self.ctx):
            return None  # reporting a failure: runs once, when the run stops
        if amortised(self.ctx) or self.ctx.in_test_code() or after_init_once_guard(self.ctx):
            return None  # already read every N steps, as the message advises; a test's assertion is its purpose
        loop = self._innermost_loop()
        if loop is not None and self._synchronizes_every_iteration(loop):
            return None  # the host already waits for the GPU each iteration: this read adds no wait
        if kind is not None:
            if self.ctx.in_no_grad_function() and kind is not HotKind.ROLLOUT:
                return Severity.INFO  # an evaluation function; inference per move or per simulation is the hot path
            if loop is not None and id(loop) not in self.ctx.analysis.hot and (
                    isinstance(loop, cst.For) and self.ctx.evidence.is_loader(loop.iter)
                    or self.ctx.inside_with("torch.no_grad", "torch.inference_mode")):
                return Severity.INFO  # an evaluation loop nested in the training loop
            return Severity.WARNING
        return None  # an evaluation pass over a loader, outside training: a sync per batch there is not worth a finding

    def _innermost_loop(self) -> cst.CSTNode | None:
        """The innermost loop around the current node, if it lies inside the current hot region/function."""
        for node in reversed(self.ctx.ancestors[:-1]):
            if isinstance(node, (cst.For, cst.While)):
                return node
            if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)) or id(node) in self.ctx.analysis.hot:
                return None
        return None

    def _synchronizes_every_iteration(self, loop: cst.For | cst.While) -> bool:
        key = id(loop)
        if key not in self._synchronizing_loops:
            self._synchronizing_loops[key] = any(self._synchronizes(s) for s in _unconditional(loop.body))
        return self._synchronizing_loops[key]

    def _synchronizes(self, statement: cst.SimpleStatementLine | cst.SimpleStatementSuite) -> bool:
        """`torch.cuda.synchronize()`, or a call of a name bound to it (`sync = torch.cuda.synchronize if ...`)."""
        for small in statement.body:
            if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
                continue
            func = small.value.func
            if self.ctx.qualname(func) in SYNCHRONIZE_CALLS:
                return True
            if isinstance(func, cst.Name) and any(
                    binding.value is not None and any(self.ctx.qualname(n) in SYNCHRONIZE_CALLS for n in walk(binding.value)
                                                      if isinstance(n, cst.Attribute))
                    for binding in self.ctx.analysis.bindings_of(func.value, self.ctx.ancestors)):
                return True
        return False

    def _feeds_environment(self) -> bool:
        """Is the synced value handed to a CPU environment (`envs.step(actions)`)? That copy is inherent to
        acting in a host-side simulator."""
        statement = None
        for node in reversed(self.ctx.ancestors):
            if isinstance(node, cst.Call) and _acts_in_environment(node):
                return True
            if isinstance(node, cst.SimpleStatementLine):
                statement = node
                break
        if statement is None or not isinstance(statement.body[0], cst.Assign):
            return False
        names = {n.value for t in statement.body[0].targets for n in walk(t.target) if isinstance(n, cst.Name)}
        scope = self._innermost_loop() or next(
            (n for n in reversed(self.ctx.ancestors) if isinstance(n, cst.FunctionDef)), self.ctx.module)
        for call in calls_of(scope):
            if _acts_in_environment(call):
                if any(isinstance(n, cst.Name) and n.value in names for a in call.args for n in walk(a.value)):
                    return True
        return False

    def _emit(self, node: cst.CSTNode, what: str, severity: Severity) -> None:
        statement = next((n for n in reversed(self.ctx.ancestors)
                          if isinstance(n, (cst.SimpleStatementLine, cst.BaseCompoundStatement))), None)
        if statement is not None:
            if id(statement) in self._reported_statements:
                return  # one finding per statement: after its first read the GPU is idle, the rest are cheap
            self._reported_statements.add(id(statement))
        if severity is Severity.WARNING and self._feeds_environment():
            self.report(node, f"{what} feeds a host-side environment: a GPU sync every environment step; for "
                              "small policies consider acting on the CPU, or a GPU-vectorised environment",
                        severity=Severity.INFO)
            return
        if severity is Severity.WARNING and self.ctx.hot_kind() is HotKind.ROLLOUT:
            self.report(node, f"{what} in a rollout or search step: the host waits for the GPU every move or "
                              "simulation; read the outputs back in one copy, evaluate many positions per call, "
                              "or run a small network on the CPU", severity=severity)
            return
        suffix = " (inside an evaluation block: informational)" if severity is Severity.INFO else ""
        self.report(node, f"{what}: reads a GPU value on the host and waits for all queued GPU work; accumulate "
                          f"on the device and read it every N steps{suffix}", severity=severity)

    # -- visitors ----------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        if not self._enabled:
            return
        name = method_name(node)
        func = node.func
        candidates: list[tuple[cst.CSTNode, str]] = []
        qual = self.ctx.qualname(func) or ""
        if qual.startswith("math.") and len(node.args) == 1 and not node.args[0].star:
            # `math.sqrt(t)` converts a tensor to a Python float first
            candidates.append((node, node.args[0].value, f"`{qual}(tensor)`"))  # type: ignore[arg-type]
        elif name is not None and isinstance(func, cst.Attribute):
            if name in ("item", "tolist", "cpu") and not node.args:
                candidates.append((node, func.value, f"`.{name}()`"))  # type: ignore[arg-type]
            elif name == "numpy" and any(a.keyword and a.keyword.value == "force" and
                                         dotted_name(a.value) == "True" for a in node.args):
                candidates.append((node, func.value, "`.numpy(force=True)`"))  # type: ignore[arg-type]
            elif name == "to" and call_arg(node, "non_blocking") is None:
                placement = Placement(self.ctx)
                if placement.target_of_to(node) == HOST and not any(a.star for a in node.args):
                    candidates.append((node, func.value, "`.to(\"cpu\")`"))  # type: ignore[arg-type]
            elif name == "format" and isinstance(func.value, (cst.SimpleString, cst.ConcatenatedString)):
                candidates.extend((a.value, a.value, "formatting a tensor") for a in node.args  # type: ignore[misc]
                                  if not a.star)
            elif name in _LOG_METHODS and _LOG_RECEIVERS.match(last_name(func.value) or ""):
                candidates.extend((a.value, a.value, "logging a tensor") for a in node.args[1:]  # type: ignore[misc]
                                  if not a.star)
            elif name in ("add_scalar",):
                value = call_arg(node, "scalar_value", 1)
                if value is not None:
                    candidates.append((value.value, value.value, "`add_scalar` of a tensor"))  # type: ignore[arg-type]
        elif isinstance(func, cst.Name) and not self.ctx.analysis.bindings_of(func.value, self.ctx.ancestors):
            if func.value in ("float", "int", "bool") and len(node.args) == 1 and not node.args[0].star:
                candidates.append((node, node.args[0].value, f"`{func.value}(tensor)`"))  # type: ignore[arg-type]
            elif func.value == "print":
                candidates.extend((a.value, a.value, "printing a tensor") for a in node.args  # type: ignore[misc]
                                  if not a.star and a.keyword is None)
        if not candidates:
            return
        severity = self._region_severity()
        if severity is None:
            return
        placement = Placement(self.ctx)
        for report_node, value, what in candidates:  # type: ignore[misc]
            if severity is Severity.INFO and report_node is node and name in ("cpu", "to", "numpy"):
                continue  # an evaluation result copied out to be saved or scored: the copy is the output
            if placement.may_be_on_device(value) and not collective_read_back(self.ctx, value):
                self._emit(report_node, what, severity)

    def visit_FormattedStringExpression(self, node: cst.FormattedStringExpression) -> None:
        if not self._enabled:
            return
        severity = self._region_severity()
        if severity is None:
            return
        if Placement(self.ctx).may_be_on_device(node.expression):
            self._emit(node.expression, "formatting a tensor in an f-string", severity)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if not self._enabled or not isinstance(node.operator, cst.Modulo):
            return
        if not isinstance(node.left, (cst.SimpleString, cst.ConcatenatedString)):
            return
        severity = self._region_severity()
        if severity is None:
            return
        values = [e.value for e in node.right.elements] if isinstance(node.right, cst.Tuple) else [node.right]
        placement = Placement(self.ctx)
        for value in values:
            if placement.may_be_on_device(value):
                self._emit(value, "`%`-formatting a tensor", severity)
