from __future__ import annotations

import re

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import (LEGACY_HOST_TENSOR, Binding, BindingKind, call_arg, dotted_name, is_numeric_literal,
                              legacy_sized_allocation, method_name, walk)
from gpulint.builders import add_keyword, replace_keyword_value
from gpulint.program import current_text
from gpulint.rule import is_test_path
from gpulint.semantic.masks import standalone_statement, statement_indent
from gpulint.semantic.vocab import returns_observation
from gpulint.semantic.placement import (
    DEVICE,
    HOST,
    NONTENSOR,
    TENSOR,
    Placement,
    amortised,
    at_episode_end,
    collective_only,
    last_name,
)

_FROM_HOST = {"from_numpy"}
_TENSOR_CONSTRUCTORS = {"tensor", "as_tensor", "asarray", "Tensor", "FloatTensor", "DoubleTensor", "HalfTensor",
                        "LongTensor", "IntTensor", "ShortTensor", "ByteTensor", "BoolTensor", "BFloat16Tensor"}
# Methods between the host tensor and the move that keep it a host tensor: `from_numpy(a).float().to(D)`.
_HOST_CHAIN = {"float", "double", "half", "bfloat16", "long", "int", "bool", "byte", "view", "reshape", "unsqueeze",
               "squeeze", "permute", "transpose", "contiguous", "flatten", "type", "t", "clone", "detach", "expand",
               "expand_as", "repeat"}
_BROADCASTS = frozenset({"expand", "expand_as", "repeat"})
# Functions that gather a Python sequence of tensors into one (on the device of the pieces).
_GATHERS = {"stack", "cat", "concat", "concatenate", "vstack", "hstack"}
_DEVICE_NAME = re.compile(r"(^|_)(device|dev|cuda|gpu)$|^(local_)?rank$", re.I)


def _collector(device_parameter: str, marker: str = "") -> str:
    """An example: a rollout collector that uploads each observation to the device it was given."""
    return f"""
            import torch
            class Collector:
                def __init__(self, env, model, {device_parameter}):
                    self.env, self.model, self.device = env, model, device
                def collect(self, steps):
                    obs = self.env.reset()
                    for _ in range(steps):
                        obs_t = torch.tensor(obs, device=self.device){marker}
                        with torch.no_grad():
                            action = self.model(obs_t).argmax(-1)
                        obs, reward, done, _ = self.env.step(action.cpu().numpy())
            """

