from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import (BindingKind, HotKind, call_arg, child_nodes, dotted_name, every_n_steps, method_name,
                              walk)
from gpulint.program import in_cpu_self_test
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
from gpulint.semantic.vocab import ENV_METHODS, SYNCHRONIZE_CALLS, TIMER_READS, is_loss_value


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
# the micro-check's training loop, reading the loss with `read` and converting the list with `after`
_STEPS = ("losses = []\nfor _ in range(50):\n    loss = (model(x) - y).square().mean()\n"
          "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n    losses.append({read})\n"
          "{after}out = torch.tensor(losses)")
_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log"}
_CONVERTING_LOGGERS = re.compile(r"^(fabric|wandb)$")


# SummaryWriter methods and their value argument (keyword, position)
_TENSORBOARD_VALUES = {"add_scalar": ("scalar_value", 1), "add_histogram": ("values", 1)}


def _handing_the_loss(record_body: str, marker: str = "") -> str:
    """An example: an agent hands its loss every update to `Stats.record`, whose body is `record_body`."""
    return f"""
            import torch
            class Stats:
                def record(self, key, value, step):{record_body}
            class Agent:
                def __init__(self, critic, stats):
                    self.critic = critic.cuda()
                    self.optimizer = torch.optim.Adam(self.critic.parameters())
                    self.stats = stats
                def update(self, obs, target, step):
                    critic_loss = (self.critic(obs) - target).pow(2).mean()
                    self.stats.record("critic_loss", critic_loss, step){marker}
                    self.optimizer.zero_grad()
                    critic_loss.backward()
                    self.optimizer.step()
            def train(agent, replay, steps):
                for step in range(steps):
                    agent.update(*replay.sample(), step)
            """

