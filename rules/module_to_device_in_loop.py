from __future__ import annotations

import re

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.rule import ImportRequest
from gpulint.analysis import (BindingKind, FileAnalysis, call_arg, child_nodes, dotted_name, every_n_steps, method_name,
                              walk)
from gpulint.semantic.callgraph import Frequency
from gpulint.semantic.placement import DEVICE, HOST, TENSOR, Placement, amortised

_DEVICE_NAME = re.compile(r"(^|_)(device|dev|cuda|gpu)$|^(local_)?rank$", re.I)
_FIRST_TIME = re.compile(r"first|moved|init|setup|^_?on_device|placed", re.I)
_PING_PONG_NOTE = ("unsafe fix where a method moves `self.<model>` to the CPU first thing and then only runs it: "
                   "a CPU replica made once (`copy.deepcopy`) takes the weights and the train/eval mode once per "
                   "call; the GPU model never moves, so code that expects it on the CPU after that method breaks, "
                   "and buffers the rollout updates (BatchNorm statistics) stay in the replica")


class ModuleToDeviceInLoop(Rule):
    """
    ## What it does
    Finds `module.to(device)`, `module.cuda()` and `module.cpu()` on an `nn.Module` inside a loop, or in a
    function that runs once per update (`update`, `train_step`, `forward`, ...). A module moved to the CPU
    and back to the GPU in the same loop or class (a CPU actor / GPU learner split: `collect()` moves the
    policy to the CPU, `update()` moves it back) is reported as information. Casts (`module.to(torch.float16)`,
    `memory_format=`), first-iteration guards and loops that build a new module each iteration are not
    reported.

    ## Why is this slow
    `Module.to` walks every parameter and buffer on every call. When the module is already on the device
    that is pure Python overhead (about 1 ms per call for a ResNet-50 on an H100 host); when it really moves,
    every weight crosses the PCIe bus (a CPU->GPU->CPU round trip of ResNet-50's 25.6M parameters took
    49.6 ms) and the GPU copies of the weights are freed and reallocated every episode.

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
    For a rollout on the CPU, keep a CPU replica and copy the weights into it once per episode; the GPU
    model never moves:
    ```python
    def collect(self):
        if not hasattr(self, "actor_cpu"):
            self.actor_cpu = copy.deepcopy(self.actor).to("cpu")
        self.actor_cpu.train(self.actor.training).load_state_dict(self.actor.state_dict())
        ...  # the rollout calls self.actor_cpu(obs)
    ```
    The other remedy runs the rollout's batched forward on the GPU. Measured on an H100 per episode (128 steps
    and one update, `benchmarks/pingpong_remedies.py`): with 64 environments and a 256-wide policy, ping-pong
    55 ms, replica 53 ms, GPU rollout 98 ms (each step's GPU forward pays a copy in and a read of the action,
    more than a small CPU forward); with 1024 environments or a 1024-wide policy the GPU rollout wins (1024 x
    1024: ping-pong 1121 ms, replica 704 ms, GPU rollout 153 ms). The fix writes the replica; for large
    batches or networks, move the rollout to the GPU by hand.

    ## Fix safety
    Unsafe fix, only for a method that starts with `self.<model>.to("cpu")` (or `.cpu()`) as a statement of its
    own, when the class moves the model back elsewhere, and the rest of the method only calls the model
    (`self.<model>(x)`): no mode switch, move, assignment or hand-off of the model, no `self` passed on, and no
    other method called that uses the model. The move becomes the replica refresh and those calls use the
    replica. Values are the same (the replica holds the same weights and train/eval mode), but the GPU model
    no longer moves: code that expects it on the CPU after that method (an evaluation between rollout and
    update) breaks, and buffers the rollout updates in train mode (BatchNorm statistics) stay in the replica.
    Other sites have no automatic fix: hoisting a move out of the loop is right when the module stays on one
    device, but if the loop deliberately moves it back and forth after the optimizer was created, the
    optimizer state (e.g. Adam's `exp_avg`) does not follow the parameters and `step()` fails with a device
    mismatch.
    """

    code = "GPU014"
    name = "module-to-device-in-loop"
    message = "Module moved to a device inside a loop: `Module.to` walks every parameter on each call"
    fix_title = "Keep a CPU replica of the model for the rollout"
    severity = Severity.WARNING
    safety = Safety.UNSAFE
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
            fixed="""
            import torch
            import torch.nn as nn
            import copy

            class Agent:
                def __init__(self, device):
                    self.device = device
                    self.actor = nn.Linear(4, 2)
                    self.opt = torch.optim.Adam(self.actor.parameters())

                def collect(self, env):
                    if not hasattr(self, "actor_cpu"):
                        self.actor_cpu = copy.deepcopy(self.actor).to("cpu")
                    self.actor_cpu.train(self.actor.training).load_state_dict(self.actor.state_dict())
                    return [self.actor_cpu(torch.as_tensor(env.reset())) for _ in range(8)]

                def update(self, batch):
                    self.actor.to(self.device)
                    loss = self.actor(batch.to(self.device)).sum()
                    loss.backward()
                    self.opt.step()

                def train(self, env, episodes):
                    for _ in range(episodes):
                        self.update(self.collect(env))
            """,
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

    # one episode of a PPO-shaped rollout (64 environments, a 256-wide MLP, 128 steps on the CPU): the
    # original moves the model to the CPU and back; the replica takes a weight copy instead
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup=("import copy\n"
               "actor = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 5))\n"
               "actor_cpu = copy.deepcopy(actor).to('cpu')\n"
               "obs = torch.randn(16, 8, device='cpu')"),
        before=("actor.to('cpu')\n"
                "with torch.no_grad():\n"
                "    out = actor(obs)\n"
                "actor.to(device)"),
        after=("actor_cpu.train(actor.training).load_state_dict(actor.state_dict())\n"
               "with torch.no_grad():\n"
               "    out = actor_cpu(obs)"),
        compare=("out",),
        options={
            "perf_setup": ("import copy\n"
                           "actor = nn.Sequential(nn.Linear(8, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),\n"
                           "                      nn.Linear(256, 5))\n"
                           "actor_cpu = copy.deepcopy(actor).to('cpu')\n"
                           "obs = torch.randn(64, 8, device='cpu')"),
            "perf_before": ("actor.to('cpu')\n"
                            "with torch.no_grad():\n"
                            "    for t in range(128):\n"
                            "        out = actor(obs)\n"
                            "actor.to(device)"),
            "perf_after": ("actor_cpu.train(actor.training).load_state_dict(actor.state_dict())\n"
                           "with torch.no_grad():\n"
                           "    for t in range(128):\n"
                           "        out = actor_cpu(obs)"),
        },
    )

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
            replacements, imports = (), ()
            plan = self._replica_plan(node, name, receiver) if loop is None else None
            if plan is not None:
                replacements, imports = plan
            self.report(node, f"`{receiver_text}` moves between the CPU and the GPU {where} (CPU actor / GPU "
                              "learner): every move copies all weights over PCIe; keep a CPU replica for the "
                              "rollout and copy the weights into it once per episode", severity=Severity.INFO,
                        replacements=replacements, imports=imports, note=_PING_PONG_NOTE)
            return
        advice = "move it once before the loop" if loop is not None else "move it once, where it is built"
        self.report(node, f"Module moved to a device {where}: `Module.to` walks every parameter on each call; "
                          f"{advice}")

    # -- the CPU replica fix ------------------------------------------------------------------

    def _replica_plan(self, node: cst.Call, name: str, receiver: cst.BaseExpression
                      ) -> tuple[tuple[tuple[cst.CSTNode, cst.CSTNode | str], ...], tuple[ImportRequest, ...]] | None:
        """A method that starts by moving `self.<model>` to the CPU and then runs it there (a rollout): the move
        becomes a CPU replica refreshed from the GPU model once per call, and the method's uses of the model use
        the replica. None where that is not provably all the method does with the model."""
        if self._target(node, name) != HOST or not _is_self_attr(receiver):
            return None
        assert isinstance(receiver, cst.Attribute)
        function, owner = self._enclosing_function(), self.ctx.enclosing(cst.ClassDef)
        if function is None or owner is None or not isinstance(function.body, cst.IndentedBlock) \
                or not isinstance(owner.body, cst.IndentedBlock) or not any(s is function for s in owner.body.body):
            return None
        params = function.params.params
        if not params or params[0].name.value != "self":
            return None
        statements = list(function.body.body)
        index = next((i for i, st in enumerate(statements) if isinstance(st, cst.SimpleStatementLine)
                      and len(st.body) == 1 and isinstance(st.body[0], cst.Expr) and st.body[0].value is node), None)
        if index is None:
            return None  # the move must run unconditionally, before everything that follows it
        attr = receiver.attr.value
        replica = f"{attr}_cpu"
        if any(isinstance(n, cst.Name) and n.value == replica or isinstance(n, cst.Attribute)
               and n.attr.value == replica for n in walk(owner, into_functions=True)):
            return None
        methods = {s.name.value: s for s in owner.body.body if isinstance(s, cst.FunctionDef)}
        uses = _replica_uses(statements[index + 1:], attr, methods)
        if uses is None:
            return None
        deepcopy, imports = self.ctx.spell("copy.deepcopy")
        indent = "".join(block.indent if block.indent is not None else self.ctx.module.default_indent
                         for block in self.ctx.ancestors if isinstance(block, cst.IndentedBlock))
        unit = function.body.indent if function.body.indent is not None else self.ctx.module.default_indent
        model, copy_ = f"self.{attr}", f"self.{replica}"
        text = (f'if not hasattr(self, "{replica}"):\n{indent}{unit}{copy_} = {deepcopy}({model}).to("cpu")\n'
                f"{indent}{copy_}.train({model}.training).load_state_dict({model}.state_dict())")
        replacements: list[tuple[cst.CSTNode, cst.CSTNode | str]] = [(node, text)]
        replacements.extend((use, cst.parse_expression(copy_)) for use in uses)
        return tuple(replacements), imports

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
        """Is the receiver (re)bound inside the loop (or function), other than by `m = m.to(...)`? (`self.net =
        Net()` then `self.net.cuda()` in an `__init__`: each call builds the module it moves.)"""
        name = dotted_name(receiver) if isinstance(receiver, (cst.Name, cst.Attribute)) else None
        if name is None:
            return False
        for node in walk(loop):
            if isinstance(node, cst.For) and node is loop and any(
                    isinstance(n, cst.Name) and n.value == name for n in walk(node.target)):
                return True
            if isinstance(node, cst.Assign) and any(
                    dotted_name(n) == name for t in node.targets for n in walk(t.target)
                    if isinstance(n, (cst.Name, cst.Attribute))):
                value = node.value
                while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                        and method_name(value) in ("to", "cuda", "cpu", "train", "eval", "float", "half"):
                    value = value.func.value
                if dotted_name(value) != name:
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
        for node in _walk_skipping_amortised(self.ctx.analysis, region,
                                             into_functions=isinstance(region, cst.ClassDef)):
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


