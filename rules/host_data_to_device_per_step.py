from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, Rule, Severity, Valid
from gpulint.analysis import call_arg, is_numeric_literal, method_name
from gpulint.rule import is_test_path
from gpulint.semantic.placement import (
    DEVICE,
    HOST,
    NONTENSOR,
    TENSOR,
    Placement,
    amortised,
    collective_only,
    last_name,
)

_FROM_HOST = {"from_numpy"}
_TENSOR_CONSTRUCTORS = {"tensor", "as_tensor", "asarray", "Tensor", "FloatTensor", "DoubleTensor", "HalfTensor",
                        "LongTensor", "IntTensor", "ShortTensor", "ByteTensor", "BoolTensor", "BFloat16Tensor"}
# Methods between the host tensor and the move that keep it a host tensor: `from_numpy(a).float().to(D)`.
_HOST_CHAIN = {"float", "double", "half", "bfloat16", "long", "int", "bool", "byte", "view", "reshape", "unsqueeze",
               "squeeze", "permute", "transpose", "contiguous", "flatten", "type", "t", "clone", "detach"}
# Functions that gather a Python sequence of tensors into one (on the device of the pieces).
_GATHERS = {"stack", "cat", "concat", "concatenate", "vstack", "hstack"}
_DEVICE_NAME = re.compile(r"(^|_)(device|dev|cuda|gpu)$|^(local_)?rank$", re.I)


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
    staging = torch.empty(batch_size, obs_dim).pin_memory()
    for step in range(num_updates):
        staging.copy_(torch.from_numpy(replay.sample(batch_size)))
        obs = staging.to(device, non_blocking=True)
        ...
    ```
    With a pinned staging buffer, wait for the copy (an event, or double-buffering) before refilling it.
    Better still, keep the producer on the GPU (a GPU replay buffer or vectorised environment). Calling
    `.pin_memory()` on every fresh tensor is not a win: pinning costs about as much as the copy it speeds up.

    ## Fix safety
    No automatic fix: hoisting a constant or introducing a staging buffer changes the program's structure.
    """

    code = "GPU013"
    name = "host-data-to-device-per-step"
    message = "Host data turned into a GPU tensor every step: a pageable host-to-device copy per call"
    severity = Severity.WARNING
    priority = "P2"
    triggers = ("from_numpy", "tensor(", "Tensor(")
    examples = [
        Valid(  # outside the training step: a one-off copy
            """
            import torch
            table = torch.from_numpy(np.load("table.npy")).to("cuda")
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
    ]

    def __init__(self, ctx) -> None:  # noqa: ANN001 - RuleContext
        super().__init__(ctx)
        self._enabled = ctx.targets_cuda()

    def visit_Call(self, node: cst.Call) -> None:
        if not self._enabled or any(arg.star for arg in node.args):
            return
        name = method_name(node)
        source: cst.Call | None = None
        if name in ("to", "cuda") and isinstance(node.func, cst.Attribute):
            source = self._host_constructor(node.func.value)
            if source is None or not self._moves_to_device(node, name):
                return
        else:
            qual = self.ctx.qualname(node.func) or ""
            if not qual.startswith("torch.") or qual.count(".") != 1:
                return
            if qual[len("torch."):] not in ("tensor", "as_tensor", "asarray"):
                return
            device = call_arg(node, "device")
            if device is None or not self._device_target(device.value):
                return
            source = node
        if not self.ctx.in_hot_region() or amortised(self.ctx) or is_test_path(self.ctx.path):
            return  # `if step % N == 0:` blocks (eval, sampling, logging) run once every N steps; tests
        if self._agreement_across_ranks(node):
            return
        data = source.args[0].value if source.args and source.args[0].keyword is None else None
        qual = self.ctx.qualname(source.func) or ""
        if data is not None and qual.endswith(("as_tensor", "asarray")):
            if Placement(self.ctx).of(data) not in (NONTENSOR, HOST):
                return  # as_tensor of a tensor that may already be on the device is a no-op
        elif data is not None and not qual.endswith("from_numpy"):
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
        if call_arg(node, "non_blocking") is not None:
            self.report(node, "Host data turned into a GPU tensor every step: `non_blocking=True` cannot overlap a copy "
                              "from freshly allocated pageable memory; copy through a pinned staging buffer, or "
                              "produce the data on the GPU")
            return
        self.report(node, "Host data turned into a GPU tensor every step: a blocking pageable copy per call; use a "
                          "pinned staging buffer with `non_blocking=True`, or produce the data on the GPU")

    # -- helpers -----------------------------------------------------------------------------

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

    def _host_constructor(self, node: cst.BaseExpression) -> cst.Call | None:
        """`torch.from_numpy(a)` / `torch.tensor(x)` (without device=) under host-only methods like `.float()`."""
        while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and method_name(node) in _HOST_CHAIN:
            node = node.func.value
        if not isinstance(node, cst.Call):
            return None
        qual = self.ctx.qualname(node.func) or ""
        if not qual.startswith("torch.") or qual.count(".") != 1:
            return None
        last = qual[len("torch."):]
        if last in _FROM_HOST:
            return node
        if last in _GATHERS and node.args and self._gathered_on_host(node.args[0].value):
            return node
        if last in _TENSOR_CONSTRUCTORS and call_arg(node, "device") is None:
            return node
        return None

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
        else:
            return False
        placement = Placement(self.ctx)
        return all(placement.of(piece) is not DEVICE for piece in pieces)

    def _moves_to_device(self, node: cst.Call, name: str) -> bool:
        if name == "cuda":
            return True
        target = call_arg(node, "device", 0)
        return target is not None and self._device_target(target.value)

    def _device_target(self, node: cst.BaseExpression) -> bool:
        kind = Placement(self.ctx).device_kind(node)
        if kind == DEVICE:
            return True
        if kind in (HOST, TENSOR):
            return False
        return bool(_DEVICE_NAME.search(last_name(node) or ""))


def _python_scalar(node: cst.BaseExpression) -> bool:
    """A size read from a tensor or a container: `x.shape[-2]`, `x.size(0)`, `len(batch)`."""
    if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute):
        return node.value.attr.value == "shape"
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Name):
            return node.func.value == "len"
        return method_name(node) in ("size", "numel", "dim")
    return False
