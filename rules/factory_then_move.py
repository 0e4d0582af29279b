from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import (LEGACY_HOST_TENSOR, BindingKind, call_arg, dotted_name, is_numeric_literal,
                              legacy_sized_allocation, method_name, walk)
from gpulint.builders import add_keyword
from gpulint.rule import is_test_path
from gpulint.semantic import vocab
from gpulint.semantic.placement import DEVICE, TENSOR, Placement, amortised, last_name, variable_content

# Same values wherever they are computed (H200, torch 2.11: CPU-then-copy vs created on the GPU, torch.equal).
_EXACT = {"zeros", "ones", "full", "empty", "eye"}
# A dtype passed to `.to(D, dtype)` can move into these without changing any value (0 and 1 are exact in
# every dtype; `empty` has no values). Not `full`: fp32 rounding then a cast can differ from direct rounding.
_DTYPE_FOLDABLE = {"zeros", "ones", "empty", "eye"}
# Computed by a different kernel on the GPU: float arange / logspace differed in the last bits (H200).
_KERNEL_DEPENDENT = {"arange", "linspace", "logspace"}
# Drawn from the default generator of the device they are created on (`rand*` / `randn*` generally).
_RANDOM = {"rand", "randn", "randint", "randperm", "normal"}
_SIZED = {"zeros", "ones", "empty", "rand", "randn"}  # factories whose positional arguments are the shape
# functions and methods that keep a factory's values exact on any device: `torch.tril(torch.ones(n, n))`
_TRIANGLES = frozenset({"torch.tril", "torch.triu"})
_IN_PLACE_FILLS = frozenset({"uniform_", "normal_", "bernoulli_", "exponential_", "random_", "fill_", "zero_"})
_CASTS = frozenset({"type", "float", "long", "bool", "byte", "int", "half", "double"})
_TINY = 1024  # elements: a one-off tensor this small costs microseconds wherever it is made
# Not reported: the `*_like` factories (`zeros_like(x)`, `randn_like(x)`) create the tensor on `x`'s device,
# which is usually the target already, and `bernoulli`, `multinomial`, `poisson` sample from an input tensor
# on its device and take no `device=`.
_INTEGER_DTYPES = {"long", "int64", "int", "int32", "int16", "short", "int8", "uint8", "bool"}
# methods between a factory's tensor and its move that keep it where it is: `alpha.expand_as(x).to(x.device)`
_SHAPE_ONLY = {"expand", "expand_as", "view", "view_as", "reshape", "unsqueeze", "squeeze", "t", "float", "double",
               "half", "long", "int", "bool", "contiguous", "repeat"}
# out-of-place writes a chain may make before the move (`torch.zeros(1, n).scatter(1, index, 1.0)`)
_HOST_CHAIN_WRITES = frozenset({"scatter", "index_fill", "masked_fill", "fill_diagonal_", "tril", "triu"})
# elementwise functions and methods that keep a CPU tensor on the CPU (a sinusoidal embedding's frequencies)
_ELEMENTWISE = frozenset(f"torch.{f}" for f in ("exp", "log", "sin", "cos", "sqrt", "rsqrt", "pow", "exp2", "log2",
                                                  "log10", "reciprocal", "sigmoid", "tanh", "abs", "neg", "outer"))
# calls that give a Python number, an operand that keeps arithmetic on the host
_NUMBER_CALLS = frozenset({"len", "int", "float", "round", "abs", "min", "max", "torch.distributed.get_rank",
                           "torch.distributed.get_world_size"})
_SIZE_METHODS = frozenset({"size", "numel", "dim", "item", "get_rank", "get_world_size"})
_ELEMENTWISE_METHODS = frozenset({"exp", "log", "sin", "cos", "sqrt", "rsqrt", "pow", "reciprocal", "mul", "div",
                                  "add", "sub", "neg", "abs", "outer"})
_DEVICE_NAME = re.compile(r"(^|[._])(device|dev|cuda|gpu)$|^(local_)?rank$", re.I)


# a factory moved to the forward's input (an example, before its fix)
_MOVED_TO_INPUT = """
            import torch
            from torch import nn
            model_device = torch.device("cuda")
            class Discriminator(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(64, 1)
                def forward(self, x):
                    penalty = torch.zeros(1).to(x)
                    return self.fc(x) + penalty
            """