class HostDataToDevicePerStep(Rule):
    """
    ## What it does
    Finds tensors built from host data and copied to the GPU inside the training step or a model's `forward`:
    `torch.from_numpy(a).to(device)`, `torch.tensor(obs).cuda()`, `torch.FloatTensor(batch).to(device)`,
    `torch.tensor(values, device=device)`. When the data is a literal constant the finding says to create the
    tensor once instead. Not reported: code in `if step % N == 0:` blocks (evaluation, sampling, logging every
    N steps), and a tensor whose only uses are `torch.distributed` collectives and reading the result back
    (`t = torch.tensor(flag, device=d)`, `dist.all_reduce(t)`, `bool(t.item())`): NCCL needs the value on
    the device to agree across ranks. GPU011 may also report a blocking copy of such data; its
    `non_blocking=True` does not help here, since a copy from freshly allocated pageable memory cannot overlap.

    ## Why is this slow
    Each call allocates a tensor in pageable host memory and copies it to the GPU; the copy from pageable
    memory is staged through a driver buffer and blocks the host (H100: 13 GB/s pageable vs 55 GB/s from an
    already-pinned buffer; `torch.tensor([1.0, 2.0], device="cuda")` is one synchronizing call). In a loop
    this repeats every step, and for per-step constants it is pure waste.

    ## Example
    ```python
    for step in range(num_updates):
        obs = torch.from_numpy(replay.sample(batch_size)).to(device)
        weights = torch.tensor([0.5, 0.25, 0.25], device=device)
        loss = (policy(obs) * weights).sum()
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    weights = torch.tensor([0.5, 0.25, 0.25], device=device)  # a constant: once, or register_buffer
    for step in range(num_updates):
        obs = torch.from_numpy(replay.sample(batch_size))
        obs = (obs.pin_memory() if torch.cuda.is_available() else obs).to(device, non_blocking=True)
        ...
    ```
    `pin_memory()` takes a block from PyTorch's caching host allocator, which hands a pinned block back for
    reuse once the copy that read it is done: a staging buffer managed by PyTorch. Measured on an H100
    (`benchmarks/pinned_staging.py`, a step of 0.4 ms of GPU work): a 4 MB batch 640 -> 475 us per step, 32 MB
    5130 -> 1000 us; two hand-managed pinned buffers with events were no faster. Up to a few hundred KB the
    copy costs the same either way (344 B and 176 KB: within 5%). Better still, keep the producer on the GPU
    (a GPU replay buffer or vectorised environment).

    Calls of a program helper that does this to its argument (`def tensor(x): return
    torch.from_numpy(np.asarray(x)).to(DEVICE)`, in any file) are reported where the step calls them.

    ## Fix safety
    Unsafe fix for copies spelled `H.to(device)` / `H.cuda()` (with or without `non_blocking`), where `H` builds
    a tensor from host data: `H.pin_memory().to(device, non_blocking=True)`. When the program may run without
    CUDA (the device is chosen at run time), pinning is guarded by `torch.cuda.is_available()`, written as two
    statements for `name = H.to(device)` and inline for short expressions; other sites are left as they are.
    Values are the same. The pinned block stays allocated until the copy is done (PyTorch records the stream).
    On a CPU run with CUDA available, the tensor is pinned needlessly and no longer shares memory with the
    NumPy array it came from. `torch.tensor(values, device=d)` (small Python data) and constants are not
    rewritten: hoisting a constant changes the program's structure.
    """

    code = "GPU013"
    name = "host-data-to-device-per-step"
    message = "Host data turned into a GPU tensor every step: a pageable host-to-device copy per call"
    fix_title = "Copy through pinned memory without blocking the host"
    severity = Severity.WARNING
    safety = Safety.UNSAFE
    priority = "P2"
    # no text trigger: a file that only calls an uploading helper (`to_device(batch)`) names none of these
    constructors = ("from_numpy", "tensor(", "Tensor(", "zeros(", "empty(")  # (`torch.zeros`: a CPU buffer)
    examples = [
        Valid(  # outside the training step: a one-off copy
            """
            import torch
            table = torch.from_numpy(np.load("table.npy")).to("cuda")
            """
        ),
        Valid(  # sizes, not host data: an uninitialized allocation (GPU015's case)
            """
            import torch
            for states, actions in minibatches:
                onehot = torch.FloatTensor(len(actions), n_actions).to(device)
                loss = forward_model(states, onehot.zero_()).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # already a device tensor
            """
            import torch
            for x, y in loader:
                x = x.to("cuda")
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # once every N steps
            """
            import torch
            for step in range(1000):
                loss = policy(next(batches).cuda()).mean()
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    prompt = torch.tensor(tokenize("hello"), dtype=torch.long, device="cuda")
                    print(sample(policy, prompt))
            """
        ),
        Valid(  # a host value shared with the other ranks: the collective needs it on the device
            """
            import torch
            import torch.distributed as dist
            device = torch.device("cuda")
            for step in range(1000):
                loss = policy(next(batches).to(device)).mean()
                loss.backward()
                optimizer.step()
                reward = torch.tensor(mean_reward(), dtype=torch.float32, device=device)
                dist.all_reduce(reward, op=dist.ReduceOp.AVG)
                log(step, reward.item())
            """
        ),
        Invalid(  # the replay-memory idiom: stored transitions transposed per field, gathered and moved; and a
            # lambda that `map` applies to every sampled reward right there
            """
            import torch
            def optimize_model(memory, policy_net, optimizer):
                transitions = memory.sample(128)
                batch = Transition(*zip(*transitions))
                state_batch = torch.cat(batch.state).to("cuda")  # error: GPU013
                rewards = tuple(map(lambda r: torch.tensor([r], device="cuda"), batch.reward))  # error: GPU013
                loss = (policy_net(state_batch).max(1)[0] - torch.cat(rewards)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            def optimize_model(memory, policy_net, optimizer):
                transitions = memory.sample(128)
                batch = Transition(*zip(*transitions))
                state_batch = torch.cat(batch.state).pin_memory().to("cuda", non_blocking=True)  # error: GPU013
                rewards = tuple(map(lambda r: torch.tensor([r], device="cuda"), batch.reward))  # error: GPU013
                loss = (policy_net(state_batch).max(1)[0] - torch.cat(rewards)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # used in the computation, not only for the collective
            """
            import torch
            import torch.distributed as dist
            for step in range(1000):
                weights = torch.tensor(schedule(step), device="cuda")
                dist.broadcast(weights, src=0)
                loss = (policy(next(batches).cuda()) * weights).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            for step in range(1000):
                # non_blocking (GPU011's fix) does not help: the source is freshly allocated pageable memory
                obs = torch.from_numpy(buffer.sample(256)).float().to("cuda", non_blocking=True)
                loss = policy(obs).mean()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            for step in range(1000):
                # non_blocking (GPU011's fix) does not help: the source is freshly allocated pageable memory
                obs = torch.from_numpy(buffer.sample(256)).float().pin_memory().to("cuda", non_blocking=True)
                loss = policy(obs).mean()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the device is chosen at run time: pinning only where CUDA is there
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for step in range(1000):
                obs = torch.from_numpy(np.stack([replay[i] for i in sampler.sample()])).to(device)
                loss = policy(obs).mean()
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for step in range(1000):
                obs = torch.from_numpy(np.stack([replay[i] for i in sampler.sample()]))
                obs = (obs.pin_memory() if torch.cuda.is_available() else obs).to(device, non_blocking=True)
                loss = policy(obs).mean()
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # a rollout loop: environment outputs, legacy CUDA constructors (also through an alias)
            """
            import numpy as np
            import torch
            LongTensor = torch.cuda.LongTensor
            for t in range(horizon):
                with torch.no_grad():
                    action = policy(obs_t).argmax(-1)
                obs, rew, term, trunc, _ = env.step(action.item())
                rewards[t] = torch.as_tensor(rew, dtype=torch.float32).to("cuda")
                noise = torch.cuda.FloatTensor(np.random.normal(size=(4,)))
                steps = LongTensor([t])
            """,
            fixed="""
            import numpy as np
            import torch
            LongTensor = torch.cuda.LongTensor
            for t in range(horizon):
                with torch.no_grad():
                    action = policy(obs_t).argmax(-1)
                obs, rew, term, trunc, _ = env.step(action.item())
                rewards[t] = torch.as_tensor(rew, dtype=torch.float32).pin_memory().to("cuda", non_blocking=True)
                noise = torch.cuda.FloatTensor(np.random.normal(size=(4,)))
                steps = LongTensor([t])
            """,
        ),
        Invalid(  # the host tensor passed through a torch function (`torch.unsqueeze`) before the move
            """
            import torch
            for t in range(horizon):
                obs_t = torch.unsqueeze(torch.FloatTensor(obs), 0).to("cuda")
                with torch.no_grad():
                    action = policy(obs_t).argmax(-1)
                obs, rew, term, trunc, _ = env.step(action.item())
            """,
            fixed="""
            import torch
            for t in range(horizon):
                obs_t = torch.unsqueeze(torch.FloatTensor(obs), 0).pin_memory().to("cuda", non_blocking=True)
                with torch.no_grad():
                    action = policy(obs_t).argmax(-1)
                obs, rew, term, trunc, _ = env.step(action.item())
            """,
        ),
        Invalid(  # built in one statement, moved in the next (each training step)
            """
            import numpy as np
            import torch
            for _ in range(steps):
                boards = torch.FloatTensor(np.array(examples))
                boards = boards.contiguous().cuda()
                net(boards).sum().backward()
                optimizer.step()
            """,
            fixed="""
            import numpy as np
            import torch
            for _ in range(steps):
                boards = torch.FloatTensor(np.array(examples))
                boards = boards.contiguous().pin_memory().cuda(non_blocking=True)
                net(boards).sum().backward()
                optimizer.step()
            """,
        ),
        Valid(  # built once before the loop: moving it every iteration is GPU011's business (move it once)
            """
            import numpy as np
            import torch
            boards = torch.FloatTensor(np.array(examples))
            for _ in range(steps):
                x = boards.cuda()
                net(x).sum().backward()
                optimizer.step()
            """
        ),
        Invalid(  # device-agnostic code: the device is its caller's choice, never bound to the CPU here
            _collector("device", "  # error: GPU013")
        ),
        Valid(  # the same, with the CPU as the device's default: nothing says a GPU is meant
            _collector('device="cpu"')
        ),
        Invalid(  # a loader's collate function (run per batch) given the device by `partial`, its default the CPU
            """
            from functools import partial
            import torch
            def collate(batch, pad=0, device="cpu"):
                inputs, lengths = [], []
                for item in batch:
                    inputs.append(torch.tensor(item + [pad]))
                    lengths.append(len(item))
                return torch.stack(inputs).to(device), lengths
            def train(model, opt, data, device):
                loader = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=partial(collate, device=device))
                for x, n in loader:
                    model(x).mean().backward()
                    opt.step()
            train(torch.nn.Linear(8, 8).cuda(), opt, data, "cuda")
            """,
            fixed="""
            from functools import partial
            import torch
            def collate(batch, pad=0, device="cpu"):
                inputs, lengths = [], []
                for item in batch:
                    inputs.append(torch.tensor(item + [pad]))
                    lengths.append(len(item))
                return (torch.stack(inputs).pin_memory() if torch.cuda.is_available() else torch.stack(inputs)).to(device, non_blocking=True), lengths
            def train(model, opt, data, device):
                loader = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=partial(collate, device=device))
                for x, n in loader:
                    model(x).mean().backward()
                    opt.step()
            train(torch.nn.Linear(8, 8).cuda(), opt, data, "cuda")
            """,
        ),
        Invalid(  # a support vector built from a Python list, broadcast on the host, then moved in every forward
            """
            import torch
            import torch.nn as nn

            class ValueHead(nn.Module):
                def forward(self, x):
                    probs = torch.softmax(self.body(x), dim=1)
                    support = torch.tensor([v for v in range(-10, 11)]).expand(probs.shape).float().to(probs.device)
                    return (support * probs).sum(1)

            head = ValueHead().cuda()
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Head(nn.Module):
                def forward(self, x):
                    scale = torch.tensor([0.5, 2.0], device=x.device)
                    return x * scale

            head = Head().cuda()
            """
        ),
        Invalid(  # a helper converting every batch: a legacy CUDA constructor given a list it just made on the host
            """
            import numpy as np
            import torch

            def to_tensor_var(x, use_cuda=True):
                FloatTensor = torch.cuda.FloatTensor if use_cuda else torch.FloatTensor
                x = np.array(x, dtype=np.float64).tolist()
                return FloatTensor(x)  # error: GPU013

            def train(actor, memory, optimizer, steps):
                actor.cuda()
                for _ in range(steps):
                    states = to_tensor_var(memory.sample(64))
                    loss = actor(states).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """
        ),
        Invalid(  # a helper uploading its NumPy argument (cast after the move), called by a learner's step method
            """
            import torch
            def to_float_tensor(array, device):
                return torch.from_numpy(array).to(device).float()  # error: GPU013
            class Policy:
                def __init__(self, model, device):
                    self.model, self.device = model, device
                    self.optimizer = torch.optim.Adam(model.parameters(), fused=True)
                def forward_learn(self, batch):
                    obs = to_float_tensor(batch["obs"], self.device)  # error: GPU013
                    loss = self.model(obs).pow(2).mean()
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()
            """,
            fixed="""
            import torch
            def to_float_tensor(array, device):
                return (torch.from_numpy(array).pin_memory() if torch.cuda.is_available() else torch.from_numpy(array)).to(device, non_blocking=True).float()  # error: GPU013
            class Policy:
                def __init__(self, model, device):
                    self.model, self.device = model, device
                    self.optimizer = torch.optim.Adam(model.parameters(), fused=True)
                def forward_learn(self, batch):
                    obs = to_float_tensor(batch["obs"], self.device)  # error: GPU013
                    loss = self.model(obs).pow(2).mean()
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()
            """,
        ),
        Invalid(  # the observation of a step or, after a terminal one, of the reset, uploaded every rollout step
            """
            import torch
            def explore(env, actor, state, horizon, device):
                for t in range(horizon):
                    with torch.no_grad():
                        action = actor(state)
                    obs, reward, terminal, truncated, _ = env.step(action.cpu().numpy())
                    if terminal or truncated:
                        obs, info = env.reset()
                    state = torch.as_tensor(obs, dtype=torch.float32, device=device)  # error: GPU013
                return state
            """
        ),
        Invalid(  # anchor shifts computed in NumPy in a layer's forward, copied to the device of its input with
            # `type_as` every step (no fix: the copy is spelled as a cast)
            """
            import numpy as np
            import torch
            import torch.nn as nn

            class AnchorTargetLayer(nn.Module):
                def forward(self, inputs):
                    scores, gt_boxes = inputs[0], inputs[1]
                    height, width = scores.size(2), scores.size(3)
                    shift_x, shift_y = np.meshgrid(np.arange(width) * 16, np.arange(height) * 16)
                    shifts = np.vstack((shift_x.ravel(), shift_y.ravel())).transpose()
                    shifts = torch.from_numpy(shifts).type_as(gt_boxes)  # error: GPU013
                    return shifts.view(1, -1, 2) + gt_boxes[:, :, :2]

            layer = AnchorTargetLayer().cuda()
            """
        ),
        Invalid(  # a noise schedule built on the CPU once, copied whole at every one of the sampler's T steps
            """
            import torch

            class Schedule:
                def __init__(self, n=1000):
                    self.n = n
                    self.betas = torch.linspace(1e-4, 0.02, n)

                def step(self, x, eps, i):
                    beta = self.betas.to(x.device)[i]  # error: GPU013
                    return x - beta * eps

            def sample(model, schedule, x):
                for i in reversed(range(schedule.n)):
                    eps = model(x)
                    x = schedule.step(x, eps, i)
                return x

            sample(torch.nn.Linear(4, 4).cuda(), Schedule(), torch.randn(8, 4, device="cuda"))
            """
        ),
        Valid(  # SAC's temperature kept on the CPU and recomputed every update: a value, not a constant table
            """
            import torch

            class Agent:
                def __init__(self, critic, device):
                    self.device = device
                    self.critic = critic.to(device)
                    self.log_alpha = torch.tensor([0.0], requires_grad=True)
                    self.alpha = self.log_alpha.exp().detach()

                def learn(self, states, next_q):
                    target = next_q - self.alpha.to(self.device) * 0.1
                    loss = (self.critic(states) - target).pow(2).mean()
                    loss.backward()
                    self.alpha = self.log_alpha.exp().detach()

            def train(agent, memory, steps):
                for _ in range(steps):
                    agent.learn(*memory.sample())
            """
        ),
    ]

    # a 4 MB batch from NumPy every step: pageable blocking copy vs pinned and non-blocking (timed on CUDA)
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup="import numpy as np\nbatch = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)",
        before="t = torch.from_numpy(batch).to(device)\nout = t * 2",
        after=("t = torch.from_numpy(batch)\n"
               "t = (t.pin_memory() if torch.cuda.is_available() else t).to(device, non_blocking=True)\n"
               "out = t * 2"),
        compare=("out",),
        options={"perf_setup": ("import numpy as np\n"
                                "batch = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)")},
    )

    def __init__(self, ctx) -> None:  # noqa: ANN001 - RuleContext
        super().__init__(ctx)
        self._enabled = ctx.targets_cuda()
        # (or calls a program function returning tensors it built on the host: `check(obs).to(device)`)
        self._constructs = self._enabled and (any(text in current_text(ctx) for text in self.constructors)
                                              or any("#host-batch:" in key for key in ctx.analysis.program_keys))
        # names of uploading helpers this file calls (`step#uploads:tensor` -> `tensor`): usually none
        self._uploaders = {key.rsplit("#uploads:", 1)[1] for key in ctx.analysis.program_keys
                           if "#uploads:" in key} if self._enabled else set()

    def visit_Call(self, node: cst.Call) -> None:
        if not self._enabled or any(arg.star for arg in node.args) and self._mapped_device(node) is None:
            return
        name = method_name(node)
        if name in ("to", "cuda") and isinstance(node.func, cst.Attribute) and self._host_table(node) \
                and self._moves_to_device(node, name):
            if self.ctx.in_hot_region() and not amortised(self.ctx) and not is_test_path(self.ctx.path):
                self.report(node, "A constant CPU tensor kept on the object is copied to the GPU every step: register "
                                  "it as a buffer (`self.register_buffer(...)`) or move it to the device once, where "
                                  "it is built")
            return
        if self._uploading_helper(node) or not self._constructs:
            return
        source: cst.Call | None = None
        if name == "type_as" and isinstance(node.func, cst.Attribute):
            # `torch.from_numpy(shifts).type_as(gt_boxes)`: a copy to the device of a tensor that lives there
            source = self._host_constructor(node.func.value)
            if source is None or len(node.args) != 1 or not Placement(self.ctx).device_tensor(node.args[0].value):
                return
        elif name in ("to", "cuda") and isinstance(node.func, cst.Attribute):
            source = self._host_constructor(node.func.value)
            if source is None and self._moves_to_device(node, name) and self._host_buffer(node.func.value):
                if self.ctx.in_hot_region() and not amortised(self.ctx) and not is_test_path(self.ctx.path):
                    self.report(node, "A CPU tensor buffer (a replay or rollout store) is indexed and copied to the "
                                      "GPU every step: a blocking pageable copy per call; allocate the buffer on the "
                                      "GPU (`device=`), or pin it and copy with `non_blocking=True`")
                return
            if source is None or not self._moves_to_device(node, name):
                return
        else:
            qual = self.ctx.qualname(node.func) or self._legacy_alias(node.func)
            if qual.startswith("torch.cuda.") and qual.endswith("Tensor") and self._legacy_data(node):
                source = node  # `torch.cuda.FloatTensor(np.random.normal(...))`: built on the host, then copied
            else:
                if not qual.startswith("torch.") or qual.count(".") != 1:
                    return
                if qual[len("torch."):] not in ("tensor", "as_tensor", "asarray"):
                    return
                device = call_arg(node, "device")
                if device is None or not self._device_target(device.value):
                    return
                source = node
        if not self.ctx.in_hot_region() or amortised(self.ctx) or at_episode_end(self.ctx) \
                or is_test_path(self.ctx.path):
            return  # `if step % N == 0:` blocks (eval, sampling, logging) run once every N steps, an `if done:`
            # reset once per episode; tests
        if self._agreement_across_ranks(node):
            return
        data = source.args[0].value if source.args and source.args[0].keyword is None else None
        qual = self.ctx.qualname(source.func) or ""
        if data is not None and qual.endswith(("as_tensor", "asarray")):
            if Placement(self.ctx).of(data) not in (NONTENSOR, HOST) and not self._from_environment(data) \
                    and not self.ctx.evidence.is_cpu_source(data):
                return  # as_tensor of a tensor that may already be on the device is a no-op
        elif data is not None and not qual.endswith("from_numpy") and not LEGACY_HOST_TENSOR.fullmatch(qual):
            # (a legacy CPU type, `torch.FloatTensor(x)`, holds host data whatever `x` is: a CUDA `x` raises)
            if Placement(self.ctx).of(data) in (DEVICE, TENSOR):
                return  # not host data
        if isinstance(data, (cst.List, cst.Tuple)) and not data.elements:
            return  # an empty tensor copies nothing
        constant = data is not None and is_numeric_literal(data)
        if constant and not isinstance(data, (cst.List, cst.Tuple)) or data is not None and _python_scalar(data):
            self.report(node, "Python scalar built into a tensor on the host and copied to the GPU every step: "
                              "`torch.full((), value, device=...)` makes it on the GPU without a copy")
            return
        if constant:
            self.report(node, "Constant tensor rebuilt from Python data and copied to the GPU every step: create it "
                              "once (before the loop, or `self.register_buffer(...)` in a module)")
            return
        if _broadcast_before_move(node):
            self.report(node, "Host data turned into a GPU tensor every step, broadcast on the host first: build the "
                              "small tensor on the device (`device=`) and broadcast it there")
            return
        # (no fix through a program helper: it may also pass a tensor through, which cannot be pinned)
        replacements, imports, note = self._pinned_copy(node, name) if self.ctx.qualname(source.func) or "" \
            .startswith("torch.") else ((), (), None)
        if call_arg(node, "non_blocking") is not None:
            self.report(node, "Host data turned into a GPU tensor every step: `non_blocking=True` cannot overlap a copy "
                              "from freshly allocated pageable memory; copy through a pinned staging buffer, or "
                              "produce the data on the GPU", replacements=replacements, imports=imports, note=note)
            return
        self.report(node, "Host data turned into a GPU tensor every step: a blocking pageable copy per call; use a "
                          "pinned staging buffer with `non_blocking=True`, or produce the data on the GPU",
                    replacements=replacements, imports=imports, note=note)

    def _host_buffer(self, value: cst.BaseExpression) -> bool:
        """`self.state[ind]` where the class keeps `self.state` on the CPU (`torch.zeros((max_size, 4, 84, 84),
        dtype=torch.uint8)`, no `device=`): a replay store indexed on the host."""
        return isinstance(value, cst.Subscript) and isinstance(value.value, cst.Attribute) \
            and dotted_name(value.value.value) == "self" and Placement(self.ctx).of(value.value) == HOST

    def _host_table(self, move: cst.Call) -> bool:
        """`self.discrete_betas.to(x.device)` where the class builds `self.discrete_betas` on the CPU in `__init__`
        (a schedule or a mask made once, no `device=`) and assigns it nowhere else."""
        value = move.func.value  # type: ignore[attr-defined]
        if not (isinstance(value, cst.Attribute) and dotted_name(value.value) == "self"
                and Placement(self.ctx).of(value) == HOST):
            return False
        # (not `self.alpha = self.log_alpha.exp().detach()` every update, a value; nor `self.mask =
        # self.mask.to(dev)`, moved once and kept)
        return not self._assigned_outside_init(value.attr.value)

    def _assigned_outside_init(self, attribute: str) -> bool:
        """Does the enclosing class assign `self.<attribute>` anywhere but in `__init__`? (From the bindings the
        analysis records for the class: each at its statement's order, which falls inside `__init__`'s span or not.)"""
        info = self.ctx.analysis.enclosing_class(self.ctx.ancestors)
        if info is None:
            return False
        order, body = self.ctx.analysis.order, list(info.node.body.body)
        init = next((i for i, m in enumerate(body) if isinstance(m, cst.FunctionDef) and m.name.value == "__init__"),
                    None)
        bindings = info.attrs.get(attribute, ())
        if init is None:
            return bool(bindings)
        start = order.get(id(body[init]), -1)
        end = order.get(id(body[init + 1]), 1 << 30) if init + 1 < len(body) else 1 << 30
        return any(not start < binding.order < end for binding in bindings)

    def _uploading_helper(self, node: cst.Call) -> bool:
        """`tensor(transitions.state)` where the program's `tensor()` builds a tensor from its argument on the host
        and moves it to the device (any file): each call in the step is a host-to-device copy. Reported here
        (the helper's own line is reported when it is hot), without a fix: the helper serves every caller."""
        func = node.func
        called = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) \
            else None
        if called not in self._uploaders or not node.args or node.args[0].keyword is not None:
            return False
        if (self.ctx.qualname(node.func) or "").startswith(("torch.", "numpy.")):
            return False  # `torch.from_numpy(x)` itself, not the program's `ptu.from_numpy(x)` of the same name
        function = self.ctx.enclosing(cst.FunctionDef)
        key = self.ctx.analysis.key_of(function)
        if f"{key}#uploads:{called}" not in self.ctx.analysis.program_keys:
            return False
        if not self.ctx.in_hot_region() or amortised(self.ctx) or is_test_path(self.ctx.path):
            return True
        inside = self.ctx.ancestors[next((i for i, n in enumerate(self.ctx.ancestors) if n is function), 0):]
        if function is not None and not any(isinstance(n, (cst.For, cst.While)) for n in inside) and any(
                self.ctx.analysis.hot.get(id(n)) in (HotKind.STEP_LOOP, HotKind.ROLLOUT)
                for n in walk(function) if isinstance(n, (cst.For, cst.While))):
            return True  # outside the function's own step or rollout loops: once per iteration, not per step
        if Placement(self.ctx).of(node.args[0].value) in (DEVICE, TENSOR):
            return True  # a tensor already (the helper passes tensors through)
        self.report(node, f"`{called}(...)` turns host data into a GPU tensor on every step (it builds the tensor on "
                          "the host and copies it over, blocking); gather the step's host data into one pinned "
                          "buffer copied once with `non_blocking=True`, or keep the data on the GPU")
        return True

    # -- the fix: a pinned copy, copied without blocking ---------------------------------------

    def _pinned_copy(self, node: cst.Call, name: str | None) -> tuple[tuple, tuple, str | None]:
        """(replacements, imports, note): `H.to(D)` -> `H.pin_memory().to(D, non_blocking=True)`. Where the program may
        run without CUDA (`pin_memory()` needs it), the pinning is guarded by `torch.cuda.is_available()`: for
        `name = ...` in two statements, elsewhere inline when the host expression is short."""
        if name in ("to", "cuda") and isinstance(node.func, cst.Attribute):
            host = node.func.value
            host_text = self.ctx.code(host)
            target = None if name == "cuda" else call_arg(node, "device", 0)
            move = node
        else:
            return (), (), None  # `torch.tensor(values, device=d)`: Python data, small; pinning would not pay
        cuda_only = name == "cuda" or (target is not None and self._cuda_literal(target.value))
        moved = _non_blocking(move, self.ctx)
        if "\n" in host_text or "\n" in moved:
            return (), (), None  # continuation lines would lose their indentation in a text edit
        if cuda_only:
            return ((node, f"{host_text}.pin_memory(){moved}"),), (), _PINNED_NOTE
        available, imports = self.ctx.spell("torch.cuda.is_available")
        assign = self.ctx.parent()
        if isinstance(assign, cst.Assign) and assign.value is node and len(assign.targets) == 1 \
                and isinstance(assign.targets[0].target, cst.Name) and standalone_statement(self.ctx, assign):
            bound = assign.targets[0].target.value
            indent, _ = statement_indent(self.ctx)
            text = (f"{bound} = {host_text}\n{indent}"
                    f"{bound} = ({bound}.pin_memory() if {available}() else {bound}){moved}")
            return ((assign, text),), imports, _PINNED_NOTE
        if len(host_text) <= 32:
            return ((node, f"({host_text}.pin_memory() if {available}() else {host_text}){moved}"),), imports, \
                _PINNED_NOTE
        return (), (), None

    def _cuda_literal(self, node: cst.BaseExpression) -> bool:
        """`"cuda"`, `"cuda:0"`, `torch.device("cuda")`, or a name only ever bound to one: the program needs CUDA."""
        if isinstance(node, cst.Name):
            bindings = self.ctx.analysis.bindings_of(node.value, self.ctx.ancestors)
            return bool(bindings) and all(b.kind is BindingKind.ASSIGN and b.value is not None
                                          and self._cuda_literal(b.value) for b in bindings)
        if isinstance(node, cst.Call) and self.ctx.qualname(node.func) == "torch.device" and len(node.args) == 1:
            node = node.args[0].value
        return isinstance(node, cst.SimpleString) and bool(re.fullmatch(r"cuda(:\d+)?", node.evaluated_value or ""))

    # -- helpers -----------------------------------------------------------------------------

    def _legacy_alias(self, func: cst.BaseExpression) -> str:
        """`LongTensor = torch.cuda.LongTensor if use_cuda else torch.LongTensor` bound once at module level:
        the CUDA constructor when every binding names one."""
        if not isinstance(func, cst.Name):
            return ""
        bindings = self.ctx.analysis.bindings_of(func.value, self.ctx.ancestors)
        values = [b.value for b in bindings if b.value is not None]
        if len(values) != len(bindings) or not values:
            return ""
        names: list[str] = []
        for value in values:
            options = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
            names += [self.ctx.qualname(option) or "" for option in options]
        cuda = [n for n in names if n.startswith("torch.cuda.") and n.endswith("Tensor")]
        return cuda[0] if cuda else ""

    def _from_environment(self, data: cst.BaseExpression) -> bool:
        """`obs, rew, term, trunc, _ = env.step(action)`: what a host-side simulator returns (NumPy); also a
        parameter every caller seen passes such a value for (`def act(self, obs)` called as `act(time_step.obs)`)."""
        if not isinstance(data, cst.Name):
            return False
        bindings = Placement(self.ctx).reaching(data.value)
        if bindings and all(b.kind is BindingKind.PARAM for b in bindings):
            return self.ctx.evidence.receives_observation(data.value)
        # (`ary_state, info = env.reset()` after a terminal step reaches the upload as well)
        return bool(bindings) and all(
            b.kind in (BindingKind.UNPACK, BindingKind.ASSIGN) and isinstance(b.value, cst.Call)
            and returns_observation(dotted_name(b.value.func)) for b in bindings)

    def _legacy_data(self, node: cst.Call) -> bool:
        """A legacy constructor given data (a list, a NumPy array), not sizes (`torch.cuda.FloatTensor(8, 4)`);
        also through a name bound to such data (`x = np.array(x).tolist()`, then `FloatTensor(x)`)."""
        if len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
            return False
        data = node.args[0].value
        if isinstance(data, cst.Name):
            bindings = Placement(self.ctx).reaching(data.value)
            return bool(bindings) and all(b.value is not None and _host_data(b.value) for b in bindings)
        return _host_data(data)

    def _agreement_across_ranks(self, node: cst.Call) -> bool:
        """`t = torch.tensor(flag, device=d)` whose only uses are torch.distributed collectives and reading the
        result back: NCCL needs the value on the device, so the copy is the point."""
        parent = self.ctx.parent()
        if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1:
            target = parent.targets[0].target
        elif isinstance(parent, cst.AnnAssign) and parent.value is node:
            target = parent.target
        else:
            return False
        return isinstance(target, cst.Name) and collective_only(self.ctx, target.value)

    def _host_constructor(self, node: cst.BaseExpression, follow_name: bool = True) -> cst.Call | None:
        """`torch.from_numpy(a)` / `torch.tensor(x)` (without device=) under host-only methods like `.float()`;
        also through a name bound to one earlier in the same loop iteration (`x = torch.FloatTensor(a)` then
        `x = x.contiguous().cuda()`)."""
        while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and method_name(node) in _HOST_CHAIN and self.ctx.qualname(node.func) is None:
            node = node.func.value
        if isinstance(node, cst.Name) and follow_name:
            return self._built_this_iteration(node)
        if not isinstance(node, cst.Call):
            return None
        if self.ctx.evidence.samples_host_batch(node):
            return node  # a program function returning tensors it builds on the host
        qual = self.ctx.qualname(node.func) or ""
        if not qual.startswith("torch.") or qual.count(".") != 1:
            return None
        last = qual[len("torch."):]
        if last in _FROM_HOST:
            return node
        if last in _HOST_CHAIN and node.args and node.args[0].keyword is None:  # `torch.unsqueeze(FloatTensor(x), 0)`
            return self._host_constructor(node.args[0].value, follow_name)
        if last in _GATHERS and node.args and self._gathered_on_host(node.args[0].value):
            return node
        if last in _TENSOR_CONSTRUCTORS and call_arg(node, "device") is None \
                and not legacy_sized_allocation(node, qual):  # sizes, not host data: GPU015's case
            return node
        return None

    def _built_this_iteration(self, name: cst.Name) -> cst.Call | None:
        """The host constructor `name` was bound to by the one assignment reaching here, when that assignment
        runs as often as the move does (inside the same innermost loop, or anywhere in the function)."""
        bindings = self.ctx.analysis.reaching_bindings(name.value, self.ctx.ancestors)
        if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN or bindings[0].value is None:
            return None
        loop = next((n for n in reversed(self.ctx.ancestors) if isinstance(n, (cst.For, cst.While, cst.FunctionDef))),
                    None)
        if isinstance(loop, (cst.For, cst.While)) and bindings[0].order < self.ctx.analysis.order.get(id(loop), 0):
            return None  # built once before the loop, moved every iteration: GPU011's case (move it once)
        order = self.ctx.analysis.order
        if not any(order.get(id(statement)) == bindings[0].order for block in self.ctx.ancestors
                   if isinstance(block, (cst.IndentedBlock, cst.Module)) for statement in block.body):
            return None  # bound under a condition the move is not under (`if not torch.is_tensor(x): x = ...`)
        return self._host_constructor(bindings[0].value, follow_name=False)

    def _gathered_on_host(self, sequence: cst.BaseExpression) -> bool:
        """`torch.stack([torch.tensor(r) for r in rows])`, `torch.cat([from_numpy(a), from_numpy(b)])`: pieces
        collected in Python each step, built on the host or not known to be on the device (moving the result
        to the device says the author expects host data)."""
        if isinstance(sequence, (cst.ListComp, cst.GeneratorExp)):
            pieces = [sequence.elt]
        elif isinstance(sequence, (cst.List, cst.Tuple)) and sequence.elements:
            pieces = [element.value for element in sequence.elements]
            if not all(isinstance(piece, cst.Call) and self._host_constructor(piece) for piece in pieces):
                return False  # named tensors: where they live is the caller's business
        elif isinstance(sequence, cst.Name):  # `rows = []`, `rows.append(torch.tensor(r))` in a loop
            placement = Placement(self.ctx)
            kinds = [placement.of(piece) for piece in self._appended(sequence.value)]
            return HOST in kinds and DEVICE not in kinds
        elif isinstance(sequence, cst.Attribute) and isinstance(sequence.value, cst.Name):
            return self._transposed_sample(sequence.value.value)
        else:
            return False
        placement = Placement(self.ctx)
        return all(placement.of(piece) is not DEVICE for piece in pieces)

    def _transposed_sample(self, name: str) -> bool:
        """`batch = Transition(*zip(*transitions))`: the replay-memory idiom that turns sampled transitions into one
        tuple per field; `torch.cat(batch.state)` gathers the stored tensors, and moving the result says they are
        stored on the host."""
        bindings = self.ctx.analysis.reaching_bindings(name, self.ctx.ancestors)
        if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN:
            return False
        value = bindings[0].value
        return isinstance(value, cst.Call) and len(value.args) == 1 and value.args[0].star == "*" \
            and isinstance(value.args[0].value, cst.Call) and dotted_name(value.args[0].value.func) == "zip" \
            and any(arg.star == "*" for arg in value.args[0].value.args)

    def _appended(self, name: str) -> list[cst.BaseExpression]:
        """What the enclosing function appends to `name`, a list it starts empty (none when it is bound otherwise)."""
        bindings = self.ctx.analysis.reaching_bindings(name, self.ctx.ancestors)
        if not bindings or not all(_starts_empty(b) for b in bindings):
            return []
        scope = self.ctx.enclosing(cst.FunctionDef) or self.ctx.analysis.module
        return [call.args[0].value for call in walk(scope) if isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute) and call.func.attr.value == "append"
                and isinstance(call.func.value, cst.Name) and call.func.value.value == name and len(call.args) == 1]

    def _moves_to_device(self, node: cst.Call, name: str) -> bool:
        if name == "cuda":
            return True
        target = call_arg(node, "device", 0)
        value = target.value if target is not None else self._mapped_device(node)
        return value is not None and self._device_target(value)

    def _mapped_device(self, node: cst.Call) -> cst.BaseExpression | None:
        """The device of `.to(**self.tpdv)`, from the mapping's binding."""
        return self.ctx.evidence.mapped_argument(node, "device") if method_name(node) == "to" else None

    def _device_target(self, node: cst.BaseExpression) -> bool:
        kind = Placement(self.ctx).device_kind(node)
        if kind == DEVICE:
            return True
        if kind in (HOST, TENSOR):
            return False
        return bool(_DEVICE_NAME.search(last_name(node) or ""))


