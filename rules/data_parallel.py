from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg, dotted_name, iter_calls, method_name, walk
from gpulint.program import mentions, related_texts, subclasses_in_text

_DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                  "torch.nn.parallel.data_parallel.DataParallel", "torch.nn.parallel.data_parallel",
                  "torch.nn.parallel.data_parallel.data_parallel"}
_DISTRIBUTED = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel",
                "torch.nn.DistributedDataParallel"}
_MOVES = {"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval"}


def _trains_here(a, scope: cst.CSTNode) -> bool:  # noqa: ANN001
    """A backward pass or an optimizer step in `scope` (not in functions nested in it)."""
    for call in iter_calls(scope):
        name = method_name(call)
        if name == "backward" or a.call_qualname(call) == "torch.autograd.backward":
            return True
        if name == "step" and "opt" in cst.Module(body=[]).code_for_node(call).lower():
            return True  # `optimizer.step()`, `opt_d.step()`, `scaler.step(optimizer)`
    return False


_DDP_OFFERED = ("the script also builds DistributedDataParallel when launched distributed; this DataParallel path is "
                "what a plain launch on several GPUs runs: launch it with `torchrun` or make DDP the default")
_INFERENCE = re.compile(r"no_grad|inference_mode|\.eval\(\)|load_state_dict")
_TRAINS = re.compile(r"\.backward\(|\boptim\w*\.step\(|\bfabric\.backward\(|\btrainer\.fit\(")


def _reads_global(function: cst.FunctionDef, name: str) -> bool:
    """Does `function` use the module-level `name` (read, not a parameter or a local of its own)?"""
    params = function.params
    if any(p.name.value == name for p in [*params.posonly_params, *params.params, *params.kwonly_params]):
        return False
    local = any(isinstance(n, (cst.AssignTarget, cst.AnnAssign)) and isinstance(
        n.target, cst.Name) and n.target.value == name for n in walk(function.body))
    declared = any(isinstance(n, cst.Global) and any(g.name.value == name for g in n.names)
                   for n in walk(function.body))
    return (declared or not local) and any(isinstance(n, cst.Name) and n.value == name for n in walk(function.body))