class FactoryThenMove(Rule):
    """
    ## What it does
    Finds tensors created on the CPU and moved right away: `torch.zeros(n).cuda()`,
    `torch.ones(b, d).to(device)`, `torch.randn(shape).to(device)`, or moved by indexing a GPU tensor with
    them in the step (`pmfs[torch.arange(n), actions]`, which copies the index to the GPU and waits). Also
    noise drawn in the step from a `torch.distributions` object whose parameters are Python numbers
    (`Normal(0, 1).sample(shape).to(device)`): it is drawn on the CPU and copied (reported without a fix).
    The factory may sit inside an exact triangle (`torch.tril(torch.ones(n, n)).to(device)`, fixed by
    creating the inner factory on the device) or behind a cast (`torch.ones(n, n).type(torch.ByteTensor).to(
    device)`), and may be a legacy constructor filled in place (`torch.FloatTensor(shape).uniform_(a, b).to(
    device)`); these last two are reported without a fix.

    ## Why is this slow
    The tensor is allocated and filled in host memory, then copied to the GPU with a blocking pageable copy
    (plus a second allocation). Creating it on the target device costs one kernel launch and no transfer.
    The PyTorch tuning guide: "Create tensors directly on the target device".

    ## Example
    ```python
    mask = torch.ones(seq_len, seq_len).to(device)
    noise = torch.randn(batch, nz, 1, 1).cuda()
    ```

    ## Use instead
    ```python
    mask = torch.ones(seq_len, seq_len, device=device)
    noise = torch.randn(batch, nz, 1, 1, device="cuda")
    ```

    ## Fix safety
    Safe for `zeros`, `ones`, `full`, `empty`, `eye` and integer `arange`: the values are identical wherever
    they are created (checked on CUDA). Unsafe for random factories (`rand`, `randn`, `randint`, `randperm`,
    `normal`): the CUDA generator replaces the CPU generator, so seeded results change, and the CPU generator
    is no longer advanced, so later CPU draws (DataLoader worker seeds, CPU augmentations) shift too. Unsafe
    also for float `arange`, `linspace` and `logspace` (the GPU kernel computes the values differently; float
    `arange` and `logspace` differed in the last bits on an H200). No fix when `.to()` also casts to a dtype that cannot be folded exactly, or for
    `requires_grad=True` factories (the result would become a leaf). Factories drawing from an explicit CPU
    `generator=` are left alone.

    The `*_like` factories (`torch.zeros_like(x).to(device, dtype)`) are not reported: they are created on
    `x`'s device, usually the target already, so nothing is built on the CPU. Neither are `bernoulli`,
    `multinomial` and `poisson`: they sample on their input's device and take no `device=`.
    """

    code = "GPU015"
    name = "factory-then-move"
    message = "Tensor created on the CPU and then moved: create it on the target device with `device=`"
    fix_title = "Create the tensor on the target device"
    severity = Severity.INFO
    safety = Safety.SAFE
    priority = "P2"
    triggers = (".to(", ".cuda(")
    examples = [
        Invalid(  # noise from a distribution with Python-number parameters: drawn on the CPU, copied every step
            """
            import torch
            from torch.distributions import Normal
            device = torch.device("cuda")
            for step in range(1000):
                mean, log_std = policy(obs)
                normal = Normal(0, 1)
                z = normal.sample(mean.shape).to(device)  # error: GPU015
                action = torch.tanh(mean + log_std.exp() * z)
                loss = critic(obs, action).mean()
                loss.backward()
            """
        ),
        Valid(  # the distribution's parameters are the network's (device) outputs: it samples on the device
            """
            import torch
            from torch.distributions import Normal
            device = torch.device("cuda")
            for step in range(1000):
                mean, std = policy(obs)
                z = Normal(mean, std).rsample().to(device)
                loss = critic(obs, z).mean()
                loss.backward()
            """
        ),
        Invalid(  # a one-hot row built by a chain of ops on the CPU in every forward, then moved (no fix)
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, obs):
                    reward = torch.zeros(1, 21).scatter(1, torch.tensor([[10]]), 1.0).repeat(len(obs), 1).to(obs.device)  # error: GPU015
                    return self.body(obs) + reward
            """
        ),
        Invalid(  # sinusoidal frequencies computed on the CPU from a factory, moved in every forward (no fix)
            """
            import math
            import torch
            class TimeEmbed(torch.nn.Module):
                @staticmethod
                def sinusoid(t, dim):
                    half = dim // 2
                    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half).to(t.device)  # error: GPU015
                    angles = t[:, None].float() * freqs[None]
                    return torch.cat([angles.cos(), angles.sin()], dim=-1)

                def forward(self, t):
                    return self.mlp(self.sinusoid(t, 256))
            """
        ),
        Invalid(  # the legacy `Variable` wrapper returns its tensor: the factory inside is still made on the CPU
            """
            import torch
            from torch.autograd import Variable
            def train(D, loader, opt, n):
                for images, _ in loader:
                    real = Variable(torch.ones(n)).cuda(0)  # error: GPU015
                    D(images.cuda(0), real).backward()
                    opt.step()
            """,
            fixed="""
            import torch
            from torch.autograd import Variable
            def train(D, loader, opt, n):
                for images, _ in loader:
                    real = Variable(torch.ones(n, device="cuda:0"))  # error: GPU015
                    D(images.cuda(0), real).backward()
                    opt.step()
            """,
        ),
        Invalid(  # a diffusion sampler's denoising loop: T network calls, a CPU tensor copied before each (no fix)
            """
            import torch
            class Diffusion:
                def sample(self, model, x, n):
                    for i in reversed(range(1, self.noise_steps)):
                        t = (torch.ones(n) * i).long().to(self.device)  # error: GPU015
                        x = model(x, t)
                    return x
            """
        ),
        Invalid(  # the factory sits in a helper that returns its CPU tensor; the step moves it (no fix)
            """
            import torch
            class Diffusion:
                def sample_timesteps(self, n):
                    return torch.randint(low=1, high=self.noise_steps, size=(n,))
            def train(model, loader, opt, diffusion, device):
                for images, _ in loader:
                    t = diffusion.sample_timesteps(images.shape[0]).to(device)  # error: GPU015
                    model(images.to(device), t).mean().backward()
                    opt.step()
            """
        ),
        Invalid(  # noise drawn on the CPU, moved by a helper that returns its argument on the GPU (no fix)
            """
            import torch
            from torch.autograd import Variable
            class GAN:
                def get_torch_variable(self, arg):
                    return Variable(arg).cuda(self.cuda_index)
                def train(self, loader):
                    for images, _ in loader:
                        z = self.get_torch_variable(torch.randn(64, 100, 1, 1))  # error: GPU015
                        self.D(self.G(z)).mean().backward()
                        self.d_optimizer.step()
            """
        ),
        Valid(  # the helper fills its CPU tensor in place with CPU indices before returning it
            """
            import numpy as np
            import torch
            class Solver:
                def label2onehot(self, labels, dim):
                    out = torch.zeros(labels.size(0), dim)
                    out[np.arange(labels.size(0)), labels.long()] = 1
                    return out
                def train(self, loader):
                    for x, label in loader:
                        c = self.label2onehot(label, self.c_dim).to(self.device)
                        self.G(x.to(self.device), c).mean().backward()
                        self.g_optimizer.step()
            """
        ),
        Valid(  # the helper's CPU factory moved once, at set-up: not worth a finding
            """
            import torch
            class Diffusion:
                def schedule(self):
                    return torch.linspace(1e-4, 0.02, self.noise_steps)
                def __init__(self, device):
                    self.beta = self.schedule().to(device)
            """
        ),
        Valid(  # the same arithmetic on a factory created on the device: nothing is copied
            """
            import math
            import torch
            class TimeEmbed(torch.nn.Module):
                def forward(self, t):
                    half = 128
                    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half).to(t.dtype)
                    return self.mlp(t[:, None] * freqs[None])
            """
        ),
        Valid(  # zero elements: the "copy" moves nothing
            """
            import torch
            class Concat(torch.nn.Module):
                def forward(self, parts):
                    out = torch.empty(0, 16).to(parts[0].device)
                    for p in parts:
                        out = torch.cat((out, self.proj(p)))
                    return out
            """
        ),
        Valid(
            """
            import torch
            a = torch.zeros(4, 4, device="cuda")
            b = torch.zeros(4, 4).to(torch.float16)  # a cast, not a move
            c = torch.randn(3, generator=g).cuda()  # CPU generator: keep it on the CPU
            """
        ),
        Valid(  # one-off tiny tensors outside any loop: microseconds wherever they are made
            """
            import torch
            start = torch.zeros(1, 1).to(device)
            scalar = torch.ones([]).to(device)
            scale = torch.full((4,), 0.5).cuda()
            """
        ),
        Valid(  # `*_like` follows its input's device; `bernoulli` samples on its input's device
            """
            import torch
            z = torch.zeros_like(x).to(device, dtype)
            n = torch.randn_like(x).to(device)
            m = torch.bernoulli(p).to(device)
            """
        ),
        Invalid(  # a helper whose call frequency is unknown (a loss a framework calls): still reported
            """
            import torch
            def contrastive_targets(batch, dim, n, device):
                buf = torch.zeros(batch, dim).cuda()
                mask = torch.ones(n, n).to(device)
                eye = torch.eye(n).to(device, dtype=torch.float16)
                return buf, mask, eye
            """,
            fixed="""
            import torch
            def contrastive_targets(batch, dim, n, device):
                buf = torch.zeros(batch, dim, device="cuda")
                mask = torch.ones(n, n, device=device)
                eye = torch.eye(n, device=device, dtype=torch.float16)
                return buf, mask, eye
            """,
        ),
        Valid(  # set-up: a script's storage allocated once before its loop, a constructor's table
            """
            import torch
            obs = torch.zeros((num_steps, num_envs, obs_dim)).to(device)
            class Agent(torch.nn.Module):
                def __init__(self, device):
                    super().__init__()
                    self.support = torch.linspace(-10, 10, 51).to(device)
            for update in range(1000):
                collect(obs)
            """
        ),
        Valid(  # a sample for the images saved every 1000 steps: one copy now and then
            """
            import torch
            for step, (x, _) in enumerate(loader):
                D(x.cuda()).mean().backward()
                optimizer.step()
                if step % 1000 == 0:
                    z = torch.randn(800, 100, 1, 1).cuda()
                    save_image(G(z))
            """
        ),
        Valid(  # made once outside the training step, moved later: a one-off copy
            """
            import torch
            table = torch.randn(1000, 64)
            table = table.to(device)
            """
        ),
        Valid(  # filled row by row on the CPU before the move: creating it on the GPU would make the fill slower
            """
            import torch
            for step in range(1000):
                feats = torch.zeros(len(items), 64)
                for i, item in enumerate(items):
                    feats[i] = encode(item)
                feats = feats.cuda()
                model(feats).sum().backward()
                optimizer.step()
            """
        ),
        Invalid(  # a causal mask made on the CPU in a network's forward, every step: the triangle is exact anywhere
            """
            import torch
            class Decoder(torch.nn.Module):
                def forward(self, tokens):
                    n = tokens.shape[1]
                    causal = torch.tril(torch.ones(n, n)).to(tokens.device)
                    return self.blocks(tokens, causal)
            """,
            fixed="""
            import torch
            class Decoder(torch.nn.Module):
                def forward(self, tokens):
                    n = tokens.shape[1]
                    causal = torch.tril(torch.ones(n, n, device=tokens.device))
                    return self.blocks(tokens, causal)
            """,
        ),
        Invalid(  # cast on the CPU between the factory and the move: reported, no fix (the cast's type decides)
            """
            import torch
            class Decoder(torch.nn.Module):
                def forward(self, tokens):
                    n = tokens.shape[1]
                    causal = torch.triu(torch.ones(n, n), diagonal=1).type(torch.ByteTensor).to(self.device)
                    return self.blocks(tokens, causal)
            """
        ),
        Invalid(  # a legacy CPU constructor filled in place, then moved, in every update: reported, no fix
            """
            import torch
            for obs, actions in minibatches:
                mean = actor(obs)
                jitter = torch.FloatTensor(mean.shape).uniform_(-0.5, 0.5).to(device)
                loss = ((mean + jitter - actions) ** 2).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(  # `.to(x)` of the forward's input: its device and dtype, every call
            _MOVED_TO_INPUT,
            fixed=_MOVED_TO_INPUT.replace("torch.zeros(1).to(x)", "torch.zeros(1, device=x.device, dtype=x.dtype)"),
        ),
        Invalid(  # an uninitialized legacy CPU tensor of given sizes, moved and then zeroed, in every update
            """
            import torch
            for states, actions in minibatches:
                onehot = torch.FloatTensor(len(actions), n_actions).to(device)
                onehot.zero_()
                onehot.scatter_(1, actions.view(-1, 1), 1)
                loss = forward_model(states, onehot).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(  # two statements in the training step: reported at the factory, no fix (the move is conditional)
            """
            import torch
            for step in range(1000):
                noise = torch.randn(values.size())
                if values.is_cuda:
                    noise = noise.cuda()
                loss = critic(values + noise).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(  # random: the fix changes the values and the CPU generator's stream (unsafe)
            """
            import torch
            for x in loader:
                noise = torch.randn(b, nz, 1, 1).to(device)
                idx = torch.randint(0, n, size=(k,)).to(device=device)
                perm = torch.randperm(n).cuda()
                step(x, noise, idx, perm)
            """,
            fixed="""
            import torch
            for x in loader:
                noise = torch.randn(b, nz, 1, 1, device=device)
                idx = torch.randint(0, n, size=(k,), device=device)
                perm = torch.randperm(n, device="cuda")
                step(x, noise, idx, perm)
            """,
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ",),
        before=("a = torch.zeros(5, 3).to(device)\n"
                "b = torch.full((4,), 0.1).to(device)\n"
                "c = torch.eye(4, 3).to(device, dtype=torch.float16)\n"
                "d = torch.arange(7).to(device)"),
        after=("a = torch.zeros(5, 3, device=device)\n"
               "b = torch.full((4,), 0.1, device=device)\n"
               "c = torch.eye(4, 3, device=device, dtype=torch.float16)\n"
               "d = torch.arange(7, device=device)"),
        compare=("a", "b", "c", "d"),
    )

    def __init__(self, ctx) -> None:  # noqa: ANN001 - RuleContext
        super().__init__(ctx)
        self._reported_factories: set[int] = set()
        self._writes: dict[int, list[tuple[int, str]]] = {}  # scope -> in-place writes (order, name)
        # names of the helpers this file calls that return their argument moved to a device: usually none, so most
        # calls are passed over by one set lookup
        self._argument_movers = {key.rsplit("#moves-argument:", 1)[1] for key in ctx.analysis.program_keys
                                 if "#moves-argument:" in key}

    def visit_Call(self, node: cst.Call) -> None:
        name = method_name(node)
        if name not in ("to", "cuda") or not isinstance(node.func, cst.Attribute):
            self._moved_by_helper(node)
            return
        moved = node.func.value
        factory, wrapper, cast = self._unwrap(moved)
        kind = self._factory_kind(factory) if isinstance(factory, cst.Call) else None
        if kind is None or not isinstance(factory, cst.Call):
            factory = moved
            if self._filled_on_host(factory) and self.ctx.in_hot_region() and not is_test_path(self.ctx.path) \
                    and self._move(node, name) is not None:
                self.report(node, note="allocate it on the device and fill it there: "
                                       "`torch.empty(shape, device=...).uniform_(a, b)`")
                return
            if isinstance(factory, cst.Call) and legacy_sized_allocation(factory, self.ctx.qualname(factory.func) or "") \
                    and self.ctx.in_hot_region() and not is_test_path(self.ctx.path) and self._move(node, name) is not None:
                self.report(node, note="allocate it on the device: `torch.empty(sizes, device=...)` (or `torch.zeros` "
                                       "when it is zeroed next)")
                return
            if self._cpu_noise(factory) and self.ctx.in_hot_region() and not is_test_path(self.ctx.path) \
                    and self._move(node, name) is not None:
                self.report(node, "Noise drawn on the CPU from a distribution with Python-number parameters, then "
                                  "copied to the GPU every step: draw it on the device (`torch.randn(shape, "
                                  "device=...)` for a standard normal, or parameters that are device tensors)")
                return
            helper = self._factory_helper(factory)
            if helper is not None and self.ctx.in_hot_region() and not is_test_path(self.ctx.path) \
                    and self._move(node, name) is not None:
                self.report(node, f"Tensor created on the CPU by `{helper}()` (a torch factory without `device=`) "
                                  "and then moved: give the factory in the helper a `device=`")
                return
            if self._built_up_on_host(factory) and self.ctx.in_hot_region() and not is_test_path(self.ctx.path) \
                    and self._move(node, name) is not None:
                self.report(node, note="pass `device=` to the factory at the start of the chain; the ops after it "
                                       "then run on the device and nothing is copied")
                return
            self._moved_later(node, name, factory)
            return
        if any(arg.star for arg in node.args) or not _placeable(factory):
            return
        if is_test_path(self.ctx.path):
            return  # test inputs, built once: the fix only reshuffles seeded test data
        numel = _literal_numel(factory, kind)
        if numel == 0:
            return  # `torch.empty(0).to(device)`: no elements, nothing is copied
        if not self.ctx.in_hot_region() and not self.ctx.in_loop() and ((numel or _TINY + 1) <= _TINY
                                                                         or self._set_up_or_evaluation()):
            return  # a one-off tiny tensor (`torch.zeros(1, 1).to(device)`), or set-up code: nothing to gain
        if amortised(self.ctx, plainly=True):
            return  # a sample drawn for the images saved every 1000 steps: one copy now and then
        if kind == "normal" and len([a for a in factory.args if a.keyword is None]) < 3 \
                and call_arg(factory, "size") is None:
            return  # normal(mean_tensor, std_tensor) takes no device= argument
        move = self._move(node, name)
        if move is None:
            return
        device, dtype = move
        keywords: list[tuple[str, cst.BaseExpression]] = [("device", device)]
        note = None
        fixable = True
        if cast:  # `torch.ones(n, n).type(torch.ByteTensor).to(dev)`: the cast's target type decides the fix
            self.report(node, note="create the tensor on the device (`device=`), then cast it there")
            return
        if dtype is not None:
            factory_dtype = call_arg(factory, "dtype")
            if factory_dtype is not None:
                fixable = self.ctx.code(factory_dtype.value) == self.ctx.code(dtype)
            elif kind in _DTYPE_FOLDABLE:
                keywords.append(("dtype", dtype))
            else:
                fixable = False
            if not fixable:
                note = "`.to()` also changes the dtype; moving the cast into the factory could change values"
        if _is_true(call_arg(factory, "requires_grad")):
            fixable, note = False, ("`requires_grad=True`: the moved tensor is not a leaf, one created on the "
                                    "device is; check which one the code means")
        if "#" in self.ctx.code(node)[len(self.ctx.code(moved)):]:
            fixable, note = False, "comments inside the call"
        if not fixable:
            self.report(node, note=note)
            return
        replacement: cst.BaseExpression = factory
        for keyword, value in keywords:
            replacement = add_keyword(replacement, keyword, value)  # type: ignore[arg-type]
        if wrapper is not None:  # `torch.tril(torch.ones(n, n, device=dev))`
            replacement = wrapper.with_changes(args=[wrapper.args[0].with_changes(value=replacement),
                                                     *wrapper.args[1:]])
        safety = Safety.SAFE
        if _is_random(kind):
            safety = Safety.UNSAFE
            note = ("random values change: the CUDA generator replaces the CPU one, and the CPU generator no "
                    "longer advances (later CPU draws, e.g. DataLoader worker seeds, shift)")
        elif kind in _KERNEL_DEPENDENT and not self._integer_range(factory, kind):
            safety = Safety.UNSAFE
            note = f"`{kind}` computed on the GPU may differ from the CPU result in the last bits"
        self.report(node, replacement=replacement, safety=safety, note=note)

    def _unwrap(self, moved: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.Call | None, bool]:
        """What `.to()` moves, seen through exact wrappers: (the factory call or `moved` itself, the
        `torch.tril`/`torch.triu` around it or None, whether a cast method such as `.type(torch.ByteTensor)` or
        `.float()` sits between)."""
        cast = False
        while isinstance(moved, cst.Call) and isinstance(moved.func, cst.Attribute) \
                and method_name(moved) in _CASTS and not any(arg.star for arg in moved.args):
            moved, cast = moved.func.value, True
        wrapped = variable_content(self.ctx, moved)
        if wrapped is not None and isinstance(wrapped, cst.Call):  # `Variable(torch.ones(n)).cuda()`
            return wrapped, moved, cast
        if isinstance(moved, cst.Call) and self.ctx.qualname(moved.func) in _TRIANGLES and moved.args \
                and moved.args[0].keyword is None and not moved.args[0].star \
                and call_arg(moved, "out") is None and isinstance(moved.args[0].value, cst.Call):
            return moved.args[0].value, moved, cast
        return moved, None, cast

    def _moved_by_helper(self, node: cst.Call) -> None:
        """`z = self.to_gpu(torch.randn(b, 100))` in the step, the helper returning its argument moved to a device:
        reported at the factory (directly the argument, or bound once to the name passed); no fix, the helper
        decides the device."""
        if last_name(node.func) not in self._argument_movers or not node.args or node.args[0].keyword is not None \
                or node.args[0].star or is_test_path(self.ctx.path) or not self.ctx.in_hot_region() \
                or amortised(self.ctx, plainly=True) or not Placement(self.ctx).moves_argument(node):
            return
        factory = node.args[0].value
        if isinstance(factory, cst.Name):
            bindings = Placement(self.ctx).reaching(factory.value)
            if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN \
                    or self._filled_before_move(factory.value, bindings[0].order):
                return
            factory = bindings[0].value
        factory, _, _ = self._unwrap(factory)
        if not isinstance(factory, cst.Call) or self._factory_kind(factory) is None or not _placeable(factory) \
                or id(factory) in self._reported_factories:
            return
        self._reported_factories.add(id(factory))
        self.report(factory, f"Tensor created on the CPU and moved to the device by `{last_name(node.func)}()`: "
                             "create it on the device with `device=`")

    def _set_up_or_evaluation(self) -> bool:
        """Code that runs once: the top level of a script (storage allocated before the loop), a constructor, an
        evaluation or output function. Code of other functions may run per step where the call graph cannot
        tell (a loss helper a framework calls), so it is still reported."""
        function = self.ctx.enclosing(cst.FunctionDef)
        return function is None or function.name.value == "__init__" or bool(
            vocab.EVAL_FUNCTION.match(function.name.value) or vocab.OUTPUT_FUNCTION.match(function.name.value))

    def _factory_helper(self, value: cst.BaseExpression) -> str | None:
        """The name of the program function whose call `value` is (through casts and `Variable`), when that
        function returns a torch factory's new CPU tensor (`diffusion.sample_timesteps(n)`)."""
        value, _, _ = self._unwrap(value)
        if isinstance(value, cst.Call) and Placement(self.ctx).from_factory_helper(value):
            return last_name(value.func)
        return None

    def _built_up_on_host(self, value: cst.BaseExpression) -> bool:
        """`torch.zeros(1, n).scatter(1, index, 1.0).repeat(b, 1)`: a factory's tensor shaped or written by a chain
        of tensor methods on the CPU, then moved; or computed from one with elementwise arithmetic
        (`torch.exp(-math.log(p) * torch.arange(half) / half)`)."""
        steps = 0
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                and method_name(value) in _SHAPE_ONLY | _HOST_CHAIN_WRITES:
            value, steps = value.func.value, steps + 1
        if steps > 0 and isinstance(value, cst.Call) and self._factory_kind(value) is not None:
            return True
        return isinstance(value, (cst.Call, cst.BinaryOperation, cst.UnaryOperation)) and self._host_arithmetic(value)

    def _host_arithmetic(self, value: cst.BaseExpression, depth: int = 0) -> bool:
        """Elementwise arithmetic over a CPU factory (created without `device=`) and plain numbers: the result is a
        CPU tensor (a CPU tensor of several elements cannot meet a CUDA tensor in an op, so code that runs never
        mixes one in). True when some operand is such a factory."""
        return self._host_operand(value, depth) is True

    def _host_operand(self, value: cst.BaseExpression, depth: int) -> bool | None:
        """True: a CPU tensor computed from a factory; None: a number (or a name, taken for one); False: neither."""
        if depth > 12:
            return False
        if isinstance(value, (cst.Integer, cst.Float, cst.Name)) or isinstance(value, cst.Attribute) \
                and self.ctx.qualname(value) is None:
            return None
        if isinstance(value, cst.UnaryOperation):
            return self._host_operand(value.expression, depth + 1)
        if isinstance(value, cst.BinaryOperation):
            sides = (self._host_operand(value.left, depth + 1), self._host_operand(value.right, depth + 1))
            return False if False in sides else (True if True in sides else None)
        if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Attribute) \
                and value.value.attr.value == "shape":
            return None  # `x.shape[0]`: a size
        if not isinstance(value, cst.Call) or any(arg.star for arg in value.args):
            return False
        if self._factory_kind(value) is not None:
            return _placeable(value)
        qual = self.ctx.qualname(value.func) or ""
        if qual.startswith("math.") or qual in _NUMBER_CALLS or method_name(value) in _SIZE_METHODS:
            return None  # a Python number: `N * torch.distributed.get_rank()`, `x.size(0)`
        if qual in _ELEMENTWISE and value.args:
            operands = [self._host_operand(arg.value, depth + 1) for arg in value.args if arg.keyword is None]
            return False if False in operands else (True if True in operands else None)
        if isinstance(value.func, cst.Attribute) and method_name(value) in _ELEMENTWISE_METHODS | _SHAPE_ONLY:
            return self._host_operand(value.func.value, depth + 1) is True
        return False

    def _filled_on_host(self, value: cst.BaseExpression) -> bool:
        """`torch.FloatTensor(shape).uniform_(a, b)`: a legacy CPU constructor filled in place (random or
        constant values), then moved."""
        return isinstance(value, cst.Call) and method_name(value) in _IN_PLACE_FILLS \
            and isinstance(value.func, cst.Attribute) and isinstance(value.func.value, cst.Call) \
            and LEGACY_HOST_TENSOR.fullmatch(self.ctx.qualname(value.func.value.func) or "") is not None

    def _cpu_noise(self, value: cst.BaseExpression) -> bool:
        """`Normal(0, 1).sample(shape)`, also through names bound once (`z = normal.sample(s)`, `normal =
        Normal(0, 1)`): a `torch.distributions` object whose parameters are Python numbers samples on the CPU."""
        value = self._bound_value(value)
        if not (isinstance(value, cst.Call) and method_name(value) in ("sample", "rsample")
                and isinstance(value.func, cst.Attribute)):
            return False
        distribution = self._bound_value(value.func.value)
        if not isinstance(distribution, cst.Call) or not distribution.args:
            return False
        return (self.ctx.qualname(distribution.func) or "").startswith("torch.distributions.") and all(
            not arg.star and is_numeric_literal(arg.value) for arg in distribution.args)

    def _bound_value(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
        if not isinstance(value, cst.Name):
            return value
        bindings = self.ctx.analysis.reaching_bindings(value.value, self.ctx.ancestors)
        if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN:
            return None
        return bindings[0].value

    def visit_Subscript(self, node: cst.Subscript) -> None:
        """`gpu_tensor[torch.arange(n), y]` in the step: the index is made on the CPU and copied by the indexing."""
        factories = [e.slice.value for e in node.slice if isinstance(e.slice, cst.Index)
                     and isinstance(e.slice.value, cst.Call) and self._factory_kind(e.slice.value) is not None]
        if not factories or not self.ctx.in_hot_region() or is_test_path(self.ctx.path):
            return
        placement = Placement(self.ctx)
        # a tensor of unknown placement in a CUDA program's step counts: the fix reads its device, so it is
        # right wherever the tensor lives
        where = placement.of(node.value)
        if placement.default_device or where != DEVICE and (where != TENSOR or not self.ctx.targets_cuda()):
            return
        for factory in factories:
            if not _placeable(factory):
                continue
            message = "Index tensor created on the CPU and copied to the GPU by the indexing, every step: create it "\
                      "on the indexed tensor's device"
            if not isinstance(node.value, (cst.Name, cst.Attribute)):
                self.report(factory, message)
                continue
            kind = self._factory_kind(factory) or ""
            exact = kind in _EXACT or kind in _KERNEL_DEPENDENT and self._integer_range(factory, kind)
            self.report(factory, message, replacement=add_keyword(factory, "device", cst.Attribute(
                value=node.value, attr=cst.Name("device"))), safety=Safety.SAFE if exact else Safety.UNSAFE,
                note=None if exact else "random or computed values may differ on the GPU")

    def _factory_kind(self, call: cst.Call) -> str | None:
        """`zeros` for `torch.zeros(...)`: a factory that takes `device=` (None for anything else)."""
        qual = self.ctx.qualname(call.func) or ""
        kind = qual[len("torch."):] if qual.startswith("torch.") and qual.count(".") == 1 else ""
        if kind.endswith("_like") or kind not in _EXACT | _KERNEL_DEPENDENT | _RANDOM:
            return None
        return kind

    def _moved_later(self, node: cst.Call, name: str, moved: cst.BaseExpression) -> None:
        """`noise = torch.randn(shape)` ... `noise = noise.cuda()` (often under `if x.is_cuda:`), or
        `alpha.expand_as(y).to(y.device)`: the factory and the move in two statements, in the training step or
        a loop. Reported at the factory; no fix, as the move may be conditional or the tensor used before it."""
        while isinstance(moved, cst.Call) and method_name(moved) in _SHAPE_ONLY and isinstance(moved.func,
                                                                                               cst.Attribute):
            moved = moved.func.value
        moved = variable_content(self.ctx, moved) or moved  # `labels = torch.ones(n)` ... `Variable(labels).cuda()`
        if not isinstance(moved, cst.Name) or is_test_path(self.ctx.path):
            return
        move = self._move(node, name)
        if not self.ctx.in_hot_region() or move is None:
            return
        bindings = Placement(self.ctx).reaching(moved.value)
        if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN:
            return
        if self._filled_before_move(moved.value, bindings[0].order):
            return  # `feats = torch.zeros(n, d)`, rows written on the CPU, then moved: a different trade-off
        factory = bindings[0].value
        helper = self._factory_helper(factory)
        if helper is None and (not isinstance(factory, cst.Call) or self._factory_kind(factory) is None
                               or not _placeable(factory)):
            return
        if id(factory) in self._reported_factories:
            return
        self._reported_factories.add(id(factory))
        where = "the factory" if helper is None else f"the factory in `{helper}()`"
        self.report(factory, f"Tensor created on the CPU and moved to the device by a later `.{name}()`: pass "
                             f"`device={self.ctx.code(move[0])}` to {where}")

    def _filled_before_move(self, name: str, since: int) -> bool:
        """Is `name` written in place (`name[i] = ...`, `name.copy_(...)`, `name += ...`) between its factory and
        the current statement?"""
        function = self.ctx.enclosing(cst.FunctionDef)
        scope = function.body if isinstance(function, cst.FunctionDef) else self.ctx.module
        here = self.ctx.analysis.statement_order(self.ctx.ancestors)
        return any(written == name and since < order < here for order, written in self._in_place_writes(scope))

    def _in_place_writes(self, scope: cst.CSTNode) -> list[tuple[int, str]]:
        """(statement order, name) of every in-place write in `scope`, collected once per scope."""
        if id(scope) not in self._writes:
            order = self.ctx.analysis.order
            found: list[tuple[int, str]] = []
            current = 0
            for inner in walk(scope):
                current = order.get(id(inner), current)
                if isinstance(inner, cst.Assign):
                    found += [(current, dotted_name(t.target.value) or "") for t in inner.targets
                              if isinstance(t.target, cst.Subscript)]
                elif isinstance(inner, cst.AugAssign):
                    target = inner.target.value if isinstance(inner.target, cst.Subscript) else inner.target
                    found.append((current, dotted_name(target) or ""))
                elif isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) \
                        and inner.func.attr.value.endswith("_"):
                    found.append((current, dotted_name(inner.func.value) or ""))
            self._writes[id(scope)] = found
        return self._writes[id(scope)]

    def _move(self, node: cst.Call, name: str) -> tuple[cst.BaseExpression, cst.BaseExpression | None] | None:
        """(device expression, dtype expression or None) of `.cuda(...)` / `.to(...)`, None if not a plain move."""
        allowed = {"non_blocking", "copy"}
        if name == "cuda":
            if any(a.keyword is not None and a.keyword.value not in allowed | {"device"} for a in node.args):
                return None
            target = call_arg(node, "device", 0)
            if target is None:
                return cst.SimpleString('"cuda"'), None
            if isinstance(target.value, cst.Integer):
                return cst.SimpleString(f'"cuda:{target.value.value}"'), None
            return target.value, None
        if any(a.keyword is not None and a.keyword.value not in allowed | {"device", "dtype"} for a in node.args):
            return None  # memory_format= & co.
        positional = [a for a in node.args if a.keyword is None]
        target = call_arg(node, "device")
        if target is None:
            if not positional:
                return None
            target = positional[0]
            rest = positional[1:]
        else:
            rest = positional
        kind = Placement(self.ctx).device_kind(target.value)
        if kind == TENSOR:
            return None  # `.to(torch.float16)`: a cast
        if kind is None and not rest and call_arg(node, "dtype") is None and Placement(self.ctx).device_tensor(target.value):
            # `.to(x)` of a tensor on the device: its device and its dtype
            code = self.ctx.code(target.value)
            return cst.parse_expression(f"{code}.device"), cst.parse_expression(f"{code}.dtype")
        if kind != DEVICE and not _DEVICE_NAME.search(dotted_name(target.value) or ""):
            return None  # the CPU, another tensor, or unknown
        dtype_arg = call_arg(node, "dtype")
        if len(rest) > 2:
            return None
        if rest:
            if dtype_arg is not None:
                return None
            dtype_arg = rest[0]
            if len(rest) == 2 and not isinstance(rest[1].value, cst.Name):
                return None  # the third positional is non_blocking
        return target.value, (dtype_arg.value if dtype_arg is not None else None)

    def _integer_range(self, factory: cst.Call, kind: str) -> bool:
        """Integer `arange` (integer literals, a single bound, or an integer dtype): exact on every device."""
        if kind != "arange":
            return False
        dtype = call_arg(factory, "dtype")
        if dtype is not None:
            return (self.ctx.qualname(dtype.value) or "").rsplit(".", 1)[-1] in _INTEGER_DTYPES
        positional = [a.value for a in factory.args if a.keyword is None]
        if len(positional) == 1 and not isinstance(positional[0], cst.Float):
            return True
        return all(_is_integer_literal(value) for value in positional)