_PINNED_NOTE = ("unsafe fix: the host data is copied into pinned memory (PyTorch's caching host allocator recycles the "
                "blocks) and sent without blocking the host; measured on an H100: no change up to a few hundred KB, "
                "x1.35 per step for 4 MB, x5 for 32 MB. On a CPU run the result no longer shares memory with the "
                "NumPy array")


def _non_blocking(move: cst.Call, ctx) -> str:  # noqa: ANN001 - RuleContext
    """The move's `.to(...)` / `.cuda(...)` with `non_blocking=True`."""
    existing = call_arg(move, "non_blocking")
    if existing is not None:
        call = replace_keyword_value(move, "non_blocking", "True") if existing.keyword is not None else move
    else:
        call = add_keyword(move, "non_blocking", "True")
    assert isinstance(call.func, cst.Attribute)
    return "." + ctx.code(call.with_changes(func=cst.Name(call.func.attr.value)))


def _host_data(data: cst.BaseExpression) -> bool:
    """A list, or what NumPy makes (`np.array(x)`, `t.numpy()`, `a.tolist()`)."""
    if isinstance(data, (cst.List, cst.ListComp)):
        return True
    return isinstance(data, cst.Call) and (
        (dotted_name(data.func) or "").startswith(("np.", "numpy.")) or method_name(data) in ("numpy", "tolist"))