def _is_self_attr(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"


def _targets(root: cst.CSTNode) -> list[cst.CSTNode]:
    """The assignment, deletion and loop targets under `root`."""
    found: list[cst.CSTNode] = []
    for node in walk(root, into_functions=True):
        if isinstance(node, cst.Assign):
            found.extend(t.target for t in node.targets)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.Del, cst.CompFor, cst.NamedExpr)):
            found.append(node.target)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            found.append(node.asname.name)
    return found


def _replica_uses(statements: list[cst.BaseStatement], attr: str,
                  methods: dict[str, cst.FunctionDef]) -> list[cst.Attribute] | None:
    """The `self.<attr>` expressions in `statements` when each is a call of the model (`self.m(x)`,
    `self.m.forward(x)`), `self` never leaves them (passed or returned bare, captured by a
    nested function, `super()`), and no method of the class they call touches `self.<attr>`; else None."""
    uses: list[cst.Attribute] = []
    in_target = {id(n) for statement in statements for target in _targets(statement) for n in walk(target)}
    touching = {name for name, method in methods.items() if any(
        _is_self_attr(n) and n.attr.value == attr for n in walk(method, into_functions=True))}
    for statement in statements:
        for current, parent in _walk_with_parents(statement):
            if isinstance(current, (cst.FunctionDef, cst.Lambda, cst.ClassDef)) and any(
                    isinstance(n, cst.Name) and n.value == "self" for n in walk(current, into_functions=True)):
                return None
            if isinstance(current, cst.Name) and current.value == "super":
                return None
            if isinstance(current, cst.Name) and current.value == "self" and not (
                    isinstance(parent, cst.Attribute) and parent.value is current):
                return None  # `helper(self)`, `return self`
            if not _is_self_attr(current):
                continue
            assert isinstance(current, cst.Attribute)
            if isinstance(parent, cst.Call) and parent.func is current and current.attr.value in methods \
                    and current.attr.value in touching:
                return None  # a method of the class that uses the model itself
            if current.attr.value != attr:
                continue
            if id(current) in in_target:
                return None
            if not (isinstance(parent, cst.Call) and parent.func is current or isinstance(parent, cst.Attribute)
                    and parent.attr.value == "forward"):
                return None  # only calls of the model: `.eval()`, `.to()` or a callee would act on the GPU model
            uses.append(current)
    return uses


