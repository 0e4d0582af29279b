from __future__ import annotations

import re

import libcst as cst

from gpulint import HotKind, Invalid, Rule, Severity, Valid
from gpulint.analysis import BindingKind, call_arg, child_nodes, dotted_name, method_name, walk
from gpulint.semantic.callgraph import Frequency
from gpulint.semantic.placement import DEVICE, HOST, TENSOR, Placement, amortised

_DEVICE_NAME = re.compile(r"(^|_)(device|dev|cuda|gpu)$|^(local_)?rank$", re.I)
_FIRST_TIME = re.compile(r"first|moved|init|setup|^_?on_device|placed", re.I)


class ModuleToDeviceInLoop(Rule):
    """
    ## What it does
    Finds `module.to(device)`, `module.cuda()` and `module.cpu()` on an `nn.Module` inside a loop, or in a
    function that runs once per update (`update`, `train_step`, `forward`, ...). A module moved to the CPU
    and back to the GPU in the same loop (a CPU actor / GPU learner split) is reported as information only.
    Casts (`module.to(torch.float16)`, `memory_format=`), first-iteration guards and loops that build a new
    module each iteration are not reported.

    ## Why is this slow
    `Module.to` walks every parameter and buffer on every call. When the module is already on the device
    that is pure Python overhead (about 1 ms per call for a ResNet-50 on an H100 host); when it really moves,
    every weight crosses the PCIe bus (a CPU->GPU->CPU round trip of ResNet-50's 25.6M parameters took
    49.6 ms).

    ## Example
    ```python
    for x, y in loader:
        model.to(device)
        loss = criterion(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    model.to(device)
    for x, y in loader:
        loss = criterion(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    No automatic fix. Hoisting the move out of the loop is right when the module stays on one device, but
    if the loop deliberately moves it back and forth after the optimizer was created, the optimizer state
    (e.g. Adam's `exp_avg`) does not follow the parameters and `step()` fails with a device mismatch.
    """

    code = "GPU014"
    name = "module-to-device-in-loop"
    message = "Module moved to a device inside a loop: `Module.to` walks every parameter on each call"
    severity = Severity.WARNING
    priority = "P2"
    triggers = (".to(", ".cuda(", ".cpu(")
    examples = [
        Valid(
            """
            import torch.nn as nn
            model = nn.Linear(4, 2).to("cuda")
            for x in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a cast, not a move; and a fresh module per iteration
            """
            import torch
            import torch.nn as nn
            for width in (64, 128):
                model = nn.Linear(4, width)
                model.to("cuda")
                model.to(torch.bfloat16)
            """
        ),
        Valid(  # parameters and buffers are tensors: `.to` copies one tensor, it does not walk a module
            """
            import torch
            import torch.nn as nn
            class Block(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.table = nn.Parameter(torch.randn(1, dim))
                    self.register_buffer("freq", torch.arange(dim).float())
                    self.scale = nn.Buffer(torch.ones(dim))
                def forward(self, x):
                    table = self.table.to(x.device)
                    freq = self.freq.to(device=x.device, dtype=x.dtype)
                    return x * table + freq * self.scale.to(x.device)
            """
        ),
        Invalid(  # a submodule moved on every forward call
            """
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = nn.Linear(4, 2)
                def forward(self, x):
                    self.head.to(x.device)
                    return self.head(x)
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Agent:
                def __init__(self, device):
                    self.device = device
                    self.actor = nn.Linear(4, 2)
                    self.opt = torch.optim.Adam(self.actor.parameters())

                def collect(self, env):
                    self.actor.to("cpu")
                    return [self.actor(torch.as_tensor(env.reset())) for _ in range(8)]

                def update(self, batch):
                    self.actor.to(self.device)
                    loss = self.actor(batch.to(self.device)).sum()
                    loss.backward()
                    self.opt.step()

                def train(self, env, episodes):
                    for _ in range(episodes):
                        self.update(self.collect(env))
            """,
            count=2,
        ),
        Valid(
            """
            import torch
            import torch.nn as nn

            class Agent:
                def __init__(self):
                    self.actor = nn.Linear(4, 2)

                def setup(self, device):
                    self.actor.to(device)

            agent = Agent()
            agent.setup(torch.device("cuda"))
            """
        ),
        Invalid(
            """
            import torch.nn as nn
            model = nn.Linear(4, 2)
            for x in loader:
                model.to("cuda")
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
            """
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = method_name(node)
        if name not in ("to", "cuda", "cpu") or not isinstance(node.func, cst.Attribute):
            return
        receiver = node.func.value
        if _fresh_module(receiver) or not self.ctx.evidence.is_module(receiver):
            return  # `Layer(...).to(device)`: a new module has to be moved once
        target = self._target(node, name)
        if target is None:
            return
        loop = self._innermost_loop()
        kind = self.ctx.hot_kind()
        if loop is None:
            function = self._enclosing_function()
            repeated = function is not None and self.ctx.analysis.call_frequency.get(id(function),
                                                                                   Frequency.ONCE) > Frequency.ONCE
            if kind not in (HotKind.STEP_FUNCTION, HotKind.FORWARD, HotKind.CALLEE, HotKind.ROLLOUT) and not repeated:
                return
            if function is not None and self._built_in_loop(receiver, function):
                return  # the function builds the module it moves
            where = ("in a function that runs every step" if kind is not None
                     else f"in `{function.name.value}()`, which the program calls on every iteration of a loop "  # type: ignore[union-attr]
                          "(per episode or update)")
        else:
            if id(loop) not in self.ctx.analysis.hot and self._encloses_hot_loop(loop):
                return  # an epoch loop: one move per epoch costs nothing measurable
            if self._built_in_loop(receiver, loop):
                return  # a new module each iteration has to be moved
            where = "inside a loop"
        if self._first_time_guard(loop) or amortised(self.ctx):
            return  # first iteration only, or every N steps (checkpointing)
        region = loop if loop is not None else self._enclosing_function()
        receiver_text = dotted_name(receiver)
        owner = self.ctx.enclosing(cst.ClassDef) if loop is None else None
        if receiver_text and region is not None and (self._moves_both_ways(region, receiver_text) or (
                owner is not None and self._moves_both_ways(owner, receiver_text))):
            self.report(node, f"`{receiver_text}` moves between the CPU and the GPU {where} (CPU actor / GPU "
                              "learner): every move copies all weights over PCIe; consider keeping a CPU copy and "
                              "loading state_dict updates only when they change", severity=Severity.INFO)
            return
        advice = "move it once before the loop" if loop is not None else "move it once, where it is built"
        self.report(node, f"Module moved to a device {where}: `Module.to` walks every parameter on each call; "
                          f"{advice}")

    # -- helpers -----------------------------------------------------------------------------

    def _target(self, node: cst.Call, name: str) -> str | None:
        if name == "cuda":
            return DEVICE
        if name == "cpu":
            return HOST
        if any(arg.star for arg in node.args):
            return None
        target = call_arg(node, "device")
        if target is None:
            positional = [a for a in node.args if a.keyword is None]
            if not positional:
                return None  # .to(dtype=...), .to(memory_format=...)
            target = positional[0]
        kind = Placement(self.ctx).device_kind(target.value)
        if kind == TENSOR:
            return None  # a cast
        if kind in (DEVICE, HOST):
            return kind
        return DEVICE if _DEVICE_NAME.search(dotted_name(target.value) or "") else None

    def _innermost_loop(self) -> cst.CSTNode | None:
        for node in reversed(self.ctx.ancestors[:-1]):
            if isinstance(node, (cst.For, cst.While)):
                return node
            if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
        return None

    def _enclosing_function(self) -> cst.FunctionDef | None:
        return next((n for n in reversed(self.ctx.ancestors) if isinstance(n, cst.FunctionDef)), None)

    def _encloses_hot_loop(self, loop: cst.CSTNode) -> bool:
        hot = self.ctx.analysis.hot
        return any(isinstance(n, (cst.For, cst.While)) and n is not loop and id(n) in hot for n in walk(loop))

    def _built_in_loop(self, receiver: cst.BaseExpression, loop: cst.CSTNode) -> bool:
        """Is the receiver (re)bound inside the loop (or function), other than by `m = m.to(...)`?"""
        name = receiver.value if isinstance(receiver, cst.Name) else None
        if name is None:
            return False
        for node in walk(loop):
            if isinstance(node, cst.For) and node is loop and any(
                    isinstance(n, cst.Name) and n.value == name for n in walk(node.target)):
                return True
            if isinstance(node, cst.Assign) and any(
                    isinstance(n, cst.Name) and n.value == name for t in node.targets for n in walk(t.target)):
                value = node.value
                while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                        and method_name(value) in ("to", "cuda", "cpu", "train", "eval", "float", "half"):
                    value = value.func.value
                if not (isinstance(value, cst.Name) and value.value == name):
                    return True
        return any(b.kind is BindingKind.FOR for b in self.ctx.analysis.bindings_of(name, self.ctx.ancestors)
                   if b.value is not None and any(b.value is n for n in walk(loop)))

    def _first_time_guard(self, loop: cst.CSTNode | None) -> bool:
        """`if epoch == 0:` / `if not moved:` / `if first_step:` around the move."""
        ancestors = self.ctx.ancestors
        for index in range(len(ancestors) - 2, -1, -1):
            node = ancestors[index]
            if node is loop or isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if isinstance(node, cst.If) and ancestors[index + 1] is node.body:
                test = node.test
                if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                    return True
                for n in walk(test):
                    if isinstance(n, cst.Comparison) and any(
                            isinstance(c.operator, cst.Equal) and isinstance(c.comparator, cst.Integer)
                            and c.comparator.value == "0" for c in n.comparisons):
                        return True
                    if isinstance(n, cst.Comparison) and any(isinstance(c.operator, (cst.Is, cst.IsNot))
                                                             for c in n.comparisons):
                        return True
                    if isinstance(n, cst.Name) and _FIRST_TIME.search(n.value):
                        return True
        return False

    def _moves_both_ways(self, region: cst.CSTNode, receiver: str) -> bool:
        placement = Placement(self.ctx)
        seen: set[str] = set()
        for node in _walk_skipping_amortised(region):
            if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
                continue
            name = method_name(node)
            if name not in ("to", "cuda", "cpu") or dotted_name(node.func.value) != receiver:
                continue
            if name == "cpu":
                seen.add(HOST)
            elif name == "cuda":
                seen.add(DEVICE)
            else:
                target = call_arg(node, "device", 0)
                kind = placement.device_kind(target.value) if target is not None else None
                if kind in (DEVICE, HOST):
                    seen.add(kind)
                elif target is not None and _DEVICE_NAME.search(dotted_name(target.value) or ""):
                    seen.add(DEVICE)
        return seen == {DEVICE, HOST}


def _fresh_module(node: cst.BaseExpression) -> bool:
    """`Net(...)`, `Net(...).train()`: a module constructed by this very expression."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
            and method_name(node) in ("to", "cuda", "cpu", "train", "eval", "float", "half", "double"):
        node = node.func.value
    if not isinstance(node, cst.Call):
        return False
    last = (dotted_name(node.func) or "").rsplit(".", 1)[-1]
    return last[:1].isupper()


def _walk_skipping_amortised(root: cst.CSTNode):  # noqa: ANN201 - iterator of nodes
    """Nodes under `root`, leaving out the bodies of `if step % N == 0:` blocks (checkpointing every N steps)."""
    stack: list[cst.CSTNode] = [root]
    while stack:
        current = stack.pop()
        if current is not root and isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        yield current
        if isinstance(current, cst.If) and any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo)
                                               for n in walk(current.test)):
            stack.extend(reversed([c for c in child_nodes(current) if c is not current.body]))
            continue
        stack.extend(reversed(child_nodes(current)))
