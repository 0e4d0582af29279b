from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import dotted_name, walk
from gpulint.semantic.accumulation import Accumulation, Accumulations

# ---------------------------------------------------------------------------------------------
# Gradient-accumulation loops, shared by GPU061 and GPU062 (imported by grad_accum_loss_not_normalized).


# ---------------------------------------------------------------------------------------------

_DDP = re.compile(r"(^|\.)(DistributedDataParallel|DDP|smart_DDP|\w*_ddp|wrap_ddp)$")
_MANAGED = re.compile(r"\bno_sync\b|require_backward_grad_sync|\baccelerator\b|Accelerator\(|\.accumulate\(|"
                      r"\bdeepspeed\b|model_engine|FullyShardedDataParallel|\bFSDP\b|\bfabric\b|"
                      r"accumulate_grad_batches|\bhorovod\b")


class DdpAccumWithoutNoSync(Rule):
    """
    ## What it does
    Finds gradient accumulation with a `DistributedDataParallel` model (`backward()` on every micro-step, the
    optimizer step once every N micro-steps) where the non-final micro-steps do not run under
    `model.no_sync()`.

    ## Why is this slow
    DDP all-reduces every gradient bucket during each `backward()`. While accumulating, only the last
    micro-step's reduction is needed, so the others send N-1 redundant copies of the model's gradients over
    NVLink or the network. On 2x H200 (NVLink), a 100M-parameter MLP with N=8 took 50.7 ms per optimizer
    step without `no_sync` and 32.5 ms with it (x1.56); across nodes the gap grows. The tuning guide: the
    all-reduce "is only required ... after the last call to backward".

    ## Example
    ```python
    model = DDP(model, device_ids=[rank])
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        sync = (i + 1) % accum_steps == 0
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = criterion(model(x), y) / accum_steps  # the forward must be inside too
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    No automatic fix: the forward pass has to move into the context as well (DDP docstring), which
    restructures the step. The rule stays quiet when accumulation is managed by Accelerate, Lightning,
    DeepSpeed or FSDP, or when the file already uses `no_sync` / `require_backward_grad_sync`.
    """

    code = "GPU061"
    name = "ddp-accum-without-no-sync"
    message = ("DDP all-reduces gradients on every accumulation micro-step; run the non-final micro-steps "
               "(forward and backward) under `model.no_sync()`")
    severity = Severity.INFO
    safety = Safety.SUGGEST
    priority = "P2"
    triggers = ("DistributedDataParallel", "DDP")
    examples = [
        Valid(
            """
            import contextlib
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank])
            for i, (x, y) in enumerate(loader):
                sync = (i + 1) % accum_steps == 0
                with contextlib.nullcontext() if sync else model.no_sync():
                    loss = criterion(model(x), y) / accum_steps
                    loss.backward()
                if sync:
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
        Valid(  # no accumulation: every backward is followed by a step
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank])
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank])
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accum_steps
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
        Invalid(  # backward in two branches (apex and plain): one finding for the loop
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank])
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accum_steps
                if fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            count=1,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        source = self.ctx.program.sources.get(self.ctx.path)
        if source is None:
            source = self.ctx.module.code
        if ".backward(" not in source or ".step(" not in source or _MANAGED.search(source):
            return
        ddp_names = self._ddp_models()
        if not ddp_names:
            return
        for accumulation in Accumulations.of(self.ctx.analysis).items:
            if not self._calls_model(accumulation, ddp_names):
                continue
            if accumulation.backward_calls:  # one finding per loop, also when branches call backward differently
                self.report(accumulation.backward_calls[0])

    def _ddp_models(self) -> set[str]:
        """Names (and attribute names) assigned a DDP-wrapped model in this file."""
        names: set[str] = set()
        for node in walk(self.ctx.module, into_functions=True):
            # (`model: LlamaForCausalLM = DistributedDataParallel(...)` is an annotated assignment)
            if isinstance(node, (cst.Assign, cst.AnnAssign)) and isinstance(node.value, cst.Call):
                func = self.ctx.analysis.call_qualname(node.value) or dotted_name(node.value.func) or ""
                if not _DDP.search(func):
                    continue
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, cst.Name):
                        names.add(target.value)
                    elif isinstance(target, cst.Attribute):
                        names.add(target.attr.value)
        return names

    def _calls_model(self, accumulation: Accumulation, names: set[str]) -> bool:
        for node in walk(accumulation.loop, into_functions=True):
            if isinstance(node, cst.Call):
                func = node.func
                called = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(
                    func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self" else None
                if called in names:
                    return True
        return False