def _walk_with_parents(root: cst.CSTNode):  # noqa: ANN201 - iterator of (node, parent)
    stack: list[tuple[cst.CSTNode, cst.CSTNode | None]] = [(root, None)]
    while stack:
        current, parent = stack.pop()
        yield current, parent
        stack.extend((child, current) for child in reversed(child_nodes(current)))


def _fresh_module(node: cst.BaseExpression) -> bool:
    """`Net(...)`, `Net(...).train()`: a module constructed by this very expression."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
            and method_name(node) in ("to", "cuda", "cpu", "train", "eval", "float", "half", "double"):
        node = node.func.value
    if not isinstance(node, cst.Call):
        return False
    last = (dotted_name(node.func) or "").rsplit(".", 1)[-1]
    return last[:1].isupper()


def _walk_skipping_amortised(analysis: FileAnalysis, root: cst.CSTNode,
                             into_functions: bool = False):  # noqa: ANN201 - iterator of nodes
    """Nodes under `root`, leaving out the bodies of `if step % N == 0:` blocks (checkpointing every N steps);
    nested functions only with `into_functions` (the methods of a class)."""
    stack: list[cst.CSTNode] = [root]
    while stack:
        current = stack.pop()
        if current is not root and isinstance(current, (cst.ClassDef, cst.Lambda)):
            continue
        if current is not root and isinstance(current, cst.FunctionDef) and not into_functions:
            continue
        yield current
        if isinstance(current, cst.If) and every_n_steps(analysis, current.test):
            stack.extend(reversed([c for c in child_nodes(current) if c is not current.body]))
            continue
        stack.extend(reversed(child_nodes(current)))
