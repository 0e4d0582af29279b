"""GPU070: the same network called on two or more separate batches in one step."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import (
    BindingKind,
    FileAnalysis,
    HotKind,
    PerFileFacts,
    call_arg,
    child_nodes,
    dotted_name,
    has_star_args,
    iter_calls,
    method_name,
    walk,
)
from gpulint.program import mentions, related_texts
from gpulint.rule import is_test_path
from gpulint.semantic.modules import (
    MODULE_NAME,
    UNKNOWN,
    WRAPPER_METHODS,
    ModuleFacts,
    ModuleResolver,
    RowCheck,
    code_of,
    int_value,
    is_false,
    names_in,
    held_class_facts,
    program_class_facts,
    rebuild_owner,
    returns_arity,
)

# ---------------------------------------------------------------------------------------------
# Shared with GPU004 (gather_compute_scatter imports these): what a module does to the batch dimension.
# Candidates for the engine (catalog §0.3 "batch-coupled module").


# ---------------------------------------------------------------------------------------------
# Shared with GPU004: is an expression a row-wise function of the tracked (batch-indexed) values?


_SHAPE_KEEPING = frozenset({"detach", "clone", "contiguous", "float", "half", "bfloat16", "double", "to", "cuda",
                            "requires_grad_"})


def _shape_kept(value: cst.BaseExpression) -> cst.BaseExpression:
    """`fake.detach()`, `x.float().cuda()` -> the tensor whose shape the methods keep."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
            and value.func.attr.value in _SHAPE_KEEPING:
        value = value.func.value
    return value


def dotted_in(node: cst.CSTNode) -> set[str]:
    """Names and `self.x` attribute paths used in `node`."""
    found = names_in(node)
    for n in walk(node):
        if isinstance(n, cst.Attribute):
            dotted = dotted_name(n)
            if dotted:
                found.add(dotted)
    return found


# ---------------------------------------------------------------------------------------------
# where merging is not worth a finding: compiled models, inputs of other shapes, assertion-only outputs


class CompiledModels(PerFileFacts):
    """Module classes of this file whose forward runs under torch.compile: `torch.compile(model)`,
    `model.compile()`, `torch.compile(Net(...))`, or `@torch.compile` on a method; with every same-file
    module class they build (their submodules) and their same-file bases."""

    def __init__(self, analysis: FileAnalysis) -> None:
        super().__init__(analysis)
        a = analysis
        roots: set[str] = set()
        for call in iter_calls(a.module, into_functions=True):
            target: cst.BaseExpression | None = None
            if a.call_qualname(call) == "torch.compile" and call.args and call.args[0].keyword is None:
                target = call.args[0].value
            elif method_name(call) == "compile" and isinstance(call.func, cst.Attribute) \
                    and a.qualname(call.func.value) is None:
                target = call.func.value
            if target is not None:
                roots |= self._classes_of(target, set())
        for fn_id, kind in a.hot.items():
            info = a.function_class.get(fn_id)
            if kind is HotKind.COMPILED and info is not None and info.is_module:
                roots.add(info.node.name.value)
        self.classes: set[str] = set()
        pending = [r for r in roots if r in a.classes]
        while pending:
            name = pending.pop()
            if name in self.classes:
                continue
            self.classes.add(name)
            info = a.classes[name]
            pending.extend(b for b in info.base_names if b in a.classes)
            for call in iter_calls(info.node, into_functions=True):
                if isinstance(call.func, cst.Name) and call.func.value in a.classes \
                        and a.classes[call.func.value].is_module:
                    pending.append(call.func.value)

    def _classes_of(self, node: cst.BaseExpression, seen: set[str]) -> set[str]:
        """Same-file module classes an expression may hold (`GPT(...).cuda()`, a name bound to one)."""
        a = self.a
        while isinstance(node, cst.Call):
            if a.call_qualname(node) == "torch.compile" and node.args:
                node = node.args[0].value
            elif method_name(node) in WRAPPER_METHODS and isinstance(node.func, cst.Attribute):
                node = node.func.value
            elif isinstance(node.func, cst.Name) and node.func.value in a.classes:
                return {node.func.value} if a.classes[node.func.value].is_module else set()
            else:
                return set()
        found: set[str] = set()
        key = dotted_name(node)
        if key is None or key in seen:
            return found
        seen.add(key)
        values: list[cst.BaseExpression] = []
        if isinstance(node, cst.Name):
            for scope in a.scopes.values():
                values += [b.value for b in scope.bindings.get(node.value, ()) if b.kind is BindingKind.ASSIGN
                           and b.value is not None]
        elif isinstance(node, cst.Attribute) and dotted_name(node.value) == "self":
            for info in a.classes.values():
                values += [b.value for b in info.attrs.get(node.attr.value, ()) if b.kind is BindingKind.ASSIGN
                           and b.value is not None]
        for value in values:
            found |= self._classes_of(value, seen)
        return found


_ASSERTING = {"torch.allclose", "torch.equal", "torch.isclose", "numpy.allclose", "numpy.array_equal",
              "numpy.isclose"}


def _only_asserted(a: FileAnalysis, fn: cst.FunctionDef | None, names: set[str],
                   skip: Sequence[cst.CSTNode]) -> bool:
    """Every later use of `names` in `fn` is in an `assert`, a `torch.testing`/`assert*` call or an
    `allclose`/`equal` comparison: the outputs are checked, not computed on."""
    if fn is None or not names:
        return False
    skipped = {id(n) for s in skip for n in walk(s)}
    uses = 0

    def visit(node: cst.CSTNode, asserted: bool) -> bool:
        nonlocal uses
        if id(node) in skipped:
            return True
        if isinstance(node, cst.Assert):
            asserted = True
        elif isinstance(node, cst.Call):
            qual = a.call_qualname(node) or ""
            last = (qual or dotted_name(node.func) or "").rsplit(".", 1)[-1]
            if qual in _ASSERTING or last.startswith(("assert", "assert_")) or qual.startswith("torch.testing.") \
                    or method_name(node) in ("allclose", "equal", "isclose"):
                asserted = True
        elif isinstance(node, cst.Name) and node.value in names:
            uses += 1
            return asserted
        return all(visit(child, asserted) for child in child_nodes(node))

    return visit(fn.body, False) and uses > 0


def _slice_length(part: cst.Slice) -> tuple[int, int] | str:
    """The length of `lower:upper` along a dimension of unknown size L, as (coefficient of L, constant);
    text when it depends on names or a step."""
    def bound(node: cst.BaseExpression | None, default: tuple[int, int]) -> tuple[int, int] | None:
        if node is None:
            return default
        value = int_value(node)
        if value is None:
            return None
        return (1, value) if value < 0 else (0, value)

    lower, upper = bound(part.lower, (0, 0)), bound(part.upper, (1, 0))
    if lower is None or upper is None or part.step is not None:
        return code_of(part)
    return upper[0] - lower[0], upper[1] - lower[1]


def _beyond_batch(node: cst.BaseExpression) -> tuple:
    """How indexing changes the dimensions after the batch dimension: `x` and `x[:n]` -> (); `x[:, :5]`,
    `x[..., 1:]` describe the sliced dimension by its length, so `x[:, :-1]` and `x[:, 1:]` agree."""
    if not isinstance(node, cst.Subscript):
        return ()
    described = []
    for element in node.slice:
        inner = element.slice
        if isinstance(inner, cst.Slice):
            described.append(("slice", _slice_length(inner)))
        elif isinstance(inner.value, cst.Ellipsis):
            described.append(("...",))
        elif isinstance(inner.value, cst.Name) and inner.value.value == "None":
            described.append(("new",))
        elif int_value(inner.value) is not None:
            described.append(("index",))
        else:
            described.append(("index", code_of(inner.value)))  # a tensor index selects a shape of its own
    if described and described[0][0] != "...":
        described = described[1:]  # the batch dimension itself may be cut anywhere
    full = ("slice", (1, 0))
    if ("...",) in described:
        at = described.index(("...",))
        prefix, suffix = described[:at], described[at + 1:]
        while suffix and suffix[0] == full:
            suffix = suffix[1:]
        described = prefix + ([("...",)] + suffix if suffix else [])
    while described and described[-1] == full:
        described = described[:-1]
    return tuple(described)