class HostSyncInHotLoop(Rule):
    """
    ## What it does
    Finds operations that copy a GPU tensor's value to the host inside the training step or a model's
    `forward`: `.item()`, `.tolist()`, `.cpu()`, `.to("cpu")`, `float(t)` / `int(t)` / `bool(t)`, and
    printing or formatting a tensor (`print(loss)`, `f"{loss}"`, `"%f" % loss`, `logger.info(..., loss)`,
    `writer.add_scalar(tag, loss)`, `writer.add_histogram(tag, logits)`), and the pre-0.4 `loss.data[0]` on a
    loss or a reduction. It fires only on values with tensor evidence in a program that uses CUDA; values the code keeps on the CPU (NumPy arrays, Python numbers, DataLoader batches not yet moved,
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
    `torch.empty(1).uniform_(a, b)`) are not GPU values either. A loop that times its steps (it reads a clock
    and calls `torch.cuda.synchronize()` on every iteration, directly or through a name bound to it) already
    waits for the GPU each step, so its reads cost nothing more and are not reported; a synchronize that times
    nothing is GPU073's finding, and the reads beside it are reported (they still wait once it goes).

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
    Unsafe fix for the common bookkeeping shapes, as a statement of their own in the loop body:
    `losses.append(loss.item())`, `total += loss.item()` and `stats["key"] += loss.item()` (also times a size,
    `loss.item() * x.size(0)`), where the list, number or dict was bound to a literal (`[]`, `0.0`,
    `{"key": 0.0}`). `.item()` becomes `.detach()`, and the container is converted back to Python numbers once:
    right after the outermost loop that does nothing else with it, and at the top of each `if step % N == 0:`
    block that reads it (the logging interval). Values are the same; sums accumulate on the GPU in the tensor's
    dtype (float32) instead of float64 on the host, so the last digits of a long sum can differ. No fix when
    anything else in the loop reads or rebinds the container, when the loop can end early (`break`, `return`),
    or for other reads (`if loss.item() > x`, `print(loss.item())`): there the program needs the value now.
    """

    code = "GPU005"
    name = "host-sync-in-hot-loop"
    message = "Host sync in the training step: this reads a GPU value on the host and waits for the GPU"
    fix_title = "Keep the values on the device and read them once after the loop"
    severity = Severity.WARNING
    safety = Safety.UNSAFE
    priority = "P1"
    triggers = (".item(", ".tolist(", ".cpu(", ".to(", "print(", "float(", "int(", "bool(", "f\"", "f'", "%",
                ".format(", "log", "add_scalar", "add_histogram", "numpy(", "math.", ".data[0]")
    examples = [
        Invalid(  # a registered buffer lives where its module does: read on the host in every forward
            """
            import torch
            from torch import nn

            class Memory(nn.Module):
                def __init__(self, size, temperature):
                    super().__init__()
                    self.register_buffer("params", torch.tensor([size, temperature]))
                    self.register_buffer("bank", torch.randn(size, 128))

                def forward(self, x):
                    temperature = self.params[1].item()  # error: GPU005
                    return x @ self.bank.t() / temperature

            memory = Memory(4096, 0.07).cuda()
            """
        ),
        Valid(  # a trainer written as a module: its `forward` runs the whole training, read once at its start
            """
            import torch
            from torch import nn

            class Trainer(nn.Module):
                def __init__(self, model, loader):
                    super().__init__()
                    self.model, self.loader = model.cuda(), loader
                    self.optimizer = torch.optim.Adam(self.model.parameters())
                    self.register_buffer("step", torch.tensor(0))

                def forward(self):
                    start = self.step.item()
                    for images in self.loader:
                        self.model(images.cuda(non_blocking=True)).mean().backward()
                        self.optimizer.step()
                    return start
            """
        ),
        Invalid(  # the entries of a dict of losses, each read back every step
            """
            import torch

            def train(model, loader, optimizer, meters):
                for images, targets in loader:
                    loss_dict = model(images.cuda(non_blocking=True), targets.cuda(non_blocking=True))
                    loss = sum(loss_dict.values())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    for name, value in loss_dict.items():
                        meters[name].add(value.item())  # error: GPU005
            """
        ),
        Invalid(  # the norm FSDP's `clip_grad_norm_` returns is a GPU tensor, read every optimizer step
            """
            import torch

            def train(policy, batches, optimizer):
                for batch in batches:
                    policy(batch.cuda(non_blocking=True)).mean().backward()
                    grad_norm = policy.clip_grad_norm_(1.0).item()  # error: GPU005
                    optimizer.step()
            """
        ),
        Valid(  # read only when the caller's flag says so, and the flag is set every 100 steps
            """
            import torch

            def update(model, batch, optimizer, log_details):
                loss = model(batch.cuda(non_blocking=True)).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if log_details:
                    print("loss", loss.item())

            def train(model, loader, optimizer):
                for step, batch in enumerate(loader):
                    if step % 100 == 0:
                        details = True
                    else:
                        details = False
                    update(model, batch, optimizer, details)
            """
        ),
        Valid(  # pre-0.4 code: `.data[0]` of a batch is its first row, not a read (only scalars are read that way)
            """
            import torch
            for step, (x, y) in enumerate(loader):
                x, y = x.cuda(), y.cuda()
                first = x.data[0]
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(  # gradient accumulation: the loop backpropagates, the optimizer steps once after it, so the method
            # is one training step per call; the device total stays a device tensor when numbers are added to it
            """
            import torch
            class Trainer:
                def train(self):
                    total = torch.tensor(0.0).cuda()
                    for i in range(self.accumulate_every):
                        loss = self.D(next(self.loader).cuda(non_blocking=True)).mean() / self.accumulate_every
                        loss.backward()
                        total += loss.detach().item()  # error: GPU005
                    self.D_opt.step()
                    self.d_loss = float(total)  # error: GPU005
            """
        ),
        Invalid(  # pre-0.4 code: `loss.data[0]` and a reduction's `.data[0]` read a scalar as a Python number
            """
            import torch
            for step, (x, y) in enumerate(loader):
                x, y = x.cuda(), y.cuda()
                out = model(x)
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
                history.append(loss.data[0])  # error: GPU005
                norms.append(out.norm(2, dim=1).mean().data[0])  # error: GPU005
            """
        ),
        Valid(  # a collate class's `__call__` runs in the loader's workers on host tensors: `.cpu().item()` is no sync
            """
            import torch
            class PadCollator:
                def __call__(self, features):
                    labels = torch.nn.utils.rnn.pad_sequence([f["labels"] for f in features], batch_first=True)
                    if (labels[:, 0] == self.bos).all().cpu().item():
                        labels = labels[:, 1:]
                    return {"labels": labels}

            collator = PadCollator()
            loader = torch.utils.data.DataLoader(dataset, batch_size=8, collate_fn=collator)
            model = Net().cuda()
            for batch in loader:
                loss = model(batch["labels"].cuda(non_blocking=True)).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a batched analysis pass over stored samples, in chunks, after training: its copies are its output
            """
            import torch
            def analyse(net, boards, targets, batch_size):
                results = []
                with torch.no_grad():
                    for start in range(0, len(boards), batch_size):
                        x = boards[start:start + batch_size].to("cuda", non_blocking=True)
                        value, policy = net(x)
                        results.append(value.cpu().numpy())
                return results
            """
        ),
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
        Invalid(  # a multi-agent critic update: it loops over agents to build one loss, then steps once, so each
            # call is one training step; `if logger is not None:` asks whether a logger was given, not how often
            """
            import torch
            class MultiAgentSAC:
                def update_critic(self, sample, logger=None):
                    q_loss = 0
                    for critic, (obs, target) in zip(self.critics, sample):
                        q_loss += torch.nn.functional.mse_loss(critic(obs.cuda()), target.cuda())
                    q_loss.backward()
                    self.critic_optimizer.step()
                    self.critic_optimizer.zero_grad()
                    if logger is not None:
                        logger.add_scalar("losses/q_loss", q_loss, self.niter)  # error: GPU005
            def run(model, buffer, logger, steps):
                for t in range(steps):
                    buffer.push(env_step())
                    if t % 100 == 0:
                        for _ in range(4):
                            model.update_critic(buffer.sample(1024), logger=logger)
            """
        ),
        Valid(  # an on-policy update: it fits the value function in a loop of steps, then takes one policy step,
            # once per rollout of thousands of environment steps; its losses are read once per update
            """
            import torch
            class VPG:
                def train_model(self, obs, act, ret, adv):
                    for _ in range(self.train_vf_iters):
                        vf_loss = torch.nn.functional.mse_loss(self.vf(obs).squeeze(1), ret)
                        self.vf_optimizer.zero_grad()
                        vf_loss.backward()
                        self.vf_optimizer.step()
                    policy_loss = -(self.policy(obs, act) * adv).mean()
                    self.policy_optimizer.zero_grad()
                    policy_loss.backward()
                    self.policy_optimizer.step()
                    self.policy_losses.append(policy_loss.item())
                def run(self, env, max_step):
                    obs = env.reset()
                    for step in range(max_step):
                        obs, reward, done, _ = env.step(self.act(torch.as_tensor(obs, device="cuda")))
                        if step % self.sample_size == 0:
                            self.train_model(*self.buffer.get())
            """
        ),
        Invalid(  # a synchronize that times nothing (GPU073): the reads around it wait for the GPU all the same
            """
            import math
            import torch
            for images, _ in loader:
                loss = criterion(model(images.cuda(non_blocking=True)))
                if not math.isfinite(loss.item()):  # error: GPU005
                    raise SystemExit("loss diverged")
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
                meter.update(loss=loss.item())  # error: GPU005
            """
        ),
        Invalid(  # a method running the class's update steps is a step itself; a helper moving each item of a
            # batch to the device gives device tensors
            """
            import torch

            def to_torch(xs, device):
                return tuple(torch.as_tensor(x, device=device) for x in xs)

            class Agent:
                def __init__(self, critic, device="cuda"):
                    self.device = device
                    self.critic = critic.to(device)
                    self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=1e-4, fused=True)

                def update_critic(self, obs, reward):
                    loss = (self.critic(obs) - reward).pow(2).mean()
                    self.critic_opt.zero_grad(set_to_none=True)
                    loss.backward()
                    self.critic_opt.step()

                def update(self, replay_iter):
                    obs, reward = to_torch(next(replay_iter), self.device)
                    metrics = {"batch_reward": reward.mean().item()}  # error: GPU005
                    self.update_critic(obs, reward)
                    return metrics
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
        Invalid(  # a Fabric loop: the loss is proven a tensor by `fabric.backward(...)`, the batches come from a
            # loader the script set up for the device, and a log interval of 1 is every step
            """
            import lightning as L
            import torch
            log_interval = 1
            def train(fabric, model, optimizer, train_dataloader):
                for iter_num, train_data in enumerate(train_dataloader):
                    loss = compute_loss(model, train_data)
                    fabric.backward(loss / 4)
                    optimizer.step()
                    if iter_num % log_interval == 0:
                        fabric.log_dict({"train_loss": loss, "iter": iter_num})
                        fabric.print(f"loss {loss.item():.4f}")
            fabric = L.Fabric(accelerator="cuda", precision="bf16-mixed")
            train(fabric, model, optimizer, fabric.setup_dataloaders(loader))
            """,
            count=2,
        ),
        Valid(  # the same loop logging every 100 steps
            """
            import lightning as L
            import torch
            log_interval = 100
            def train(fabric, model, optimizer, train_dataloader):
                for iter_num, train_data in enumerate(train_dataloader):
                    loss = compute_loss(model, train_data)
                    fabric.backward(loss / 4)
                    optimizer.step()
                    if iter_num % log_interval == 0:
                        fabric.log_dict({"train_loss": loss, "iter": iter_num})
                        fabric.print(f"loss {loss.item():.4f}")
            fabric = L.Fabric(accelerator="cuda", precision="bf16-mixed")
            train(fabric, model, optimizer, fabric.setup_dataloaders(loader))
            """
        ),
        Invalid(  # the update runs every 4 environment steps: that branch is the training step, not a log interval
            """
            import torch
            log_alpha = torch.zeros(1, requires_grad=True, device="cuda")
            for global_step in range(1_000_000):
                obs, reward, done, info = env.step(policy.act(obs))
                if global_step % 4 == 0:
                    loss = critic_loss(buffer.sample(64))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    alpha = log_alpha.exp().item()
            """,
            count=1,
        ),
        Invalid(  # an action sampled from a distribution over a network's output, read back every move
            """
            import torch
            from torch.distributions import Categorical
            policy = Policy().cuda()
            def act(logits):
                return Categorical(logits=logits).sample().item()
            for t in range(horizon):
                with torch.no_grad():
                    logits = policy(obs)
                obs, reward, done, info = env.step(act(logits))
            """,
            count=1,
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
        Invalid(  # reads on one line are one finding (the GPU is idle after the first); each further line one more
            """
            import torch
            for x, y in loader:
                out = model(x.cuda())
                loss = criterion(out, y.cuda())
                loss.backward()
                optimizer.step()
                logged = (loss.item(), out.mean().item(),
                          out.std().item())
                history.append(logged)
            """,
            count=2,
        ),
        Invalid(  # a search's network call: outputs of the network's own methods and of a tensor helper, read back
            """
            import torch
            def expected_value(logits, n):
                return (torch.softmax(logits, -1) * torch.arange(n, device=logits.device)).sum(-1)
            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = torch.nn.Linear(4, 8)
                def prediction(self, h):
                    return self.body(h), self.body(h)
                @torch.no_grad()
                def inference(self, x):
                    logits, value = self.prediction(x)
                    value = expected_value(value, 8)
                    probs = logits.squeeze(0).cpu().numpy()
                    value = value.squeeze(0).cpu().item()
                    return probs, value
            def search(net, state, simulations):
                for _ in range(simulations):
                    policy, value = net.inference(state)
            def play(env, net):
                state, done = env.reset(), False
                while not done:
                    search(net, state, 50)
                    state, reward, done, _ = env.step(0)
            net = Net().to("cuda")
            """,
            count=2,
        ),
        Invalid(  # a program helper that reads its argument back (`.item()` inside), handed the loss every step
            _handing_the_loss("""
                    if torch.is_tensor(value):
                        value = value.item()
                    self.rows.append((key, value, step))""", "  # error: GPU005")
        ),
        Valid(  # the helper reads its argument only every N calls
            _handing_the_loss("""
                    if step % 1000 == 0:
                        self.rows.append((key, value.item(), step))""")
        ),
        Invalid(  # a network held by an attribute, proven one by its optimizer; its Q-values logged every step
            """
            import torch
            class Agent:
                def __init__(self, env):
                    self.device = "cuda:0"
                    self.q_network = self.create_network()
                    self.optimizer = torch.optim.Adam(self.q_network.parameters())
                    self.env = env
                def act(self, obs):
                    with torch.no_grad():
                        q_values = self.q_network(torch.from_numpy(obs).to(self.device))
                    self.logger.info("Q values {}".format(q_values))
                    return self.explore(q_values)
                def run(self):
                    while not self.done:
                        self.obs, self.reward, self.done, _ = self.env.step(self.act(self.obs))
            """,
            count=1,
        ),
        Invalid(  # a formatted tensor on another line of a statement that already reads: still one finding
            """
            import torch
            for x, y in loader:
                out = model(x.cuda())
                loss = criterion(out, y.cuda())
                loss.backward()
                optimizer.step()
                print(f"loss {loss.item():.4f}",
                      f"mean output {out.mean()}")
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
        Invalid(  # per-step reads of the loss into a list: kept on the device, read once when the loop ends
            """
            import torch
            import torch.nn.functional as F

            def train(model, loader, optimizer):
                losses = []
                for x, y in loader:
                    loss = F.cross_entropy(model(x.cuda()), y.cuda())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    losses.append(loss.item())
                return sum(losses) / len(losses)
            """,
            fixed="""
            import torch
            import torch.nn.functional as F

            def train(model, loader, optimizer):
                losses = []
                for x, y in loader:
                    loss = F.cross_entropy(model(x.cuda()), y.cuda())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    losses.append(loss.detach())
                losses[:] = [v.item() if isinstance(v, torch.Tensor) else v for v in losses]
                return sum(losses) / len(losses)
            """,
        ),
        Invalid(  # a logging helper the step calls: every caller passes it the GPU loss, so its parameter is one
            """
            import torch
            import torch.nn.functional as F

            def log_metrics(writer, loss, step):
                writer.add_scalar("train/loss", loss, step)  # error: GPU005
                print(f"step {step}: loss {loss:.4f}")  # error: GPU005

            def train(model, loader, optimizer, writer):
                for step, (x, y) in enumerate(loader):
                    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
                    loss = F.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    log_metrics(writer, loss, step)
            """,
        ),
        Invalid(  # a read-back helper written as a lambda, applied to metrics every update
            """
            import torch
            to_np = lambda x: x.detach().cpu().numpy()

            def train_step(model, optimizer, batch):
                loss = model(batch.cuda()).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                return {"loss": to_np(loss)}  # error: GPU005

            def train(model, optimizer, loader):
                for batch in loader:
                    metrics = train_step(model, optimizer, batch)
            """,
        ),
        Valid(  # a static helper converts its second argument, a Python number; the tensor is its first
            """
            import torch
            import torch.nn as nn

            class RPN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(512, 18, 1)

                @staticmethod
                def reshape(x, d):
                    return x.view(x.size(0), int(d), -1, x.size(3))

                def forward(self, features):
                    scores = self.conv(features)
                    return self.reshape(scores, 2).softmax(1)
            rpn = RPN().cuda()
            """,
        ),
        Valid(  # the same helper, but one caller passes a Python number: the parameter is not proven a tensor
            """
            import torch
            import torch.nn.functional as F

            def log_metrics(writer, loss, step):
                writer.add_scalar("train/loss", loss, step)

            def train(model, loader, optimizer, writer):
                for step, (x, y) in enumerate(loader):
                    loss = F.cross_entropy(model(x.cuda()), y.cuda())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    log_metrics(writer, loss, step)
                log_metrics(writer, loss.item(), -1)
            """,
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

    # 50 optimizer steps of a small MLP, the loss read every step vs kept on the device and read after the loop
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup=("model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))\n"
               "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
               "x = torch.randn(64, 256)\ny = torch.randn(64, 1)"),
        before=_STEPS.format(read="loss.item()", after=""),
        after=_STEPS.format(read="loss.detach()",
                            after="losses[:] = [v.item() if isinstance(v, torch.Tensor) else v for v in losses]\n"),
        compare=("out",),
    )

    def __init__(self, ctx: RuleContext) -> None:
        super().__init__(ctx)
        self._enabled = ctx.targets_cuda()
        self._reported_statements: dict[int, list[cst.CSTNode]] = {}  # id(statement) -> the reads reported in it
        self._synchronizing_loops: dict[int, bool] = {}
        # names of program helpers this file's functions hand an argument that they read back (usually none)
        self._reading_helpers = {key.split("#reads-argument:", 1)[1].split(":", 1)[0]
                                 for key in ctx.analysis.program_keys if "#reads-argument:" in key}
        # and of helpers that return their argument read back (`def to_cpu(t): return t.detach().cpu()`)
        self._downloading_helpers = {key.split("#downloads:", 1)[1]
                                     for key in ctx.analysis.program_keys if "#downloads:" in key}

    # -- where are we ------------------------------------------------------------------------

    def _region_severity(self) -> Severity | None:
        kind = self.ctx.hot_kind()
        if (kind is not None or self._innermost_loop() is not None) and on_error_path(self.ctx):
            return None  # reporting a failure: runs once, when the run stops
        if amortised(self.ctx) or self.ctx.in_test_code() or after_init_once_guard(self.ctx):
            return None  # already read every N steps, as the message advises; a test's assertion is its purpose
        function = self.ctx.enclosing(cst.FunctionDef)
        if function is not None and f"{self.ctx.analysis.key_of(function)}#collate" in self.ctx.analysis.program_keys:
            return None  # a loader's collate function assembles host batches: what it reads is already on the host
        loop = self._innermost_loop()
        if loop is not None and self._synchronizes_every_iteration(loop):
            return None  # the host already waits for the GPU each iteration (to time it): this read adds no wait
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
        """The loop synchronizes on every iteration to time its steps (a clock is read in it). A synchronize that
        times nothing is GPU073's finding: once it goes, this read is the iteration's wait."""
        key = id(loop)
        if key not in self._synchronizing_loops:
            self._synchronizing_loops[key] = any(self._synchronizes(s) for s in _unconditional(loop.body)) and any(
                isinstance(n, cst.Call) and self.ctx.qualname(n.func) in TIMER_READS for n in walk(loop.body))
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

    def _on_a_line_of_its_own(self, reported: list[cst.CSTNode], node: cst.CSTNode) -> bool:
        """Is `node` on another line than the reads already reported in its statement (a tuple of `.item()`s
        written over several lines)? Positions come from one code generation, needed only for such statements."""
        from gpulint.engine import node_positions  # the engine imports the rules' base: import at use

        positions = node_positions(self.ctx.module, [*reported, node])
        return positions[id(node)][0] not in {positions[id(n)][0] for n in reported}

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
        if in_cpu_self_test(self.ctx):
            return
        statement = next((n for n in reversed(self.ctx.ancestors)
                          if isinstance(n, (cst.SimpleStatementLine, cst.BaseCompoundStatement))), None)
        if statement is not None:
            reported = self._reported_statements.setdefault(id(statement), [])
            # one finding per statement (after its first read the GPU is idle, the rest are cheap), except an
            # explicit read (`.item()`, `.cpu()`, `float(t)`) on a line of its own: a tuple of reads written over
            # lines is several reads a reviewer sees; formatting, whose tensors are inferred, adds nothing more
            if reported and not (_explicit_read(node) and self._on_a_line_of_its_own(reported, node)):
                return
            reported.append(node)
        if severity is Severity.WARNING and self._feeds_environment():
            self.report(node, f"{what} feeds a host-side environment: a GPU sync every environment step; for "
                              "small policies consider acting on the CPU, or a GPU-vectorised environment",
                        severity=Severity.INFO)
            return
        if severity is Severity.WARNING and self.ctx.hot_kind() is HotKind.ROLLOUT and any(
                id(n) in self.ctx.analysis.acting for n in self.ctx.ancestors):
            self.report(node, f"{what} in a rollout or search step: the host waits for the GPU every move or "
                              "simulation; read the outputs back in one copy, evaluate many environments or "
                              "positions per call, or run a small network on the CPU", severity=severity)
            return
        suffix = " (inside an evaluation block: informational)" if severity is Severity.INFO else ""
        replacements, imports = (), ()
        if severity is Severity.WARNING and isinstance(node, cst.Call) and method_name(node) == "item":
            plan = _deferred_read(self.ctx, node)
            if plan is not None:
                replacements, imports = plan
        self.report(node, f"{what}: reads a GPU value on the host and waits for all queued GPU work; accumulate "
                          f"on the device and read it every N steps{suffix}", severity=severity,
                    replacements=replacements, imports=imports, note=_DEFER_NOTE if replacements else None)

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
            elif name in ("log_dict", "log") and _CONVERTING_LOGGERS.match(last_name(func.value) or ""):
                # `fabric.log_dict({"loss": loss})`, `wandb.log({"loss": loss})`: the logger reads each tensor
                # value with `.item()` right away (Lightning's own `self.log` defers it: not matched)
                for arg in node.args:
                    values = [e.value for e in arg.value.elements if isinstance(e, cst.DictElement)] \
                        if isinstance(arg.value, cst.Dict) else [arg.value] if arg.keyword is None and name == "log" \
                        and arg is not node.args[0] else []
                    candidates.extend((value, value, "logging a tensor") for value in values)  # type: ignore[misc]
            elif name in _TENSORBOARD_VALUES:  # TensorBoard converts the value with `.cpu().numpy()` right away
                keyword, position = _TENSORBOARD_VALUES[name]
                value = call_arg(node, keyword, position)
                if value is not None:
                    candidates.append((value.value, value.value, f"`{name}` of a tensor"))  # type: ignore[arg-type]
        elif isinstance(func, cst.Name) and not self.ctx.analysis.bindings_of(func.value, self.ctx.ancestors):
            if func.value in ("float", "int", "bool") and len(node.args) == 1 and not node.args[0].star:
                candidates.append((node, node.args[0].value, f"`{func.value}(tensor)`"))  # type: ignore[arg-type]
            elif func.value == "print":
                candidates.extend((a.value, a.value, "printing a tensor") for a in node.args  # type: ignore[misc]
                                  if not a.star and a.keyword is None)
        candidates.extend(self._read_by_helper(node))  # a program helper reads an argument back
        if not candidates:
            return
        severity = self._region_severity()
        if severity is None:
            return
        placement = Placement(self.ctx)
        for report_node, value, what in candidates:  # type: ignore[misc]
            if severity is Severity.INFO and report_node is node and (name in ("cpu", "to", "numpy")
                                                                      or self._downloaded(node) is not None):
                continue  # an evaluation result copied out to be saved or scored: the copy is the output
            if (placement.may_be_on_device(value) or what == "`.item()`" and (
                    _names_a_loss(value) or self._entry_of_losses(value)) and placement.of(value) is None
                    or what == "`.cpu()`" and self._unplaced_read(value, placement)) \
                    and not collective_read_back(self.ctx, value):
                self._emit(report_node, what, severity)

    def _entry_of_losses(self, value: cst.BaseExpression) -> bool:
        """`v` of `for k, v in loss_dict.items()` (or of a comprehension over it, or of `losses.values()`): an entry
        of a mapping its name says holds losses, read one by one (`{k: v.item() for k, v in train_loss.items()}`)."""
        if not isinstance(value, cst.Name):
            return False
        comprehension = self.ctx.evidence.comprehension_source(value.value)
        sources = [comprehension] if comprehension is not None else [
            (b.value, b.path) for b in self.ctx.analysis.reaching_bindings(value.value, self.ctx.ancestors)
            if b.kind is BindingKind.FOR and b.value is not None]
        return any(isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute) and not iterable.args
                   and (iterable.func.attr.value, path) in (("items", (1,)), ("values", ()))
                   and is_loss_value(last_name(iterable.func.value) or "") for iterable, path in sources)

    def _unplaced_read(self, value: cst.BaseExpression, placement: Placement) -> bool:
        """`x.cpu()` of a value whose placement is unknown (a parameter, an attribute) in a program that trains on
        CUDA: only tensors (and modules) have `.cpu()`, and nobody copies a CPU tensor to the CPU."""
        return placement.of(value) is None and self.ctx.evidence.is_module(value) is None \
            and (self.ctx.analysis.cuda_evidence or self.ctx.program.cuda_evidence) \
            and not placement.computed_on_host(value) and not _set_to_a_mode(value, placement) \
            and not self._offloaded(value) and not _after_a_sync(value)

    def _offloaded(self, value: cst.BaseExpression) -> bool:
        """`weight.data = weight.data.cpu()`: the tensor is moved to the host on purpose (offloading), not read."""
        statement = next((n for n in reversed(self.ctx.ancestors) if isinstance(n, cst.SimpleStatementLine)), None)
        text = dotted_name(value)
        return text is not None and statement is not None and any(
            isinstance(small, cst.Assign) and any(dotted_name(t.target) == text for t in small.targets)
            for small in statement.body)

    def _read_by_helper(self, call: cst.Call) -> list[tuple[cst.CSTNode, cst.BaseExpression, str]]:
        """Arguments a program helper reads back to the host unconditionally (`def log(self, key, value, step):
        value = value.item()`), from the call graph's `#reads-argument:` markers for this call; the argument of a
        helper returning it read back (`#downloads:` markers)."""
        called = last_name(call.func)
        if not called or called not in self._reading_helpers and called not in self._downloading_helpers:
            return []
        downloaded = self._downloaded(call)
        if downloaded is not None:
            # in a training step; in a rollout it is mostly the action the environment needs (the helper's own
            # line is judged where it is written, as well)
            return [] if self.ctx.hot_kind() is HotKind.ROLLOUT else \
                [(call, downloaded, f"`{called}()` copying a tensor to the host")]
        prefix = f"{self.ctx.analysis.key_of(self.ctx.enclosing(cst.FunctionDef))}#reads-argument:{called}:"
        found = []
        for key in self.ctx.analysis.program_keys:
            if key.startswith(prefix):
                slot = key[len(prefix):]
                arg = call_arg(call, slot) if not slot.isdigit() else call_arg(call, "", int(slot))
                if arg is not None and not arg.star:
                    found.append((arg.value, arg.value, f"`{called}()` reading a tensor back"))
        return found

    def _downloaded(self, call: cst.Call) -> cst.BaseExpression | None:
        """The one argument of a call to a program helper that returns it read back to the host (`to_cpu(loss)`,
        `to_np(q)`: the call graph's `#downloads:` markers)."""
        called = last_name(call.func)
        if called not in self._downloading_helpers or len(call.args) != 1 or call.args[0].keyword is not None \
                or call.args[0].star:
            return None
        key = self.ctx.analysis.key_of(self.ctx.enclosing(cst.FunctionDef))
        return call.args[0].value if f"{key}#downloads:{called}" in self.ctx.analysis.program_keys else None

    def visit_FormattedStringExpression(self, node: cst.FormattedStringExpression) -> None:
        if not self._enabled:
            return
        severity = self._region_severity()
        if severity is None:
            return
        if Placement(self.ctx).may_be_on_device(node.expression):
            self._emit(node.expression, "formatting a tensor in an f-string", severity)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        """`loss.data[0]`: before torch 0.4 the way to read a scalar tensor as a Python number (today `.item()`;
        on a 0-dim tensor it now raises). Only on values that are scalars by name or by a reduction: `x.data[0]`
        of a batch is its first row, not a read."""
        if not self._enabled or not (isinstance(node.value, cst.Attribute) and node.value.attr.value == "data"
                                     and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
                                     and isinstance(node.slice[0].slice.value, cst.Integer)
                                     and node.slice[0].slice.value.value == "0"):
            return
        value = node.value.value
        reduced = isinstance(value, cst.Call) and method_name(value) in _REDUCTIONS
        if not (reduced or _names_a_loss(value)):
            return
        severity = self._region_severity()
        placement = Placement(self.ctx)
        if severity is not None and (placement.may_be_on_device(value) or placement.of(value) is None):
            self._emit(node, "`.data[0]` (the pre-0.4 `.item()`)", severity)

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


def _after_a_sync(value: cst.BaseExpression) -> bool:
    """`mask.nonzero().squeeze().cpu()`: the op producing the value already waited for the GPU (its output size
    depends on the data), so copying its small result adds no wait."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if method_name(value) in ("nonzero", "unique", "masked_select", "unique_consecutive"):
            return True
        value = value.func.value
    return False


def _set_to_a_mode(value: cst.BaseExpression, placement: Placement) -> bool:
    """`snapshot = copy.deepcopy(ema).eval()`: only modules have `.eval()` / `.train()` (its `.cpu()` is a move)."""
    if isinstance(value, cst.Name):
        bindings = placement.reaching(value.value)
        value = bindings[0].value if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN else None
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if method_name(value) in ("eval", "train"):
            return True
        value = value.func.value
    return False


def _explicit_read(node: cst.CSTNode) -> bool:
    """`t.item()`, `t.cpu()`, `t.tolist()`, `float(t)`: a read written as such, not a formatted or logged value."""
    if not isinstance(node, cst.Call):
        return False
    if isinstance(node.func, cst.Name):
        return node.func.value in ("float", "int", "bool")
    return method_name(node) in ("item", "tolist", "cpu", "numpy", "to")


# -- the fix: accumulate on the device, read once after the loop ---------------------------------------------

_DEFER_NOTE = ("unsafe fix: the values stay on the device (`.detach()`) and are read back once, after the loop "
               "(or where an every-N-steps block reads them); sums accumulate in the tensor's dtype on the GPU "
               "instead of float64 on the host")
_SIZE_CALLS = {"len", "size", "numel", "dim"}


def _deferred_read(ctx: RuleContext, call: cst.Call
                   ) -> tuple[tuple[tuple[cst.CSTNode, cst.CSTNode], ...], tuple] | None:
    """`losses.append(loss.item())` / `total += loss.item()` / `stats["k"] += loss.item()` as a statement of its
    own in the body of a loop: the loop with `.item()` made `.detach()` and the container converted back to
    Python numbers when the loop ends (an `else:` clause, which runs after the last iteration) and at the top of
    every `if step % N == 0:` block that reads it. None where that is not provably all the loop does with it."""
    ancestors = ctx.ancestors
    line_at = next((i for i in range(len(ancestors) - 1, -1, -1) if isinstance(ancestors[i], cst.SimpleStatementLine)),
                   None)
    if line_at is None or line_at < 2:
        return None
    line, block, loop = ancestors[line_at], ancestors[line_at - 1], ancestors[line_at - 2]
    if len(line.body) != 1 or not isinstance(loop, (cst.For, cst.While)) or loop.body is not block:
        return None
    target = _accumulation_target(line.body[0], call)
    if target is None:
        return None
    root, key = target
    function = next((n for n in reversed(ancestors[:line_at]) if isinstance(n, (cst.FunctionDef, cst.Lambda))), None)
    if isinstance(function, cst.Lambda) or not _literal_start(ctx, root, key, line.body[0]):
        return None
    # the outermost enclosing loop (within the function) whose other statements never read the container, except
    # in every-N-steps blocks
    outer_at = line_at - 2
    for index in range(line_at - 3, -1, -1):
        node = ancestors[index]
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            break
        if isinstance(node, (cst.For, cst.While)):
            if _conflicting_refs(ctx, node, root, key, line) is None:
                break
            outer_at = index
    outer = ancestors[outer_at]
    assert isinstance(outer, (cst.For, cst.While))
    amortised_blocks = _conflicting_refs(ctx, outer, root, key, line)
    if amortised_blocks is None or _leaves_early(outer):
        return None
    tensor, imports = ctx.spell("torch.Tensor")
    if key is None and isinstance(line.body[0], cst.Expr):
        convert = f"{root}[:] = [v.item() if isinstance(v, {tensor}) else v for v in {root}]"
    else:
        item = root if key is None else f"{root}[{ctx.code(key)}]"
        convert = f"{item} = {item}.item() if isinstance({item}, {tensor}) else {item}"
    # the conversion goes right after the loop: before the next statement when that is a simple one, else in an
    # `else:` clause of the loop (it runs once the last iteration is done; the loop has no `break`)
    parent = ancestors[outer_at - 1] if outer_at >= 1 else None
    following = None
    if isinstance(parent, (cst.IndentedBlock, cst.Module)):
        body = list(parent.body)
        at = next(i for i, statement in enumerate(body) if statement is outer)
        following = body[at + 1] if at + 1 < len(body) else None
    if isinstance(following, cst.SimpleStatementLine) and not following.leading_lines:
        new_loop = outer.visit(_Defer(call, convert, amortised_blocks, in_else=False))
        default = ctx.module.default_indent
        indent = "".join(b.indent if b.indent is not None else default for b in ancestors[:outer_at]
                         if isinstance(b, cst.IndentedBlock))
        first = following.body[0]
        return ((outer, new_loop), (first, f"{convert}\n{indent}{ctx.code(first).rstrip()}")), imports
    if _ends_with_comment(outer):
        return None  # an `else:` clause would come after the comment closing the loop's last line
    new_loop = outer.visit(_Defer(call, convert, amortised_blocks, in_else=True))
    return ((outer, new_loop),), imports


def _ends_with_comment(node: cst.CSTNode) -> bool:
    last = None
    stack = [node]
    while stack:  # pre-order in source order: the last simple statement seen ends the node
        current = stack.pop()
        if isinstance(current, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            last = current
            continue
        stack.extend(reversed(child_nodes(current)))
    trailing = last.trailing_whitespace if last is not None else None
    return trailing is not None and trailing.comment is not None


def _accumulation_target(small: cst.BaseSmallStatement, call: cst.Call
                         ) -> tuple[str, cst.BaseExpression | None] | None:
    """(container name, subscript key or None) of `name.append(E)` / `name += E` / `name[key] += E`, where E is
    the `.item()` call, possibly in arithmetic with Python sizes (`loss.item() * x.size(0)`)."""
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and method_name(small.value) == "append" \
            and isinstance(small.value.func, cst.Attribute) and isinstance(small.value.func.value, cst.Name) \
            and len(small.value.args) == 1 and small.value.args[0].keyword is None and not small.value.args[0].star:
        value, root, key = small.value.args[0].value, small.value.func.value.value, None
    elif isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign):
        value, key = small.value, None
        target = small.target
        if isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and len(target.slice) == 1 \
                and isinstance(target.slice[0].slice, cst.Index) \
                and isinstance(target.slice[0].slice.value, (cst.SimpleString, cst.Integer)):
            root, key = target.value.value, target.slice[0].slice.value
        elif isinstance(target, cst.Name):
            root = target.value
        else:
            return None
    else:
        return None
    if not _only_sizes_besides(value, call):
        return None
    return root, key


def _only_sizes_besides(value: cst.BaseExpression, call: cst.Call) -> bool:
    """`value` is `call`, or arithmetic of it with names, numbers and sizes (`len(x)`, `x.size(0)`)."""
    if value is call:
        return True
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract, cst.Multiply,
                                                                             cst.Divide)):
        found = [n for n in walk(value) if n is call]
        if not found:
            return False
        inside = {id(n) for n in walk(call)}
        for node in walk(value):
            if id(node) in inside or not isinstance(node, cst.Call):
                continue
            name = node.func.value if isinstance(node.func, cst.Name) else method_name(node)
            if name not in _SIZE_CALLS:
                return False
        return True
    return False


def _literal_start(ctx: RuleContext, root: str, key: cst.BaseExpression | None, small: cst.CSTNode) -> bool:
    """Every binding of the container is a literal: `[]` for a list, a number for a sum, a dict literal holding a
    number under `key`; so converting back gives the Python values the original had."""
    bindings = ctx.analysis.bindings_of(root, ctx.ancestors)
    if not any(b.kind in (BindingKind.ASSIGN, BindingKind.UNPACK) for b in bindings):
        return False
    for binding in bindings:
        value = binding.value
        if binding.kind is BindingKind.AUGMENT:
            continue  # `total += ...` itself
        if binding.kind is BindingKind.UNPACK and key is None and not isinstance(small, cst.Expr):
            value = _unpacked(value, binding.path)  # `running, correct = 0.0, 0`
        elif binding.kind is not BindingKind.ASSIGN:
            return False
        if value is None:
            return False
        if isinstance(small, cst.Expr):
            if not isinstance(value, cst.List) or value.elements:
                return False
        elif key is None:
            if not _number(value):
                return False
        else:
            if not isinstance(value, cst.Dict):
                return False
            entries = [e for e in value.elements if isinstance(e, cst.DictElement)
                       and ctx.code(e.key) == ctx.code(key)]
            if len(entries) != 1 or not _number(entries[0].value):
                return False
    return True


def _unpacked(value: cst.BaseExpression | None, path: tuple[int, ...]) -> cst.BaseExpression | None:
    """The element of the right-hand side `x, y` that a name of `a, b = x, y` receives (its index path)."""
    for index in path:
        if not isinstance(value, (cst.Tuple, cst.List)) or index >= len(value.elements) or any(
                isinstance(e, cst.StarredElement) for e in value.elements):
            return None
        value = value.elements[index].value
    return value


def _number(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float))


def _conflicting_refs(ctx: RuleContext, loop: cst.CSTNode, root: str, key: cst.BaseExpression | None,
                      line: cst.CSTNode) -> list[cst.If] | None:
    """The every-N-steps `if` blocks of `loop` that read the container, or None when something else in the loop
    reads or rebinds it (another key of the same dict does not count)."""
    skip = {id(n) for n in walk(line)}
    blocks: list[cst.If] = []
    stack: list[tuple[cst.CSTNode, cst.If | None, cst.CSTNode | None]] = [(loop, None, None)]
    while stack:
        node, amortised_if, parent = stack.pop()
        if id(node) in skip:
            continue
        if isinstance(node, cst.Name) and node.value == root:
            if key is not None and isinstance(parent, cst.Subscript) and parent.value is node \
                    and len(parent.slice) == 1 and isinstance(parent.slice[0].slice, cst.Index) \
                    and isinstance(parent.slice[0].slice.value, (cst.SimpleString, cst.Integer)) \
                    and ctx.code(parent.slice[0].slice.value) != ctx.code(key):
                continue  # another accumulator of the same dict
            if amortised_if is None:
                return None
            if not any(b is amortised_if for b in blocks):
                blocks.append(amortised_if)
            continue
        if isinstance(node, cst.If) and amortised_if is None and every_n_steps(ctx.analysis, node.test):
            for child in child_nodes(node):
                stack.append((child, node if child is node.body else None, node))
            continue
        for child in child_nodes(node):
            stack.append((child, amortised_if, node))
    return blocks


def _leaves_early(loop: cst.For | cst.While) -> bool:
    """A `break` of this loop, or a `return`/`yield` anywhere in it: its `else:` clause would not run."""
    stack: list[tuple[cst.CSTNode, bool]] = [(child, True) for child in child_nodes(loop.body)]
    while stack:
        node, own = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if isinstance(node, (cst.Return, cst.Yield)) or (own and isinstance(node, cst.Break)):
            return True
        nested = isinstance(node, (cst.For, cst.While))
        for child in child_nodes(node):
            stack.append((child, own and not (nested and child is node.body)))
    return False


class _Defer(cst.CSTTransformer):
    """`.item()` -> `.detach()` at the site; the conversion at the top of the given `if` blocks and in `else:`."""

    def __init__(self, call: cst.Call, convert: str, blocks: list[cst.If], in_else: bool) -> None:
        super().__init__()
        self.call, self.blocks, self.top, self.in_else = call, {id(b) for b in blocks}, None, in_else
        self.convert = cst.parse_statement(convert)

    def visit_For(self, node: cst.For) -> None:
        self.top = self.top or node

    def visit_While(self, node: cst.While) -> None:
        self.top = self.top or node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node is self.call:
            assert isinstance(updated_node.func, cst.Attribute)
            return updated_node.with_changes(func=updated_node.func.with_changes(attr=cst.Name("detach")))
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if id(original_node) in self.blocks and isinstance(updated_node.body, cst.IndentedBlock):
            body = updated_node.body
            return updated_node.with_changes(body=body.with_changes(body=[self.convert, *body.body]))
        return updated_node

    def _with_else(self, original_node, updated_node):  # noqa: ANN001, ANN202 - For or While
        if original_node is not self.top or not self.in_else:
            return updated_node
        if updated_node.orelse is None:
            return updated_node.with_changes(orelse=cst.Else(body=cst.IndentedBlock(body=[self.convert])))
        block = updated_node.orelse.body
        if not isinstance(block, cst.IndentedBlock):
            return updated_node
        return updated_node.with_changes(orelse=updated_node.orelse.with_changes(
            body=block.with_changes(body=[self.convert, *block.body])))

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        return self._with_else(original_node, updated_node)

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        return self._with_else(original_node, updated_node)


# reductions to one value: `gradients.norm(2, dim=1).mean().data[0]`
_REDUCTIONS = frozenset({"mean", "sum", "norm", "max", "min", "prod"})


def _names_a_loss(value: cst.BaseExpression) -> bool:
    """`loss_reduced["d"].mean()`, `d_loss.sum()`: a value of unknown placement that its name says is a loss; in a CUDA
    training step, `.item()` on it (a tensor method) reads a loss tensor back."""
    while True:
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and not value.args \
                and value.func.attr.value in ("mean", "sum", "detach", "float", "squeeze"):
            value = value.func.value
        elif isinstance(value, cst.Subscript):
            value = value.value
        else:
            break
    return is_loss_value(last_name(value) or "")