def _python_scalar(node: cst.BaseExpression) -> bool:
    """A size read from a tensor or a container: `x.shape[-2]`, `x.size(0)`, `len(batch)`; a limit of a dtype:
    `torch.finfo(dtype).min`."""
    if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute):
        return node.value.attr.value == "shape"
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Call):
        return (dotted_name(node.value.func) or "").rsplit(".", 1)[-1] in ("finfo", "iinfo")
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Name):
            return node.func.value == "len"
        return method_name(node) in ("size", "numel", "dim")
    return False


def _broadcast_before_move(move: cst.Call) -> bool:
    """`torch.tensor(values).expand(shape).to(device)`: pinning would copy the broadcast, not the small source."""
    node = move.func.value if isinstance(move.func, cst.Attribute) else None
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and method_name(node) in _HOST_CHAIN:
        if method_name(node) in _BROADCASTS:
            return True
        node = node.func.value
    return False


def _starts_empty(binding: Binding) -> bool:
    """`rows = []`, or `inputs, targets = [], []`."""
    value = binding.value
    if binding.kind is BindingKind.UNPACK and isinstance(value, cst.Tuple) and len(binding.path) == 1 \
            and binding.path[0] < len(value.elements):
        value = value.elements[binding.path[0]].value
    elif binding.kind is not BindingKind.ASSIGN:
        return False
    return isinstance(value, cst.List) and not value.elements