_SIZED_FACTORIES = {"zeros", "ones", "empty", "randn", "rand", "full", "randint"}


def _literal_shape(a: FileAnalysis, node: cst.BaseExpression) -> tuple[int | None, ...] | None:
    """The shape of `torch.tensor([[1, 2, 3]])` or `torch.randn(2, 10)` (None entries: sizes not literal)."""
    while isinstance(node, cst.Call) and method_name(node) in ("to", "cuda", "cpu", "long", "float", "half", "int",
                                                                "bfloat16", "double", "bool", "contiguous"):
        node = node.func.value  # type: ignore[attr-defined]
    if not isinstance(node, cst.Call):
        return None
    qual = a.call_qualname(node) or ""
    if not qual.startswith("torch."):
        return None
    last = qual.rsplit(".", 1)[-1]
    positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
    if last in ("tensor", "as_tensor") and positional:
        shape: list[int] = []
        value = positional[0]
        while isinstance(value, (cst.List, cst.Tuple)):
            shape.append(len(value.elements))
            if not value.elements or any(isinstance(e, cst.StarredElement) for e in value.elements):
                break
            value = value.elements[0].value
        return tuple(shape) if shape else None
    if last not in _SIZED_FACTORIES:
        return None
    size = call_arg(node, "size")
    if size is not None:
        sizes: list[cst.BaseExpression] | None = [size.value]
    elif last == "randint":
        sizes = [positional[-1]] if positional and isinstance(positional[-1], (cst.Tuple, cst.List)) else None
    elif last == "full":
        sizes = positional[:1]
    else:
        sizes = positional
    if not sizes:
        return None
    if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)):
        sizes = [e.value for e in sizes[0].elements]
    return tuple(int_value(s) for s in sizes)


def _shapes_differ(first: tuple[int | None, ...], second: tuple[int | None, ...]) -> bool:
    if len(first) != len(second):
        return True
    return any(x is not None and y is not None and x != y for x, y in list(zip(first, second))[1:])


# ---------------------------------------------------------------------------------------------
# the rule

_BARRIER_METHODS = {"backward", "step", "zero_grad", "train", "eval", "load_state_dict", "requires_grad_",
                    "apply", "register_forward_hook", "register_forward_pre_hook", "reset_parameters"}
_BARRIER_FUNCTIONS = {"torch.manual_seed", "torch.set_grad_enabled", "torch.autograd.backward", "torch.cuda.manual_seed",
                      "torch.cuda.manual_seed_all", "torch.random.manual_seed", "torch.use_deterministic_algorithms"}
_WRAP_AT = 96  # longer rewrites put the split on its own line
_NO_GRAD = {"torch.no_grad", "torch.inference_mode", "torch.enable_grad"}
_SILENT = "not reported: may run in training mode"  # a reason that means: report nothing
# what a program that may hold a row-coupling network (BatchNorm, dropout, a model zoo's networks) names somewhere
_COUPLING_TEXT = re.compile(r"BatchNorm|batch_norm|SyncBN|[Dd]ropout|\bdrop_|norm_layer|GroupNorm|InstanceNorm|"
                            r"torchvision\.models|\btimm\b|(from|import) transformers")


@dataclass
class _Site:
    statement: cst.SimpleStatementLine
    assign: cst.Assign
    call: cst.Call
    template: str  # the value with the call replaced by a placeholder
    prepared_between: bool = False  # its inputs are computed after the group's first call (independently of it)
    nested: bool = False  # an argument of another call (`torch.min(q1(s, a), q2(s, a))`): reported, never rewritten
    indexed: bool = False  # its output indexed at once (`q = net(s)[rows, actions]`): reported, never rewritten


