from __future__ import annotations

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import walk
from gpulint.semantic.placement import DEVICE, Placement

_PER_STEP = (HotKind.STEP_LOOP, HotKind.STEP_FUNCTION, HotKind.ROLLOUT, HotKind.FORWARD, HotKind.CALLEE,
             HotKind.COMPILED)


class HostIndexOnDeviceTensor(Rule):
    """
    ## What it does
    Finds GPU tensors indexed, every step, with an integer index array made on the host: a CPU tensor
    (`perm = torch.randperm(n)` and its slices), a NumPy array (`np.random.permutation(n)`,
    `rng.choice(n, batch)`, `np.arange(n)` shuffled in place) or the index lists of a `BatchSampler` -- the
    minibatch loop of PPO-style updates and replay-buffer sampling, in a CUDA program.

    ## Why is this slow
    `gpu_tensor[idx]` with a host index first copies the index to the GPU with a blocking copy: the host
    waits until the GPU has finished all queued work, once per indexing. A minibatch loop that indexes five
    rollout tensors with the same `idx` synchronizes five times per step, and the GPU idles while the host
    prepares the next launch.

    ## Example
    ```python
    for epoch in range(epochs):
        perm = torch.randperm(n)
        for start in range(0, n, minibatch):
            idx = perm[start:start + minibatch]
            loss = policy_loss(obs[idx], actions[idx], advantages[idx])   # obs, ... on the GPU
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        perm = torch.randperm(n).to(obs.device)   # one copy per epoch, same permutation
        for start in range(0, n, minibatch):
            idx = perm[start:start + minibatch]
            loss = policy_loss(obs[idx], actions[idx], advantages[idx])
    ```
    or draw the permutation on the GPU (`torch.randperm(n, device=obs.device)`; a different random stream).

    ## Fix safety
    Safe where it is offered: for a CPU-tensor index made by a torch factory in the same function and used
    only to index tensors on the GPU (directly or through slices), the fix moves it to that device right where
    it is made -- the same values from the same random stream, one copy instead of one per indexing. NumPy and
    list indices, and indices used elsewhere, are reported without a fix.
    """

    code = "GPU016"
    name = "host-index-on-device-tensor"
    message = ("GPU tensor indexed with {kind} made on the host, every step: each indexing copies the index to the "
               "GPU and waits for it (a host sync); make the index on the GPU or move it there once")
    fix_title = "Move the index to the GPU where it is made"
    severity = Severity.WARNING
    safety = Safety.SAFE
    priority = "P2"
    triggers = ("[",)
    examples = [
        Invalid(
            """
            import torch
            device = torch.device("cuda")
            obs = torch.randn(4096, 8).to(device)
            adv = torch.randn(4096).to(device)
            for epoch in range(4):
                perm = torch.randperm(4096)
                for start in range(0, 4096, 256):
                    idx = perm[start:start + 256]
                    loss = (policy(obs[idx]).sum(-1) * adv[idx]).mean()
                    loss.backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            device = torch.device("cuda")
            obs = torch.randn(4096, 8).to(device)
            adv = torch.randn(4096).to(device)
            for epoch in range(4):
                perm = torch.randperm(4096).to(obs.device)
                for start in range(0, 4096, 256):
                    idx = perm[start:start + 256]
                    loss = (policy(obs[idx]).sum(-1) * adv[idx]).mean()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # NumPy minibatch indices (reported, no fix)
            """
            import numpy as np
            import torch
            b_obs = torch.zeros((2048, 4), device="cuda")
            b_inds = np.arange(2048)
            for epoch in range(4):
                np.random.shuffle(b_inds)
                for start in range(0, 2048, 64):
                    mb_inds = b_inds[start:start + 64]
                    loss = agent(b_obs[mb_inds]).mean()
                    loss.backward()
                    optimizer.step()
            """
        ),
        Valid(  # the index already lives on the GPU
            """
            import torch
            obs = torch.randn(4096, 8, device="cuda")
            for epoch in range(4):
                perm = torch.randperm(4096, device="cuda")
                for start in range(0, 4096, 256):
                    loss = policy(obs[perm[start:start + 256]]).mean()
                    loss.backward()
                    optimizer.step()
            """
        ),
        Valid(  # integer and slice indexing copy nothing
            """
            import torch
            buf = torch.zeros(128, 8, device="cuda")
            for t in range(128):
                x = buf[t]
                y = buf[t:t + 4]
                loss = model(x + y.sum(0)).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # host index into a host tensor
            """
            import torch
            data = torch.randn(4096, 8)
            for epoch in range(4):
                perm = torch.randperm(4096)
                for start in range(0, 4096, 256):
                    batch = data[perm[start:start + 256]].to("cuda")
                    loss = model(batch).mean()
                    loss.backward()
                    optimizer.step()
            """
        ),
    ]
    # same gathered rows; SYNC counts the blocking copies of the index
    micro_check = MicroCheck(
        kinds=("EQ", "SYNC", "PERF"),
        setup=("obs = torch.randn(8192, 32)\nadv = torch.randn(8192)\nret = torch.randn(8192)\n"
               "perm_cpu = torch.randperm(8192, device='cpu')"),
        before=("out = []\nperm = perm_cpu\nfor s in range(0, 8192, 256):\n    idx = perm[s:s + 256]\n"
                "    out.append(obs[idx].sum(1) * adv[idx] + ret[idx])\nout = torch.stack(out)"),
        after=("out = []\nperm = perm_cpu.to(obs.device)\nfor s in range(0, 8192, 256):\n    idx = perm[s:s + 256]\n"
               "    out.append(obs[idx].sum(1) * adv[idx] + ret[idx])\nout = torch.stack(out)"),
        compare=("out",),
    )

    def __init__(self, ctx) -> None:  # noqa: ANN001 - RuleContext
        super().__init__(ctx)
        self._reported: set[tuple[int, int]] = set()  # (statement, index origin) already reported
        self._fixed: set[int] = set()  # index origins whose fix was offered

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if len(node.slice) > 3 or all(isinstance(e.slice, cst.Slice) for e in node.slice):
            return
        if self.ctx.hot_kind() not in _PER_STEP or self.ctx.in_test_code() or not self.ctx.targets_cuda():
            return
        placement = Placement(self.ctx)
        for element in node.slice:
            if not isinstance(element.slice, cst.Index):
                continue
            found = placement.host_index(element.slice.value)
            if found is None:
                continue
            kind, origin = found
            if origin is element.slice.value and kind == "a CPU tensor":
                continue  # `x[torch.arange(n)]`: a factory moved by the indexing, GPU015's
            statement = self.ctx.enclosing(cst.SimpleStatementLine, cst.If, cst.While, cst.For, cst.With)
            key = (id(statement), id(origin))
            if key in self._reported or placement.of(node.value) != DEVICE:
                return
            self._reported.add(key)
            replacements = self._fix(placement, origin, node.value, kind)
            self.report(node, self.message.format(kind=kind), replacements=replacements)
            return

    def _fix(self, placement: Placement, origin: cst.Call, indexed: cst.BaseExpression,
             kind: str) -> tuple[tuple[cst.CSTNode, cst.CSTNode], ...]:
        """`origin.to(indexed.device)` when the index is a torch tensor made in this function from which every
        use only indexes GPU tensors (through slices bound to names); offered once per origin."""
        if kind != "a CPU tensor" or id(origin) in self._fixed or not isinstance(indexed, (cst.Name, cst.Attribute)):
            return ()
        function = self.ctx.enclosing(cst.FunctionDef) or self.ctx.module
        bound = self._only_indexes_device(function, origin, placement)
        if bound is None or not self._bound_before(indexed, bound, origin):
            return ()
        self._fixed.add(id(origin))
        moved = cst.Call(func=cst.Attribute(value=origin, attr=cst.Name("to")),
                         args=[cst.Arg(cst.Attribute(value=indexed, attr=cst.Name("device")))])
        return ((origin, moved),)

    def _bound_before(self, indexed: cst.Name | cst.Attribute, name: str, origin: cst.Call) -> bool:
        """`indexed.device` can be read where `origin` is made: `indexed` is not (re)bound there or later."""
        bindings = self.ctx.analysis.bindings_of(name, self.ctx.ancestors)
        order = next((b.order for b in bindings if b.value is origin), None)
        if order is None:
            return False
        if isinstance(indexed, cst.Name):
            own = self.ctx.analysis.bindings_of(indexed.value, self.ctx.ancestors)
            return bool(own) and all(b.order < order for b in own)
        function = self.ctx.enclosing(cst.FunctionDef) or self.ctx.module
        text = self.ctx.code(indexed)  # `self.buffer`: not assigned anywhere in this function
        return not any(isinstance(n, cst.AssignTarget) and self.ctx.code(n.target) == text for n in walk(function))

    def _only_indexes_device(self, function: cst.CSTNode, origin: cst.Call, placement: Placement) -> str | None:
        """The name bound to `origin`, if it and the names bound to its slices are read only as indices of GPU
        tensors, directly or through slices."""
        names: set[str] = set()
        first = None
        nodes = list(walk(function))
        for statement in nodes:
            if isinstance(statement, cst.Assign) and len(statement.targets) == 1 and isinstance(
                    statement.targets[0].target, cst.Name):
                value = _unsliced(statement.value)
                if value is origin or isinstance(value, cst.Name) and value.value in names:
                    names.add(statement.targets[0].target.value)
                    first = first or statement.targets[0].target.value
        if first is None:
            return None
        allowed: set[int] = set()  # reads that are fine: assignment targets, slices bound above, GPU indices
        for node in nodes:
            if isinstance(node, cst.AssignTarget):
                allowed.add(id(node.target))
            elif isinstance(node, cst.Assign) and isinstance(_unsliced(node.value), cst.Name):
                allowed.add(id(_unsliced(node.value)))
            elif isinstance(node, cst.Subscript):
                for element in node.slice:
                    if isinstance(element.slice, cst.Index):
                        root = _unsliced(element.slice.value)
                        if isinstance(root, cst.Name) and root.value in names:
                            if placement.of(node.value) != DEVICE:
                                return None
                            allowed.add(id(root))
        if all(id(node) in allowed for node in nodes if isinstance(node, cst.Name) and node.value in names):
            return first
        return None


def _unsliced(node: cst.BaseExpression) -> cst.BaseExpression:
    """`perm[a:b][c:d]` -> `perm`."""
    while isinstance(node, cst.Subscript) and all(isinstance(e.slice, cst.Slice) for e in node.slice):
        node = node.value
    return node