def _packed(container: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values a container holds: a call's arguments (`Munch(generator=g)`, `dict(g=g)`), a dict's values, a
    tuple's or list's elements."""
    if isinstance(container, cst.Call):
        return [arg.value for arg in container.args]
    if isinstance(container, cst.Dict):
        return [element.value for element in container.elements if isinstance(element, cst.DictElement)]
    return [element.value for element in container.elements]  # type: ignore[attr-defined]


def _root(node: cst.BaseExpression) -> cst.BaseExpression:
    """`model.cuda()` -> `model`; `model.features.to(dev)` -> `model.features`."""
    while isinstance(node, cst.Call) and method_name(node) in _MOVES:
        node = node.func.value  # type: ignore[attr-defined]
    return node


class DataParallel(Rule):
    """
    ## What it does
    Finds `nn.DataParallel(...)` (and the functional `torch.nn.parallel.data_parallel(...)`).

    ## Why is this slow
    DataParallel drives all GPUs from one Python process: on every forward it re-replicates the model to each
    device, scatters the batch from GPU 0, runs the replicas in threads that contend for the GIL, and gathers
    the outputs back on GPU 0, which also holds all gradients. On 2x H200, ResNet-50 with a global batch of 128
    ran at 1192 img/s with DataParallel, slower than a single GPU (2131 img/s), while
    DistributedDataParallel reached 3610 img/s; a small MLP step went from 1144 µs on one GPU to 4228 µs.
    The DataParallel docstring itself: "It is recommended to use DistributedDataParallel, instead of this
    class, to do multi-GPU training, even if there is only a single node".

    ## Example
    ```python
    model = nn.DataParallel(model).cuda()
    ```

    ## Use instead
    One process per GPU (`torchrun --nproc_per_node=N train.py`):
    ```python
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DistributedDataParallel(model.cuda(local_rank), device_ids=[local_rank])
    loader = DataLoader(train_set, batch_size=per_gpu_batch, sampler=DistributedSampler(train_set))
    ```

    Reported only where the wrapped model is trained in this file: the construction sits in a function (or
    script body) with a backward pass or optimizer step, the wrapped model is handed to or returned to such a
    function, or stored on `self` and used by a method that trains. Not reported: DataParallel built only for
    sampling or inference (often just to load a checkpoint saved with `module.` prefixes), a re-wrap inside an
    `isinstance(m, nn.DataParallel)` branch, and a library helper that wraps a module its caller passes in. The
    DataParallel fallback in a function or if/elif chain that also builds `DistributedDataParallel` is reported
    with a note: the script offers DDP, but a plain launch on several GPUs runs DataParallel.

    ## Fix safety
    No automatic fix: moving to DDP changes how the script is launched, needs a process group, a
    `DistributedSampler` (and `set_epoch` per epoch), per-GPU batch sizes and rank-0-only logging and
    checkpointing.
    """

    code = "GPU060"
    name = "data-parallel"
    message = ("`DataParallel` drives every GPU from one process (replicate, scatter, gather each step); "
               "use `DistributedDataParallel` with one process per GPU")
    severity = Severity.WARNING
    safety = Safety.SUGGEST
    priority = "P1"
    triggers = ("DataParallel", "data_parallel")
    examples = [
        Valid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model.cuda(rank), device_ids=[rank])
            if isinstance(model, torch.nn.DataParallel):
                model = model.module
            """
        ),
        Valid(  # a single device: DataParallel just calls the module
            """
            import torch.nn as nn
            model = nn.DataParallel(model, device_ids=[0])
            for x, y in loader:
                loss_fn(model(x), y).backward()
                optimizer.step()
            """
        ),
        Valid(  # sampling only: wrapped to load a checkpoint saved from a DataParallel model
            """
            import torch
            def sample(net, ckpt, noise):
                net = torch.nn.DataParallel(net.cuda())
                net.load_state_dict(torch.load(ckpt))
                net.eval()
                with torch.no_grad():
                    return net(noise)
            """
        ),
        Valid(  # a helper that wraps whatever module its caller passes in
            """
            from torch.nn import DataParallel
            def setup_module(module, devices):
                return DataParallel(module=module, device_ids=devices)
            """
        ),
        Invalid(  # a setup helper that wraps the model it is given and returns it to a training script
            """
            import torch
            def setup(model, args):
                if args.n_gpu > 1:
                    model = torch.nn.DataParallel(model)
                return model, torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = setup(Net().cuda(), args)
            for x, y in loader:
                criterion(model(x.cuda()), y.cuda()).backward()
                optimizer.step()
            """
        ),
        Invalid(  # a factory packing the wrapped networks into a container it returns; a frozen helper network
            # wrapped beside them for inference only (`.eval()`) is not trained
            """
            import torch.nn as nn
            def build_model(args):
                generator = nn.DataParallel(Generator(args.img_size))  # error: GPU060
                discriminator = nn.DataParallel(Discriminator(args.img_size))  # error: GPU060
                landmarks = nn.DataParallel(FaceAlignment(args.wing_path).eval())
                return dict(generator=generator, discriminator=discriminator), landmarks
            nets, landmarks = build_model(args)
            for x, y in loader:
                loss = nets["discriminator"](nets["generator"](x.cuda())).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # re-wrapping a copy of a module that was already DataParallel
            """
            import copy
            import torch.nn as nn
            def clone(m):
                if isinstance(m, nn.DataParallel):
                    return nn.DataParallel(copy.deepcopy(m.module))
                return copy.deepcopy(m)
            """
        ),
        Invalid(  # the same function also builds DistributedDataParallel (under another name) when distributed:
            # DataParallel is what a plain `python train.py` on several GPUs runs (reported with that note)
            """
            import torch
            from torch import nn
            from torch.nn.parallel import DistributedDataParallel as NativeDDP
            def main(args, loader, optimizer):
                model = build_model()
                if args.num_gpu > 1:
                    model = nn.DataParallel(model).cuda()  # error: GPU060
                if args.distributed:
                    model = NativeDDP(model.cuda(), device_ids=[args.local_rank])
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """
        ),
        Invalid(  # the fallback of a chain that already offers DistributedDataParallel
            """
            import torch
            def main(args):
                model = build_model()
                if args.distributed:
                    model = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[args.gpu])
                else:
                    model = torch.nn.DataParallel(model).cuda()  # error: GPU060
                for x, y in loader:
                    loss_fn(model(x), y).backward()
                    optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            net = torch.nn.DataParallel(net)
            for x, y in loader:
                loss = criterion(net(x), y)
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(  # the program's own subclass (an uneven split of the batch) replicates and gathers all the same
            """
            import torch
            from torch.nn.parallel import DataParallel

            class UnevenDataParallel(DataParallel):
                def __init__(self, first_share, module, **kwargs):
                    super().__init__(module, **kwargs)
                    self.first_share = first_share

            net = UnevenDataParallel(4, net, dim=1).cuda()  # error: GPU060
            for x, y in loader:
                criterion(net(x), y).backward()
                optimizer.step()
            """
        ),
        Invalid(  # wrapped in one function, trained in another
            """
            from torch import nn
            def train(model, loader, optimizer):
                for x, y in loader:
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    optimizer.step()
            def main(args):
                model = nn.DataParallel(build_model(), device_ids=list(range(args.num_gpu))).cuda()
                train(model, loader, optimizer)
            """
        ),
        Invalid(  # wrapped at module level on a condition, trained by a function that reads the global
            """
            import torch
            from torch import nn
            device = "cuda" if torch.cuda.is_available() else "cpu"
            net = build_model().to(device)
            if device == "cuda":
                net = nn.DataParallel(net)
            def train(epoch):
                for x, y in loader:
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(net(x.to(device)), y.to(device)).backward()
                    optimizer.step()
            """
        ),
        Invalid(  # kept on an object that a training loop elsewhere in the program uses
            """
            import torch.nn as nn
            class Learner:
                def __init__(self, model):
                    self.model = nn.DataParallel(model).cuda()
            def fit(learner, loader, optimizer):
                for x, y in loader:
                    loss = learner.loss(x, y)
                    loss.backward()
                    optimizer.step()
            """
        ),
        Invalid(  # a submodule wrapped, the whole model trained
            """
            from torch import nn
            def train(model, loader, optimizer):
                for x, y in loader:
                    optimizer.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    optimizer.step()
            def main():
                model = build_vgg()
                model.features = nn.DataParallel(model.features)
                train(model, loader, optimizer)
            """
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        qualname = self.ctx.analysis.call_qualname(node) or ""
        subclass = qualname not in _DATA_PARALLEL and self._program_subclass(node)
        if qualname not in _DATA_PARALLEL and not subclass:
            return
        # DataParallel(module, device_ids=None, ...); data_parallel(module, inputs, device_ids=None, ...); a
        # subclass's own signature is unknown: only its `device_ids=` keyword is read
        devices = call_arg(node, "device_ids", None if subclass else 2 if qualname.endswith("data_parallel") else 1)
        if devices is not None and isinstance(devices.value, (cst.List, cst.Tuple)) and len(devices.value.elements) == 1:
            return
        if self._not_training(node, qualname):
            return
        self.report(node, note=_DDP_OFFERED if self._ddp_alternative(self.ctx.ancestors) else None)

    def _program_subclass(self, node: cst.Call) -> bool:
        """`BalancedDataParallel(chunk, model, dim=1)` where the program defines `class BalancedDataParallel(
        DataParallel)`: replicate, scatter and gather every step all the same."""
        qualname = self.ctx.analysis.call_qualname(node)
        name = (dotted_name(node.func) or "").rsplit(".", 1)[-1]
        if not name or qualname is not None and qualname.startswith("torch."):
            return False
        return name in self.ctx.program.derived(
            "data-parallel-subclasses", lambda program: subclasses_in_text(program.sources.values(), {"DataParallel"}))

    # -- is the wrapped model trained here? ----------------------------------------------------

    def _not_training(self, node: cst.Call, qualname: str) -> bool:
        a = self.ctx.analysis
        ancestors = self.ctx.ancestors
        fn = next((n for n in reversed(ancestors) if isinstance(n, cst.FunctionDef)), None)
        for ancestor in ancestors:
            if isinstance(ancestor, cst.If) and any(
                    (a.call_qualname(c) == "isinstance" or dotted_name(c.func) == "isinstance") and len(c.args) > 1
                    and any(a.qualname(n) in _DATA_PARALLEL for n in walk(c.args[1].value)
                            if isinstance(n, (cst.Name, cst.Attribute)))
                    for c in iter_calls(ancestor.test)):
                return True  # `if isinstance(m, nn.DataParallel): ... nn.DataParallel(copy)`
        module = call_arg(node, "module", 0)
        if module is not None and fn is not None:
            root = _root(module.value)
            while isinstance(root, cst.Attribute):
                root = root.value
            params = {p.name.value for p in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]}
            target = self._target(ancestors) or ""
            if isinstance(root, cst.Name) and root.value in params and root.value != "self" \
                    and not target.startswith("self.") and target != "<return>" \
                    and not (target and self._returned(target, fn.body)):
                return True  # a helper wrapping a module its caller passes in (neither keeping nor returning it)
        scope: cst.CSTNode = fn if fn is not None else a.module
        if _trains_here(a, scope.body if isinstance(scope, cst.FunctionDef) else scope):
            return False
        info = a.enclosing_class(ancestors)
        if info is not None and info.is_module:
            # `data_parallel(self.main, x, ...)` in a module's forward, `self.encoder = DataParallel(Encoder())` in
            # its `__init__`: trained wherever the module is, in this file or another file of the program
            return not _trains_here(a, a.module) and not any(
                _trains_here(a, f) for f in walk(a.module, into_functions=True) if isinstance(f, cst.FunctionDef)) \
                and not any(mentions(_TRAINS, text) for text in related_texts(self.ctx).values())
        target = self._target(ancestors)
        if target is None:
            return True
        if self._flows_to_training(target, scope, fn, info):
            return False
        # kept on an object or returned (a trainer class or another file trains it), in a program that trains
        body = scope.body if isinstance(scope, cst.FunctionDef) else scope
        handed_on = target.startswith("self.") or target == "<return>" or self._returned(target, body)
        # (an inference wrapper: `DataParallel(FAN(...).eval())`, or `model.eval()` / `load_state_dict` on the target
        # in the same scope; not another module's `.eval()` there)
        mentioned = re.compile(rf"(?<![\w.]){re.escape(target)}\b")
        inference = _INFERENCE.search(self.ctx.code(node)) is not None or any(
            _INFERENCE.search(line) and mentioned.search(line) for line in self.ctx.code(scope).splitlines())
        return not (handed_on and not inference
                    and any(mentions(_TRAINS, text) for text in related_texts(self.ctx).values()))

    def _ddp_alternative(self, ancestors) -> bool:  # noqa: ANN001
        """The same function (or if/elif/else chain, at module level) also builds DistributedDataParallel:
        DataParallel is the script's fallback when it is not launched distributed."""
        a = self.ctx.analysis
        for node in reversed(ancestors):
            if isinstance(node, (cst.FunctionDef, cst.If)) and any(
                    a.call_qualname(c) in _DISTRIBUTED for c in iter_calls(node)):
                return True
            if isinstance(node, cst.FunctionDef):
                return False
        return False

    def _target(self, ancestors) -> str | None:  # noqa: ANN001
        """`model` / `self.model` / `model.features` that the construction is assigned to."""
        for node in reversed(ancestors):
            if isinstance(node, (cst.Assign, cst.AnnAssign)):
                target = node.targets[0].target if isinstance(node, cst.Assign) else node.target
                return dotted_name(target)
            if isinstance(node, cst.Return):
                return "<return>"
            if isinstance(node, (cst.BaseCompoundStatement, cst.FunctionDef)):
                return None
        return None

    def _flows_to_training(self, target: str, scope: cst.CSTNode, fn: cst.FunctionDef | None, info) -> bool:  # noqa: ANN001
        a = self.ctx.analysis
        trainers = {f.name.value for f in walk(a.module, into_functions=True)
                    if isinstance(f, cst.FunctionDef) and _trains_here(a, f.body)}
        if not trainers:
            return False
        body = scope.body if isinstance(scope, cst.FunctionDef) else scope
        if target == "<return>" or self._returned(target, body):
            # a factory: trained where its caller trains
            name = fn.name.value if fn is not None else None
            return name is not None and any(
                any((dotted_name(c.func) or "").rsplit(".", 1)[-1] == name for c in iter_calls(f.body))
                for f in walk(a.module, into_functions=True)
                if isinstance(f, cst.FunctionDef) and f.name.value in trainers)
        owner = target.split(".")[0]  # `model.features = DataParallel(model.features)` trains with `model`
        passed = {target} if owner == "self" else {target, owner}
        for call in iter_calls(body):
            callee = (dotted_name(call.func) or "").rsplit(".", 1)[-1]
            if callee in trainers and any(dotted_name(arg.value) in passed for arg in call.args):
                return True  # `train(model, loader, optimizer)`
        if fn is None and "." not in target and any(
                _reads_global(f, target) for f in walk(a.module, into_functions=True)
                if isinstance(f, cst.FunctionDef) and f.name.value in trainers):
            return True  # `net = DataParallel(net)` at module level, `def train(epoch): ... net(inputs)`
        if target.startswith("self.") and info is not None:
            attr = target
            for f in walk(info.node, into_functions=True):
                if isinstance(f, cst.FunctionDef) and f.name.value in trainers and any(
                        dotted_name(n) == attr for n in walk(f.body) if isinstance(n, cst.Attribute)):
                    return True  # `self.model` used by a method that trains
        return False

    @staticmethod
    def _returned(target: str, body: cst.CSTNode) -> bool:
        """Is `target` returned, alone, in a tuple, or packed into a returned container (`nets = Munch(generator=
        generator, ...)`, `nets = {"g": generator}`, then `return nets, nets_ema`)?"""
        returned: set[str] = set()
        for n in walk(body):
            if isinstance(n, cst.Return) and n.value is not None:
                values = [e.value for e in n.value.elements] if isinstance(n.value, cst.Tuple) else [n.value]
                values += [part for value in values if isinstance(value, (cst.Call, cst.Dict, cst.List))
                           for part in _packed(value)]  # `return dict(generator=generator), fan`
                returned.update(filter(None, map(dotted_name, values)))  # `return model` / `return model, opt`
        if any(target == name or target.startswith(name + ".") for name in returned):
            return True  # `model.features = DataParallel(...)`, then `return model`
        for n in walk(body):
            if isinstance(n, cst.Assign) and len(n.targets) == 1 and dotted_name(n.targets[0].target) in returned \
                    and isinstance(n.value, (cst.Call, cst.Dict, cst.Tuple, cst.List)) \
                    and any(dotted_name(part) == target for part in _packed(n.value)):
                return True
        return False