class SplitForwardSameModule(Rule):
    """
    ## What it does
    Finds one network called two or more times in the same block on different batches, when no call's
    input depends on another call's output and no backward, optimizer step or mode change sits between
    them: P0/P1 evaluation in self-play, `critic(obs)` and `critic(next_obs)` in an RL update, a shared
    actor run once per seat. It also sees a same-file function that wraps the network
    (`evaluate(net, p0_states)`, `evaluate(net, p1_states)`).

    ## Why is this slow
    Every call launches the whole network's kernels again. Small RL and self-play networks are bound by
    kernel launches, not by arithmetic, so two calls on half batches take nearly twice as long as one call on
    the concatenated batch. Measured on an H100 (policy MLP, forward and backward): 2 x 512 rows 939 us,
    1 x 1024 rows 549 us (x1.71).

    ## Example
    ```python
    with torch.no_grad():
        values = self.critic(obs).squeeze(-1)
        next_values = self.critic(next_obs).squeeze(-1)
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        values, next_values = self.critic(torch.cat([obs, next_obs])).squeeze(-1).split([obs.shape[0], next_obs.shape[0]])
    ```
    Networks that return a tuple are split per output; Python lists of states are concatenated with `+` and
    the outputs sliced.

    ## Fix safety
    Unsafe: larger GEMMs may pick other kernels, so results can differ in the last bits (checked with
    rtol 1e-5). No fix is offered when the batches would interact: BatchNorm or dropout in training mode
    (one call normalises over both batches and draws one dropout mask; outputs differed by 0.33 in the
    catalog's check), or when the module's definition is not visible and it is not provably in eval mode;
    nor for recurrent or sequence-first modules, differing keyword arguments, a data dependency between
    the calls, or outputs whose structure is unknown. Those sites are reported with a note saying why.

    Not reported: helpers that are not networks (activations, pooling, losses, and same-file module classes
    with no `nn.Parameter` and no learned layer, such as a rotary embedding that keeps only buffers); calls in
    the forward of a model class that the program compiles (`torch.compile(model)`, `model.compile()`,
    `@torch.compile`), where the calls are part of one compiled graph; inputs known to differ beyond the batch
    dimension (`x` and `x[:, :n]`, `torch.tensor` literals or factories of other sizes), where `torch.cat`
    would fail; outputs that only feed assertions or `allclose`/`torch.testing` comparisons; and test files.
    """

    code = "GPU070"
    name = "split-forward-same-module"
    message = "The same network is called separately on several batches; run it once on the concatenated batch"
    fix_title = "Call the network once on `torch.cat` of the batches and split the outputs"
    severity = Severity.WARNING
    safety = Safety.UNSAFE
    priority = "P1"
    # a network call needs torch code or a network-like name somewhere in the file
    triggers = ("torch", "nn.", "forward", "model", "Model", "net", "Net", "policy", "critic", "actor", "encoder",
                "evaluate")
    examples = [
        Valid(  # the second call depends on the first one's output
            """
            import torch.nn as nn
            class Tower(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.block = nn.Linear(64, 64)
                def forward(self, x):
                    h = self.block(x)
                    return self.block(h)
            """
        ),
        Valid(  # different grad modes: separate blocks
            """
            for obs, next_obs in loader:
                q = q_net(obs)
                with torch.no_grad():
                    next_q = q_net(next_obs)
                loss = (q - next_q).pow(2).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a backward pass between the calls
            """
            for real, noise in loader:
                d_real = disc(real)
                d_real.mean().backward()
                d_fake = disc(gen(noise).detach())
                d_fake.mean().backward()
                opt_d.step()
            """
        ),
        Valid(  # a parameter-free helper module (buffers only) is elementwise glue, not a network
            """
            import torch
            import torch.nn as nn
            class Scale(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.register_buffer("gain", torch.linspace(0.5, 1.5, dim))
                def forward(self, x):
                    return x * self.gain
            class Pair(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.fc = nn.Linear(dim, dim)
                    self.scale = Scale(dim)
                def forward(self, a, b):
                    sa, sb = self.scale(a), self.scale(b)
                    return self.fc(sa * sb)
            """
        ),
        Valid(  # the model is compiled: its forward's calls are one compiled graph
            """
            import torch
            import torch.nn as nn
            class Siamese(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.encoder = nn.Linear(32, 32)
                def forward(self, a, b):
                    ea, eb = self.encoder(a), self.encoder(b)
                    return (ea * eb).sum(-1)
            model = torch.compile(Siamese().cuda())
            """
        ),
        Valid(  # the second input is cut along dim 1: the batches cannot be concatenated
            """
            import torch
            def prefix_outputs(model, tokens, n):
                with torch.no_grad():
                    full = model(tokens)
                    prefix = model(tokens[:, :n])
                return full, prefix
            """
        ),
        Valid(  # inputs of different lengths
            """
            import torch
            def lengths(model):
                short = torch.tensor([[4, 5, 6]])
                longer = torch.tensor([[4, 5, 6, 0, 0]])
                with torch.no_grad():
                    a = model(short)
                    b = model(longer)
                return a, b
            """
        ),
        Valid(  # the outputs are only compared: a consistency check, not a hot path
            """
            import torch
            def check_consistency(model, x, y):
                with torch.no_grad():
                    out_x = model(x)
                    out_y = model(y)
                torch.testing.assert_close(out_x, out_y)
            """
        ),
        Valid(  # BatchNorm in training mode: one batched call would normalise over both batches together
            """
            import torch.nn as nn
            net = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4))
            for a, b in loader:
                out_a = net(a)
                out_b = net(b)
                (out_a - out_b).pow(2).mean().backward()
                optimizer.step()
            """
        ),
        Valid(  # two views through a head built with `layers.append(nn.BatchNorm1d(..))`: per-view statistics
            """
            import torch.nn as nn
            class TwoViews(nn.Module):
                def __init__(self, dims):
                    super().__init__()
                    layers = []
                    for d_in, d_out in zip(dims[:-1], dims[1:]):
                        layers.append(nn.Linear(d_in, d_out))
                        layers.append(nn.BatchNorm1d(d_out))
                    self.head = nn.Sequential(*layers)
                def forward(self, v1, v2):
                    z1 = self.head(v1)
                    z2 = self.head(v2)
                    return (z1 - z2).pow(2).mean()
            """
        ),
        Valid(  # a library model (may have BatchNorm) called on two views in training
            """
            import torchvision
            for v1, v2 in loader:
                backbone = torchvision.models.resnet18()
                f1 = backbone(v1)
                f2 = backbone(v2)
                loss = (f1 - f2).pow(2).mean()
                loss.backward()
            """
        ),
        Invalid(  # built from a config, so its class is not visible; but the program's own networks use only linear
            # and LayerNorm layers (no file names BatchNorm or dropout): the policy on observations and their
            # augmented copies, twice per update
            """
            import hydra
            import torch
            import torch.nn as nn
            class Actor(nn.Module):
                def __init__(self, obs_dim, action_dim):
                    super().__init__()
                    self.trunk = nn.Sequential(nn.Linear(obs_dim, 256), nn.LayerNorm(256), nn.Tanh(),
                                               nn.Linear(256, 2 * action_dim))
                def forward(self, obs):
                    return self.trunk(obs)
            class Agent:
                def __init__(self, actor_cfg, device):
                    self.actor = hydra.utils.instantiate(actor_cfg).to(device)
                def update_critic(self, next_obs, next_obs_aug, critic_optimizer):
                    with torch.no_grad():
                        target = self.actor(next_obs)  # error: GPU070
                        target_aug = self.actor(next_obs_aug)
                    loss = (target - target_aug).pow(2).mean()
                    critic_optimizer.zero_grad()
                    loss.backward()
                    critic_optimizer.step()
            """,
        ),
        Valid(  # a discriminator class imported from a library: its definition (BatchNorm?) is not in the program
            """
            import torch
            import torch.nn as nn
            from taming.modules.discriminator.model import NLayerDiscriminator
            class Encoder(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)
            class GANLoss(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.discriminator = NLayerDiscriminator(input_nc=3).apply(init_weights)
                def forward(self, inputs, reconstructions):
                    logits_real = self.discriminator(inputs.detach())
                    logits_fake = self.discriminator(reconstructions.detach())
                    return torch.relu(1. - logits_real).mean() + torch.relu(1. + logits_fake).mean()
            """,
        ),
        Valid(  # a network whose definition is not visible, in a training step: it may have BatchNorm
            """
            def train_step(model, x1, x2, optimizer):
                p1 = model(x1)
                p2 = model(x2)
                loss = (p1 - p2).pow(2).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a reshaping method of the class and a dropout layer are not networks
            """
            import torch.nn as nn
            class Attend(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.proj = nn.Linear(dim, dim)
                    self.drop = nn.Dropout(0.1)
                def split_heads(self, t):
                    return t.view(t.shape[0], -1, 4, t.shape[-1] // 4).transpose(1, 2)
                def forward(self, q, k):
                    qh = self.split_heads(q)
                    kh = self.split_heads(k)
                    a = self.drop(qh)
                    b = self.drop(kh)
                    return self.proj((a @ b.transpose(-1, -2)).flatten(1))
            """
        ),
        Valid(  # a differing literal argument is a setting, not a batch
            """
            import torch
            def embed(model, x):
                with torch.no_grad():
                    small = model(x, 2)
                    large = model(x, 4)
                return small, large
            """
        ),
        Invalid(  # the discriminator on real and on detached generated images, each inside its loss (no rewrite)
            """
            import torch
            import torch.nn as nn
            class Discriminator(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.model = nn.Sequential(nn.Linear(784, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1), nn.Sigmoid())
                def forward(self, img):
                    return self.model(img.view(img.size(0), -1))
            discriminator = Discriminator().cuda()
            for imgs, _ in dataloader:
                real_imgs = imgs.cuda()
                gen_imgs = generator(torch.randn(imgs.size(0), 100, device="cuda"))
                optimizer_D.zero_grad()
                real_loss = adversarial_loss(discriminator(real_imgs), valid)  # error: GPU070
                fake_loss = adversarial_loss(discriminator(gen_imgs.detach()), fake)
                ((real_loss + fake_loss) / 2).backward()
                optimizer_D.step()
            """
        ),
        Invalid(  # a GAN's discriminator step: real, then generated images; `D = D.to(...)` keeps `D` a network
            """
            import torch
            import torch.nn as nn
            D = nn.Sequential(nn.Linear(784, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1), nn.Sigmoid())
            D = D.to("cuda")
            G = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 784), nn.Tanh()).to("cuda")
            d_optimizer = torch.optim.Adam(D.parameters(), lr=0.0002)
            for images, _ in data_loader:
                images = images.reshape(100, -1).to("cuda")
                outputs = D(images)  # error: GPU070
                d_loss_real = criterion(outputs, real_labels)
                fake_images = G(torch.randn(100, 64, device="cuda"))
                outputs = D(fake_images)
                d_loss_fake = criterion(outputs, fake_labels)
                d_optimizer.zero_grad()
                (d_loss_real + d_loss_fake).backward()
                d_optimizer.step()
            """
        ),
        Invalid(  # SAC: the critic on the replay actions, then on fresh policy actions inside `torch.min` and the
            # methods applied to its result (no fix)
            """
            import torch
            import torch.nn as nn
            class Critic(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc1 = nn.Linear(20, 256)
                    self.fc2 = nn.Linear(256, 1)
                def forward(self, s, a):
                    return self.fc2(torch.relu(self.fc1(torch.cat((s, a), -1))))
            class SAC:
                def __init__(self, actor):
                    self.actor = actor
                    self.critic1 = Critic().cuda()
                    self.critic2 = Critic().cuda()
                def update(self, buffer, optimizer, steps):
                    for _ in range(steps):
                        s, a, r = buffer.sample(256)
                        q1 = self.critic1(s, a)
                        q2 = self.critic2(s, a)
                        new_a, log_prob = self.actor.sample(s)
                        q_new = torch.min(self.critic1(s, new_a), self.critic2(s, new_a)).squeeze(-1).float()
                        loss = (q1 - r).pow(2).mean() + (q2 - r).pow(2).mean() + (log_prob - q_new).mean()
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
            """,
            count=2,
        ),
        Invalid(  # the critic handed to the trainer through a keyword dict (`CQL(**kwargs)`), then called on the
            # dataset actions and on random actions for the same observations
            """
            import torch
            import torch.nn as nn
            class QFunction(nn.Module):
                def __init__(self, obs_dim, act_dim):
                    super().__init__()
                    self.net = nn.Sequential(nn.Linear(obs_dim + act_dim, 256), nn.ReLU(), nn.Linear(256, 1))
                def forward(self, obs, act):
                    return self.net(torch.cat([obs, act], -1))
            class CQL:
                def __init__(self, critic, critic_optimizer):
                    self.critic = critic
                    self.critic_optimizer = critic_optimizer
                def train_step(self, obs, actions, target):
                    q_data = self.critic(obs, actions)  # error: GPU070
                    q_random = self.critic(obs, torch.rand_like(actions) * 2 - 1)
                    loss = (q_data - target).pow(2).mean() + q_random.logsumexp(0).mean()
                    self.critic_optimizer.zero_grad()
                    loss.backward()
                    self.critic_optimizer.step()
            def train(buffer, steps):
                critic = QFunction(17, 6).cuda()
                kwargs = {"critic": critic, "critic_optimizer": torch.optim.Adam(critic.parameters(), fused=True)}
                trainer = CQL(**kwargs)
                for _ in range(steps):
                    trainer.train_step(*buffer.sample(256))
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            critic = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
            for obs, next_obs, reward in loader:
                with torch.no_grad():
                    value = critic(obs)
                    next_value = critic(next_obs)
                loss = (reward + next_value - value).pow(2).mean()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            import torch.nn as nn
            critic = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
            for obs, next_obs, reward in loader:
                with torch.no_grad():
                    value, next_value = critic(torch.cat([obs, next_obs])).split([obs.shape[0], next_obs.shape[0]])
                loss = (reward + next_value - value).pow(2).mean()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # through a method that forwards to the network; the second batch prepared in between
            """
            import torch
            import torch.nn as nn
            class Learner:
                def __init__(self):
                    self.net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
                def _evaluate(self, batch):
                    return self.net(batch)
                def update(self, batches, optimizer):
                    for own, other in batches:
                        own_v = self._evaluate(own)
                        other = other.float()
                        other_v = self._evaluate(other)
                        (own_v - other_v).pow(2).mean().backward()
                        optimizer.step()
            """
        ),
        Valid(  # one built-in layer: cat + one lookup + split is no fewer kernels than two lookups
            """
            import torch.nn as nn
            class Boxes(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.x_embed = nn.Embedding(1024, 64)
                    self.head = nn.Linear(64, 2)
                def forward(self, box):
                    left = self.x_embed(box[:, 0])
                    right = self.x_embed(box[:, 2])
                    a = self.head(left)
                    b = self.head(right)
                    return a + b
            """
        ),
        Valid(  # BatchNorm without gradients but in training mode (no `.eval()` seen): still per-batch statistics
            """
            import torch
            import torch.nn as nn
            net = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4))
            for a, b in loader:
                with torch.no_grad():
                    out_a = net(a)
                    out_b = net(b)
                results.append(out_a - out_b)
            """
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ", "PERF"),
        setup=("net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))\n"
               "a = torch.randn(7, 16, requires_grad=True)\nb = torch.randn(5, 16, requires_grad=True)"),
        before="out_a = net(a)\nout_b = net(b)",
        after="out_a, out_b = net(torch.cat([a, b])).split([a.shape[0], b.shape[0]])",
        compare=("out_a", "out_b"),
        options={"rtol": 1e-5, "atol": 1e-6, "train_probe": True},
    )

    def __init__(self, ctx) -> None:  # noqa: ANN001
        super().__init__(ctx)
        self.modules = ModuleResolver(ctx.analysis, program_class_facts(ctx), held_class_facts(ctx))

    # -- where -------------------------------------------------------------------------------

    def _in_scope(self) -> bool:
        if self.ctx.in_hot_region() or self.ctx.in_loop():
            return True
        for node in reversed(self.ctx.ancestors):
            if isinstance(node, cst.With):
                for item in node.items:
                    expr = item.item.func if isinstance(item.item, cst.Call) else item.item
                    if self.ctx.qualname(expr) in _NO_GRAD:
                        return True
            if isinstance(node, cst.FunctionDef):
                return any(self.ctx.qualname(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
                           in _NO_GRAD for d in node.decorators)
        return False

    def _silent_in_training(self, facts: ModuleFacts) -> bool:
        """BatchNorm, dropout, or a definition gpulint cannot see (which may have them): in training mode one
        batched call normalises over / draws randomness for all batches together, a change of method (two
        views in self-supervised learning), not of speed. `torch.no_grad()` does not change that (a momentum
        encoder runs without gradients in training mode); only `.eval()` evidence, already folded into
        `facts`, does."""
        return facts.coupling is not None or not facts.known and self._program_may_couple()

    def _program_may_couple(self) -> bool:
        """Could a network whose definition is not visible here (`hydra.utils.instantiate(cfg)`) couple rows? Yes
        unless the program defines its own networks and no file of it names BatchNorm or dropout or takes networks
        from a model zoo: networks built from linear, convolution and LayerNorm layers alone couple nothing."""
        a = self.ctx.analysis
        defines_networks = bool(a.program_networks) or any(info.is_module for info in a.classes.values())
        return not defines_networks or any(mentions(_COUPLING_TEXT, text) for text in related_texts(self.ctx).values())

    # -- visitors ----------------------------------------------------------------------------

    def _not_worth_merging_here(self) -> bool:
        """Test code, and the forward of a model class that the program compiles: there the calls are part
        of one compiled graph, and merging them was measured to change little while raising peak memory."""
        if is_test_path(self.ctx.path):
            return True
        a = self.ctx.analysis
        fn = next((n for n in reversed(self.ctx.ancestors) if isinstance(n, cst.FunctionDef)), None)
        info = a.enclosing_class(self.ctx.ancestors)
        if fn is None or info is None or not info.is_module:
            return False
        if a.is_compiled(self.ctx.ancestors):
            return True
        in_forward = any(a.hot.get(id(n)) in (HotKind.FORWARD, HotKind.COMPILED) for n in self.ctx.ancestors
                         if isinstance(n, cst.FunctionDef))
        return in_forward and info.node.name.value in CompiledModels.of(a).classes

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        if not any(isinstance(a, cst.FunctionDef) for a in self.ctx.ancestors) and not self.ctx.in_loop():
            return
        if not self._in_scope():
            return
        groups = self._groups(node)
        if groups and not self._not_worth_merging_here():  # the compile check walks the file: only when needed
            for group in groups:
                self._report_group(node, group)

    def visit_Assign(self, node: cst.Assign) -> None:
        """`a_out, b_out = net(a), net(b)` in one statement."""
        if len(node.targets) != 1 or not isinstance(node.value, cst.Tuple) or not self._in_scope():
            return
        target = node.targets[0].target
        elements = node.value.elements
        if len(elements) < 2 or not all(isinstance(e.value, cst.Call) for e in elements):
            return
        calls = [e.value for e in elements]
        first = calls[0]
        assert isinstance(first, cst.Call)
        callee = code_of(first.func)
        if not all(isinstance(c, cst.Call) and code_of(c.func) == callee and not has_star_args(c) for c in calls):
            return
        kind = self._callee_kind(first)
        if kind is None or self._not_worth_merging_here():
            return
        differing = self._differing(calls)  # type: ignore[arg-type]
        if differing is None or not self._feeds_network(first, kind, differing):
            return
        if self._only_checked([target], [node]):
            return
        facts, why_not = self._facts_and_blockers(first, kind, differing, calls)  # type: ignore[arg-type]
        if why_not == _SILENT:
            return
        statement = self.ctx.parent()
        if why_not is None and isinstance(target, cst.Tuple) and len(target.elements) == len(calls) \
                and kind == "module" and facts is not None and facts.outputs == 1 \
                and isinstance(statement, cst.SimpleStatementLine):
            merged = self._merged_call(first, differing, calls)  # type: ignore[arg-type]
            value = cst.parse_expression(f"{merged}.split([{', '.join(self._size(c, differing[0], 'tensor') for c in calls)}])")  # type: ignore[arg-type]
            self.report(node, replacement=node.with_changes(value=value), imports=self._imports)
            return
        self.report(node, note=why_not or "the outputs' structure is not known")

    # -- grouping ----------------------------------------------------------------------------

    def _site(self, statement: cst.BaseStatement) -> _Site | None:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        small = statement.body[0]
        if not isinstance(small, cst.Assign) or len(small.targets) != 1:
            return None
        call = _base_call(small.value)
        if call is None or has_star_args(call) or not isinstance(call.func, (cst.Name, cst.Attribute)):
            return None
        if self._callee_kind(call) is None:
            return None
        template = code_of(small.value.deep_replace(call, cst.Name("__CALL__"))) if small.value is not call else "__CALL__"
        return _Site(statement, small, call, template, indexed=isinstance(small.value, cst.Subscript))

    def _sites(self, statement: cst.BaseStatement) -> list[_Site]:
        """The network calls of a statement: the one its assignment is built on, or the network calls passed
        straight to another call (`q_new = torch.min(self.q1(s, a), self.q2(s, a))`)."""
        site = self._site(statement)
        if site is not None:
            return [site]
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return []
        small = statement.body[0]
        if not isinstance(small, cst.Assign) or len(small.targets) != 1 or not isinstance(small.value, cst.Call):
            return []
        inner = _calls_passed_to(small.value)
        return [_Site(statement, small, call, "__NESTED__", nested=True) for call in inner
                if not has_star_args(call) and isinstance(call.func, (cst.Name, cst.Attribute))
                and self._callee_kind(call) is not None]

    def _groups(self, block: cst.IndentedBlock) -> list[list[_Site]]:
        if not _repeats_a_callee(block):
            return []  # most blocks: no two assignments call the same thing, nothing to group
        groups: list[list[_Site]] = []
        open_groups: dict[str, list[_Site]] = {}
        assigned_since: dict[str, set[str]] = {}
        derived: dict[str, set[str]] = {}  # names computed from the group's outputs so far
        for statement in block.body:
            sites = self._sites(statement)
            if not sites:
                if _is_barrier(self.ctx.analysis, statement):
                    groups.extend(g for g in open_groups.values() if len(g) > 1)
                    open_groups, assigned_since, derived = {}, {}, {}
                    continue
                for key in assigned_since:
                    assigned = _assigned(statement)
                    assigned_since[key] |= assigned
                    if dotted_in(statement) & derived[key]:
                        derived[key] |= assigned
                continue
            for site in sites:
                self._place(site, statement, groups, open_groups, assigned_since, derived)
        groups.extend(g for g in open_groups.values() if len(g) > 1)
        return groups

    def _place(self, site: _Site, statement: cst.BaseStatement, groups: list[list[_Site]],
               open_groups: dict[str, list[_Site]], assigned_since: dict[str, set[str]],
               derived: dict[str, set[str]]) -> None:
        """Add a site to the open group of its callee (a nested call joins a group of any statement shape), or
        close that group and open another when the site reads the group's outputs or repeats a call."""
        key = self._key(site)
        if site.nested:
            key = next((k for k in open_groups if k.startswith(key)), key)
        group = open_groups.get(key)
        if group is not None:
            uses = dotted_in(site.call)
            texts = {code_of(s.call) for s in group}
            if uses & derived[key] or code_of(site.call) in texts:
                if len(group) > 1:
                    groups.append(group)
                group = None
            elif uses & assigned_since[key]:
                # its batch is prepared after the first call, but not from its outputs (`policy_d =
                # net(a)`, `b = load()`, `expert_d = net(b)`): mergeable once the preparation moves up
                site.prepared_between = True
        if group is None:
            open_groups[key] = [site]
            assigned_since[key] = set()
            derived[key] = set()
        else:
            group.append(site)
        for other in assigned_since:
            assigned_since[other] |= _assigned(statement)
        derived[key] |= _assigned(statement)

    def _key(self, site: _Site) -> str:
        """Callee, keywords and positional count (the statements' shapes may differ: `q = net(s, a)`,
        `q2 = net(s, pi).squeeze(1)`; such a group is reported without a rewrite)."""
        call = site.call
        keywords = sorted((a.keyword.value, code_of(a.value)) for a in call.args if a.keyword is not None)
        positional = sum(1 for a in call.args if a.keyword is None)
        callee = call.func
        if isinstance(callee, cst.Attribute) and callee.attr.value == "forward" \
                and self.modules.of_callee(callee, self.ctx.ancestors) is not None:
            callee = callee.value  # `q(s2, a2)` and `q.forward(s, a)` are one network's forwards
        return f"{code_of(callee)}|{keywords}|{positional}"

    # -- reporting a group ---------------------------------------------------------------------

    def _report_group(self, block: cst.IndentedBlock, group: list[_Site]) -> None:
        calls = [s.call for s in group]
        differing = self._differing(calls)
        if differing is None:
            return
        kind = self._callee_kind(calls[0])
        assert kind is not None
        if not self._feeds_network(calls[0], kind, differing):
            return
        if self._only_checked([s.assign.targets[0].target for s in group], [s.statement for s in group]):
            return
        facts, why_not = self._facts_and_blockers(calls[0], kind, differing, calls)
        if why_not == _SILENT:
            return
        if why_not is None and any(s.prepared_between for s in group):
            why_not = "a later batch is prepared between the calls; move its preparation above the first call"
        if why_not is None and any(s.nested for s in group):
            why_not = "a call is an argument of another expression (`torch.min(q1(s, a), ...)`); merge by hand"
        if why_not is None and any(s.indexed for s in group):
            why_not = "an output is indexed where it is computed (`net(s)[rows, actions]`); merge by hand"
        if why_not is None and len({s.template for s in group}) > 1:
            why_not = "the calls' results are used differently (one is reshaped or indexed); merge by hand"
        if why_not is None:
            why_not = self._between_blockers(block, group, differing)
        replacement = None
        if why_not is None:
            replacement, why_not = self._rewrite(block, group, differing, kind, facts)
        if replacement is None:
            self.report(group[0].statement, note=why_not)
            return
        self.report(group[0].statement, replacements=[replacement], imports=self._imports)

    @property
    def _imports(self):  # noqa: ANN202
        return self._torch_imports

    def _differing(self, calls: Sequence[cst.Call]) -> list[int] | None:
        """Positions of the positional arguments that differ between the calls (the batches)."""
        positional = [[a for a in c.args if a.keyword is None] for c in calls]
        if len({len(p) for p in positional}) != 1 or not positional[0]:
            return None
        keywords = [sorted((a.keyword.value, code_of(a.value)) for a in c.args if a.keyword is not None) for c in calls]
        if any(k != keywords[0] for k in keywords):
            return None
        differing = [i for i in range(len(positional[0])) if len({code_of(p[i].value) for p in positional}) > 1]
        if not differing:
            return None
        if any(_is_constant(p[i].value) for p in positional for i in differing):
            return None  # `f(x, 6)` and `f(y, 3)`: a differing setting, not a batch
        for i in differing:
            # `net(self.src_embed(src))`, `net(self.tgt_embed(tgt))`: different kinds of data (other shapes); a
            # batch detached or cast (`D(real)`, `D(fake.detach())`) is the same kind, and so is one produced
            # beside one passed in (`q(s, policy(s))`, `q(s, acts)`)
            values = [_shape_kept(p[i].value) for p in positional]
            if len({code_of(v.func) for v in values if isinstance(v, cst.Call)}) > 1:
                return None
        # the same batch twice (`net(x)` and `net(x)`) is a different problem
        texts = [tuple(code_of(p[i].value) for i in differing) for p in positional]
        if len(set(texts)) != len(texts):
            return None
        if any(self._other_shapes([p[i].value for p in positional]) for i in differing):
            return None
        return differing

    def _other_shapes(self, values: list[cst.BaseExpression]) -> bool:
        """Are the batches known to differ beyond the batch dimension, so `torch.cat` would fail? `x` and
        `x[:, :n]`, `x[..., 1:]` and `x[..., :2]`, `torch.tensor([[1, 2]])` and `torch.tensor([[1, 2, 3]])`."""
        resolved = [self._single_value(v) for v in values]
        if len({_beyond_batch(v) for v in resolved}) > 1:
            return True
        shapes = [_literal_shape(self.ctx.analysis, v) for v in resolved]
        known = [shape for shape in shapes if shape is not None]
        return any(_shapes_differ(x, y) for i, x in enumerate(known) for y in known[i + 1:])

    def _single_value(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """`short` -> the value of its one reaching assignment (`torch.tensor(...)`, `text[:, :n]`)."""
        if isinstance(node, cst.Name):
            bindings = self.ctx.analysis.reaching_bindings(node.value, self.ctx.ancestors)
            if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN and bindings[0].value is not None:
                return bindings[0].value
        return node

    def _only_checked(self, targets: Sequence[cst.BaseExpression], statements: Sequence[cst.CSTNode]) -> bool:
        """The outputs only feed assertions or `allclose`-style comparisons (a consistency check)."""
        fn = next((n for n in reversed(self.ctx.ancestors) if isinstance(n, cst.FunctionDef)), None)
        names = {n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)}
        return _only_asserted(self.ctx.analysis, fn, names, statements)

    def _feeds_network(self, call: cst.Call, kind: str, differing: list[int]) -> bool:
        """For a wrapper function: does a differing argument reach the network call inside it? (`test(model,
        data, mask_train)` and `test(model, data, mask_val)` run the same batch; the mask only selects outputs.)"""
        if kind != "wrapper":
            return True
        fn = self.ctx.analysis.functions[dotted_name(call.func) or ""][0]
        params = [p.name.value for p in fn.params.params]
        if any(i < len(params) and params[i] in _module_params(self.ctx.analysis, fn) for i in differing):
            return False  # `penalty(D_A, ...)`, `penalty(D_B, ...)`: different networks
        tracked = {params[i] for i in differing if i < len(params)}
        networks = _module_params(self.ctx.analysis, fn)
        for node in walk(fn.body):
            if isinstance(node, cst.Assign) and names_in(node.value) & tracked:
                tracked |= {n.value for t in node.targets for n in walk(t.target) if isinstance(n, cst.Name)}
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in networks \
                    and any(names_in(arg.value) & tracked for arg in node.args):
                return True
        return False

    def _callee_kind(self, call: cst.Call) -> str | None:
        """'module' for a network, 'wrapper' for a same-file function that runs one, None otherwise."""
        func = call.func
        if isinstance(func, cst.Name) and func.value in self.ctx.analysis.functions:
            defs = self.ctx.analysis.functions[func.value]
            bindings = self.ctx.analysis.bindings_of(func.value, self.ctx.ancestors)
            if len(defs) == 1 and bindings and all(b.kind is BindingKind.OTHER for b in bindings) \
                    and _wraps_module(self.ctx.analysis, defs[0]):
                return "wrapper"
            return None
        if self._forwarded(call) is not None:
            return "method"
        facts = self.modules.of_callee(func, self.ctx.ancestors)
        if facts is not None:
            return None if facts.loss or not facts.parametric or facts.single_layer else "module"
        if isinstance(func, (cst.Name, cst.Attribute)):
            last = func.value if isinstance(func, cst.Name) else func.attr.value
            if MODULE_NAME.search(last):
                bindings = self.ctx.analysis.bindings_of(last, self.ctx.ancestors) if isinstance(func, cst.Name) else []
                if all(b.kind is BindingKind.PARAM for b in bindings):
                    return "module"
        return None

    def _forwarded(self, call: cst.Call) -> cst.Call | None:
        """For `self._evaluate(batch)` whose method body is `return self.net(batch)` (its first parameter passed
        first) with `self.net` a network: that inner call. None for anything else."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
            return None
        info = self.ctx.analysis.enclosing_class(self.ctx.ancestors)
        if info is None:
            return None
        method = next((n for n in info.node.body.body if isinstance(n, cst.FunctionDef)  # type: ignore[union-attr]
                       and n.name.value == func.attr.value), None)
        if method is None or len(method.params.params) < 2 or not isinstance(method.body, cst.IndentedBlock):
            return None
        statements = [st for st in method.body.body if not (isinstance(st, cst.SimpleStatementLine) and isinstance(
            st.body[0], cst.Expr) and isinstance(st.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))]
        if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
            return None
        returned = statements[0].body[0]
        inner = returned.value if isinstance(returned, cst.Return) else None
        if not isinstance(inner, cst.Call) or not isinstance(inner.func, cst.Attribute) or inner.func is func \
                or not isinstance(inner.func.value, cst.Name) or inner.func.value.value != "self":
            return None
        first = method.params.params[1].name.value
        if not inner.args or inner.args[0].keyword is not None or dotted_name(inner.args[0].value) != first:
            return None
        facts = self.modules.of_callee(inner.func, self.ctx.ancestors)
        if facts is None and not MODULE_NAME.search(inner.func.attr.value):
            return None
        if facts is not None and (facts.loss or not facts.parametric or facts.single_layer):
            return None
        return inner

    def _facts_and_blockers(self, call: cst.Call, kind: str, differing: list[int],
                            calls: Sequence[cst.Call]) -> tuple[ModuleFacts | None, str | None]:
        if kind == "method":  # `self._evaluate(a)`, `self._evaluate(b)`: judged by the network it forwards to
            inner = self._forwarded(call)
            assert inner is not None
            facts, why_not = self._facts_and_blockers(inner, "module", differing, calls)
            return facts, why_not or (f"the calls go through `{code_of(call.func)}`: concatenate the batches and "
                                      f"call it once, then split its outputs")
        if kind == "wrapper":
            fn = self.ctx.analysis.functions[dotted_name(call.func) or ""][0]
            if len(differing) != 1:
                return None, "more than one argument differs between the calls"
            module_args = _module_params(self.ctx.analysis, fn)
            params = [p.name.value for p in fn.params.params]
            positional = [a for a in call.args if a.keyword is None]
            if isinstance(fn.params.star_arg, cst.Param) or len(positional) > len(params):
                return None, "the wrapper takes variable arguments"
            batch_param = params[differing[0]]
            issue = _wrapper_issue(self.ctx.analysis, fn, batch_param, self.modules)
            if issue:
                return None, f"`{fn.name.value}` is not row by row in `{batch_param}`: {issue}"
            facts: ModuleFacts | None = None
            for index, param in enumerate(params):
                if param in module_args and index < len(positional):
                    found = self.modules.of_expression(positional[index].value, self.ctx.ancestors) or UNKNOWN
                    found = self._eval_mode(positional[index].value, found)
                    facts = found if facts is None else facts.merge(found)
            if facts is None:
                return None, f"`{fn.name.value}` does not receive the network as an argument"
            if self._silent_in_training(facts):
                return None, _SILENT
            reason = self._coupling_reason(facts, positional[[i for i, p in enumerate(params) if p in module_args][0]].value)
            return ModuleFacts(outputs=returns_arity(fn)), reason
        facts = self.modules.of_callee(call.func, self.ctx.ancestors) or UNKNOWN
        facts = self._eval_mode(call.func, facts)
        if self._silent_in_training(facts):
            return facts, _SILENT
        if facts.blocker:
            return facts, f"not batchable: {facts.blocker}"
        if facts.cross_row:
            return facts, f"not batchable: the network's forward has {facts.cross_row}"
        if facts.shaped:
            return facts, (f"the network has {facts.shaped}: `torch.cat` needs every dimension but the batch to "
                           f"match, which gpulint cannot check")
        positional = [a for a in call.args if a.keyword is None]
        if len(differing) != len(positional):
            return facts, "some positional arguments are shared between the calls; they may be batch-shaped"
        return facts, self._coupling_reason(facts, call.func)

    def _coupling_reason(self, facts: ModuleFacts, module: cst.BaseExpression) -> str | None:
        text = cst.Module(body=[]).code_for_node(module)
        if facts.blocker:
            return f"not batchable: {facts.blocker}"
        if facts.coupling:
            return (f"`{text}` has {facts.coupling}, which in training mode couples the rows of one batch "
                    f"(one call would normalise over / draw randomness for both batches together)")
        if not facts.known:
            return (f"the definition of `{text}` is not visible; if it has BatchNorm or dropout, one batched "
                    f"call changes results in training mode (if this is evaluation, call `.eval()` on it first)")
        return None

    def _eval_mode(self, module: cst.BaseExpression, facts: ModuleFacts) -> ModuleFacts:
        """Training-mode coupling does not matter when `<module>.eval()` provably ran before in this function
        and nothing in the function switches it back with `.train()`."""
        fn = next((a for a in reversed(self.ctx.ancestors) if isinstance(a, cst.FunctionDef)), None)
        if fn is None:
            return facts
        text = code_of(module)
        here = self.ctx.analysis.statement_order(self.ctx.ancestors)
        order = self.ctx.analysis.order
        evals, trains, current = [], [], 0
        for node in walk(fn.body):
            current = order.get(id(node), current)
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and code_of(node.func.value) == text:
                name = node.func.attr.value
                if name == "eval" or (name == "train" and node.args and is_false(node.args[0].value)):
                    evals.append(current)
                elif name == "train":
                    trains.append(current)
        if evals and min(evals) < here and not trains:
            return ModuleFacts(True, None, facts.blocker, facts.cross_row, facts.outputs)
        return facts

    def _between_blockers(self, block: cst.IndentedBlock, group: list[_Site], differing: list[int]) -> str | None:
        body = list(block.body)
        first = body.index(group[0].statement)
        for site in group[1:]:
            at = body.index(site.statement)
            inputs = set().union(*(dotted_in(a.value) for a in site.call.args))
            outputs = dotted_in(site.assign.targets[0].target)
            for statement in body[first + 1:at]:
                if statement in [s.statement for s in group]:
                    continue
                if _assigned(statement) & inputs or _mutated(statement) & inputs:
                    return "an argument of a later call is changed between the calls"
                if dotted_in(statement) & outputs:
                    return "a statement between the calls uses a name the later call assigns"
        return None

    # -- the rewrite ---------------------------------------------------------------------------

    def _rewrite(self, block: cst.IndentedBlock, group: list[_Site], differing: list[int], kind: str,
                 facts: ModuleFacts | None) -> tuple[tuple[cst.CSTNode, cst.CSTNode] | None, str | None]:
        calls = [s.call for s in group]
        targets = [s.assign.targets[0].target for s in group]
        if not all(_simple_target(t) for t in targets):
            return None, "a call's result is not assigned to plain names"
        arity = {len(t.elements) if isinstance(t, (cst.Tuple, cst.List)) else 1 for t in targets}
        if len(arity) != 1:
            return None, "the calls unpack their results differently"
        k = arity.pop()
        outputs = facts.outputs if facts is not None else None
        if outputs is not None and outputs != k:
            return None, "the network's output structure does not match the assignment"
        if outputs is None and k == 1:
            return None, "the network's output structure is not known (tensor, tuple or dict?)"
        if k > 1 and group[0].template != "__CALL__":
            return None, "a method is applied to a tuple result"
        batch_kind = self._batch_kind(calls, differing[0], kind)
        if batch_kind is None:
            return None, "cannot tell whether the batches are tensors or Python lists"
        for call in calls:
            for i in differing:
                value = [a for a in call.args if a.keyword is None][i].value
                if not _cheap(value):
                    return None, "a batch argument is an expression that would be evaluated twice"
        if kind == "wrapper" and batch_kind == "tensor":
            batch_kind = "tensor-sliced"
        if k == 1 and batch_kind != "tensor":
            return None, "a single output of a wrapper function cannot be split without a temporary"
        merged = self._merged_call(calls[0], differing, calls, batch_kind)
        sizes = [self._size(c, differing[0], batch_kind) for c in calls]
        if k == 1:
            value_code = cst.Module(body=[]).code_for_node(group[0].assign.value.deep_replace(
                calls[0], cst.parse_expression(merged)))
            target_code = ", ".join(cst.Module(body=[]).code_for_node(t) for t in targets)
            new_code = f"{target_code} = {value_code}.split([{', '.join(sizes)}])"
            if len(new_code) > _WRAP_AT:
                new_code = f"{target_code} = {value_code}.split(\n    [{', '.join(sizes)}]\n)"
        else:
            per_output = [[cst.Module(body=[]).code_for_node(t.elements[j].value) for t in targets]  # type: ignore[union-attr]
                          for j in range(k)]
            target_code = ", ".join(f"({', '.join(names)})" for names in per_output)
            var = _fresh_name(self.ctx.analysis, calls, ("out", "part", "chunk", "piece"))
            if batch_kind == "tensor":
                split = f"{var}.split([{', '.join(sizes)}])"
            else:
                bounds = [" + ".join(sizes[:i]) for i in range(1, len(sizes))]
                pieces = [f"{var}[:{bounds[0]}]"] + [f"{var}[{bounds[i]}:{bounds[i + 1]}]" for i in range(len(bounds) - 1)] \
                    + [f"{var}[{bounds[-1]}:]"]
                split = f"({', '.join(pieces)})"
            new_code = f"{target_code} = ({split} for {var} in {merged})"
            if len(new_code) > _WRAP_AT:
                new_code = f"{target_code} = (\n    {split} for {var} in {merged}\n)"
        try:
            new_small = cst.parse_statement(new_code + "\n")
        except cst.ParserSyntaxError:
            return None, "could not build the rewrite"
        assert isinstance(new_small, cst.SimpleStatementLine)
        first = group[0].statement
        merged_statement = first.with_changes(body=[new_small.body[0]])
        removed = {id(s.statement) for s in group[1:]}
        body: list[cst.BaseStatement] = []
        carry: list[cst.EmptyLine] = []
        for statement in block.body:
            if id(statement) in removed:
                carry.extend(statement.leading_lines)
                continue
            if statement is first:
                statement = merged_statement
            if carry:
                statement = statement.with_changes(leading_lines=[*carry, *statement.leading_lines])
                carry = []
            body.append(statement)
        if carry:
            return None, "the last call of the group ends the block"
        owner = rebuild_owner(self.ctx.ancestors, block, body)
        if owner is None:
            return None, "the calls are not inside a function or loop"
        return owner, None

    def _batch_kind(self, calls: Sequence[cst.Call], position: int, kind: str) -> str | None:
        kinds = set()
        evidence = self.ctx.evidence
        for call in calls:
            value = [a for a in call.args if a.keyword is None][position].value
            if _is_list(self.ctx.analysis, self.ctx.ancestors, value):
                kinds.add("list")
            elif evidence.is_tensor(value) or kind == "module":  # what a network is called on is a tensor
                kinds.add("tensor")
            else:
                return None
        return kinds.pop() if len(kinds) == 1 else None

    def _merged_call(self, call: cst.Call, differing: list[int], calls: Sequence[cst.Call],
                     batch_kind: str = "tensor") -> str:
        cat, imports = self.ctx.spell("torch.cat")
        self._torch_imports = imports if batch_kind != "list" else ()
        positional_index = -1
        args = []
        for arg in call.args:
            if arg.keyword is None:
                positional_index += 1
                if positional_index in differing:
                    values = [cst.Module(body=[]).code_for_node(
                        [a for a in c.args if a.keyword is None][positional_index].value) for c in calls]
                    args.append(" + ".join(values) if batch_kind == "list" else f"{cat}([{', '.join(values)}])")
                    continue
            args.append(cst.Module(body=[]).code_for_node(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT)).strip())
        return f"{cst.Module(body=[]).code_for_node(call.func)}({', '.join(args)})"

    def _size(self, call: cst.Call, position: int, batch_kind: str) -> str:
        value = cst.Module(body=[]).code_for_node([a for a in call.args if a.keyword is None][position].value)
        return f"len({value})" if batch_kind == "list" else f"{value}.shape[0]"

    _torch_imports: tuple = ()


# ---------------------------------------------------------------------------------------------
# helpers of the rule


def _is_constant(node: cst.BaseExpression) -> bool:
    """Literal numbers, strings, `True`/`False`/`None` and tuples of them: settings, never batches."""
    if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString,
                         cst.FormattedString)):
        return True
    if isinstance(node, cst.UnaryOperation):
        return _is_constant(node.expression)
    if isinstance(node, cst.Name):
        return node.value in ("True", "False", "None")
    if isinstance(node, (cst.Tuple, cst.List)):
        return bool(node.elements) and all(_is_constant(e.value) for e in node.elements)
    return False


def _calls_passed_to(value: cst.Call) -> list[cst.Call]:
    """The calls passed straight to a call, also under methods applied to its result:
    `torch.min(q1(s, pi), q2(s, pi)).squeeze(1).to(device)` -> `q1(s, pi)`, `q2(s, pi)`."""
    while isinstance(value.func, cst.Attribute) and isinstance(value.func.value, cst.Call):
        value = value.func.value
    return [a.value for a in value.args if not a.star and isinstance(a.value, cst.Call)]


def _repeats_a_callee(block: cst.IndentedBlock) -> bool:
    """A cheap pre-check for _groups: two single-target assignments whose values call the same dotted name."""
    seen: set[str] = set()
    for statement in block.body:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            continue
        small = statement.body[0]
        if not isinstance(small, cst.Assign) or len(small.targets) != 1:
            continue
        call = _base_call(small.value)
        calls = [call] if call is not None else []
        if isinstance(small.value, cst.Call):  # the calls passed straight to another call, too
            calls += _calls_passed_to(small.value)
        for call in calls:
            callee = dotted_name(call.func) or code_of(call.func)
            callee = callee[:-len(".forward")] if callee.endswith(".forward") else callee  # `net.forward(x)`: `net`
            if callee in seen:
                return True
            seen.add(callee)
    return False


def _base_call(value: cst.BaseExpression) -> cst.Call | None:
    """`net(x)` in `net(x)`, `net(x).squeeze(-1)`, `net(x).float().softmax(-1)`, `net(x)[rows, actions]`."""
    if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Call) \
            and isinstance(value.value.func, (cst.Name, cst.Attribute)):
        return value.value
    node = value
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Call):
        node = node.func.value
    if isinstance(node, cst.Call) and isinstance(node.func, (cst.Name, cst.Attribute)):
        if node is not value and method_name(value) not in ("squeeze", "float", "softmax", "log_softmax", "sigmoid",
                                                             "tanh", "detach", "flatten", "relu", "exp"):
            return None
        if node is not value:
            # every method in the chain must be row-wise with a non-zero dim
            current = value
            while current is not node:
                assert isinstance(current, cst.Call) and isinstance(current.func, cst.Attribute)
                name = current.func.attr.value
                if name in ("squeeze", "softmax", "log_softmax", "flatten"):
                    dim = current.args[0].value if current.args else None
                    if int_value(dim) in (None, 0):
                        return None
                elif name not in ("float", "sigmoid", "tanh", "detach", "relu", "exp"):
                    return None
                current = current.func.value  # type: ignore[assignment]
        return node
    return None


def _assigned(statement: cst.CSTNode) -> set[str]:
    found: set[str] = set()
    for node in walk(statement):
        targets: list[cst.BaseExpression] = []
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, (cst.For, cst.CompFor)):
            targets = [node.target]
        elif isinstance(node, cst.NamedExpr):
            targets = [node.target]
        elif isinstance(node, cst.AsName):
            targets = [node.name]  # type: ignore[list-item]
        for target in targets:
            for inner in walk(target):
                if isinstance(inner, cst.Name):
                    found.add(inner.value)
                dotted = dotted_name(inner) if isinstance(inner, cst.Attribute) else None
                if dotted:
                    found.add(dotted)
    return found


def _mutated(statement: cst.CSTNode) -> set[str]:
    """Names changed in place: `x[...] = v`, `x.add_(..)`."""
    found: set[str] = set()
    for node in walk(statement):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Subscript):
                    found |= dotted_in(target.target.value)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value.endswith("_") \
                and not node.func.attr.value.startswith("_"):
            found |= dotted_in(node.func.value)
    return found


def _is_barrier(a: FileAnalysis, statement: cst.CSTNode) -> bool:
    for call in iter_calls(statement):
        if method_name(call) in _BARRIER_METHODS or a.call_qualname(call) in _BARRIER_FUNCTIONS:
            return True
    return isinstance(statement, (cst.Return, cst.Raise)) or any(
        isinstance(n, (cst.Return, cst.Raise, cst.Break, cst.Continue, cst.Yield)) for n in walk(statement))


def _simple_target(target: cst.BaseExpression) -> bool:
    if isinstance(target, (cst.Tuple, cst.List)):
        return all(not isinstance(e, cst.StarredElement) and _simple_target(e.value) and
                   not isinstance(e.value, (cst.Tuple, cst.List)) for e in target.elements)
    return isinstance(target, cst.Name) or (isinstance(target, cst.Attribute) and dotted_name(target) is not None)


def _cheap(node: cst.BaseExpression) -> bool:
    """Names, attribute paths and constant basic indexing: evaluating twice costs nothing and changes nothing."""
    if isinstance(node, cst.Name) or (isinstance(node, cst.Attribute) and dotted_name(node)):
        return True
    if isinstance(node, cst.Subscript) and _cheap(node.value):
        for element in node.slice:
            inner = element.slice
            if isinstance(inner, cst.Index) and not isinstance(inner.value, (cst.Integer, cst.Name, cst.Ellipsis)):
                return False
            if isinstance(inner, cst.Slice) and not all(
                    part is None or isinstance(part, (cst.Integer, cst.UnaryOperation, cst.Name))
                    for part in (inner.lower, inner.upper, inner.step)):
                return False
        return True
    return False


def _is_list_value(value: cst.BaseExpression) -> bool:
    if isinstance(value, (cst.List, cst.ListComp)):
        return True
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in ("list", "sorted")


def _is_list(a: FileAnalysis, ancestors: Sequence[cst.CSTNode], node: cst.BaseExpression) -> bool:
    if _is_list_value(node):
        return True
    if isinstance(node, cst.Name):
        bindings = a.reaching_bindings(node.value, ancestors)
        return bool(bindings) and all(b.kind is BindingKind.ASSIGN and b.value is not None and _is_list_value(b.value)
                                      for b in bindings)
    return False


def _fresh_name(a: FileAnalysis, calls: Sequence[cst.CSTNode], choices: Sequence[str]) -> str:
    used = set().union(*(names_in(c) for c in calls))
    for choice in choices:
        if choice not in used:
            return choice
    return "_out"


def _module_params(a: FileAnalysis, fn: cst.FunctionDef) -> set[str]:
    """The parameter of `fn` it calls first: the network it wraps (a later `criterion(out, y)` is not)."""
    params = {p.name.value for p in fn.params.params}
    for node in walk(fn.body):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in params:
            return {node.func.value}
    return set()


def _wraps_module(a: FileAnalysis, fn: cst.FunctionDef) -> bool:
    if not _module_params(a, fn):
        return False
    for decorator in fn.decorators:
        target = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
        if a.qualname(target) not in _NO_GRAD:
            return False
    return True


def _wrapper_issue(a: FileAnalysis, fn: cst.FunctionDef, batch_param: str, modules: ModuleResolver) -> str | None:
    """Is `fn` row by row in `batch_param`? Only assignments and one return; values derived from the batch
    flow through stacking, the network and row-wise operations."""
    module_params = _module_params(a, fn)
    tracked = {batch_param}
    statements = list(fn.body.body)
    if statements and isinstance(statements[0], cst.SimpleStatementLine) and isinstance(statements[0].body[0], cst.Expr) \
            and isinstance(statements[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        statements = statements[1:]

    def is_tracked(node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Name) and node.value in tracked

    resolver = _WrapperModules(modules, module_params)
    for statement in statements:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return "it has control flow"
        small = statement.body[0]
        check = RowCheck(a, [fn], is_tracked, True, resolver, allow_stacking=True)  # type: ignore[arg-type]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            issue = check.issue(small.value)
            if issue:
                return issue
            if check.touches(small.value):
                for inner in walk(small.targets[0].target):
                    if isinstance(inner, cst.Name):
                        tracked.add(inner.value)
        elif isinstance(small, cst.Return) and small.value is not None:
            return check.issue(small.value)
        else:
            return "it has statements other than assignments"
    return "it does not return"


class _WrapperModules:
    """ModuleResolver stand-in inside a wrapper: its network parameters count as visible modules."""

    def __init__(self, modules: ModuleResolver, params: set[str]) -> None:
        self.modules = modules
        self.params = params

    def of_callee(self, callee: cst.BaseExpression, ancestors: Sequence[cst.CSTNode]) -> ModuleFacts | None:
        if isinstance(callee, cst.Name) and callee.value in self.params:
            return ModuleFacts()
        return self.modules.of_callee(callee, ancestors)