def _placeable(factory: cst.Call) -> bool:
    """A factory call that `device=` can be added to: no `*args`/`**kwargs`, no device or `out=` yet, and no CPU
    `generator=` (drawing on the CPU is then deliberate: reproducible streams)."""
    return not any(arg.star for arg in factory.args) and all(
        call_arg(factory, keyword) is None for keyword in ("device", "out", "generator"))


def _is_random(kind: str) -> bool:
    return kind in _RANDOM or kind.startswith("rand")


def _is_integer_literal(node: cst.BaseExpression) -> bool:
    while isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        node = node.expression
    return isinstance(node, cst.Integer)


def _is_true(arg: cst.Arg | None) -> bool:
    return arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == "True"


def _literal_numel(factory: cst.Call, kind: str) -> int | None:
    """Elements of a factory whose shape is written as integer literals (`zeros(1, 1)`, `full((2,), v)`,
    `eye(3)`); 0 when any dimension is a literal 0; None when another dimension is not a literal."""
    positional = [a.value for a in factory.args if a.keyword is None]
    size = call_arg(factory, "size")
    if kind in _SIZED:
        dims = positional if size is None else [size.value]
    elif kind == "full":
        dims = positional[:1] if size is None else [size.value]
    elif kind == "eye":
        dims = positional[:2]
    else:
        return None
    if len(dims) == 1 and isinstance(dims[0], (cst.Tuple, cst.List)):
        dims = [e.value for e in dims[0].elements]
        if not dims:
            return 1  # `torch.ones([])`: a 0-d tensor
    if any(isinstance(d, cst.Integer) and int(d.evaluated_value) == 0 for d in dims):  # type: ignore[attr-defined]
        return 0  # `torch.empty(0, n)`: no elements, whatever the other sizes
    if not dims or not all(isinstance(d, cst.Integer) for d in dims):
        return None
    numel = 1
    for d in dims:
        numel *= int(d.evaluated_value)  # type: ignore[attr-defined]
    return numel * (numel if kind == "eye" and len(dims) == 1 else 1)
