from __future__ import annotations

import re
from functools import cached_property

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import BindingKind, Device, Evidence, call_arg, dotted_name, method_name, string_value, walk
from gpulint.builders import add_keyword
from gpulint.semantic.loaders import (
    LoaderFlow,
    checkable_loader_call,
    dataset_class,
    int_literal,
    loader_arg,
    tuple_element,
)
from gpulint.semantic.placement import DEVICE, Placement

_DEVICE_VAR = re.compile(r"(^|[._])(device|dev|cuda|gpu)$", re.I)
# A name that holds a device (or a CUDA ordinal) in `.to(x)`: `device`, `args.device`, `self.dev`, `gpu`, `local_rank`.
_DEVICE_LIKE = re.compile(r"(^|[._])(device|dev|_device|cuda|gpu|gpu_id|device_id|rank|local_rank)$", re.I)
# 28x28 / 32x32 images: without workers, a batch is well under 1 MB, where pinning in the main process was
# measured slower on an H100 (0.164 -> 0.178 ms per step); from about 1.5 MB it gains 3-30%
_SMALL_IMAGE_DATASETS = {"MNIST", "FashionMNIST", "KMNIST", "EMNIST", "QMNIST", "CIFAR10", "CIFAR100", "SVHN"}
_PIN_MEMORY_POSITION = 7  # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory)
# Text (of a class or function in another file of the program) that puts tensors on the GPU: `.cuda(`,
# `.to(device)`, `.to("cuda")`, or a `device=` keyword whose value is not the CPU or None.
_MOVES_TO_DEVICE = re.compile(r"\.cuda\(|\.to\(\s*(self\.)?(device|dev|_device|gpu|rank|local_rank)\b|"
                              r"\.to\(\s*['\"]cuda|\bdevice\s*=\s*(?![\s=]|None\b|['\"]cpu['\"]|torch\.device\(\s*['\"]cpu)")
# Libraries whose collate functions return CPU tensors (`default_collate`, Hugging Face data collators).
_HOST_COLLATE_PREFIXES = ("torch.", "transformers.")
# the script picks its device at run time: the fix follows its device variable
_PICKS_DEVICE = re.compile(r"""["']--?device["']|\bcuda\.is_available\(\)""")
_TURNED_OFF_NOTE = ("unsafe fix: `pin_memory=False` was written explicitly; pinned memory is page-locked RAM, so on a "
                    "host short of memory prefer fewer workers or a smaller `prefetch_factor`")
_UNKNOWN_COLLATE_NOTE = ("the `collate_fn` could not be resolved: if it returns CUDA tensors, `pin_memory=True` "
                         "raises (\"cannot pin 'torch.cuda...Tensor'\"), so no fix is offered")


class DataloaderNoPinMemory(Rule):
    """
    ## What it does
    Finds `torch.utils.data.DataLoader(...)` calls without a `pin_memory=` argument in a program that uses
    CUDA. It stays silent when `pin_memory` is passed in any form (also `pin_memory=False`, or hidden in
    `**kwargs`), when the dataset or the `collate_fn` already produces CUDA tensors, in programs with no
    CUDA evidence, and for one-off loads (`batch_size=len(dataset)`, or a loader read only by
    `next(iter(loader))` at module level), where pinning costs more than the single copy it speeds up.

    ## Why is this slow
    Batches live in pageable host memory, so every `batch.to("cuda")` first stages the data through a
    driver-owned pinned buffer and blocks the host. With `pin_memory=True` the loader copies each batch
    into page-locked memory in its pin thread, and the copy to the GPU runs at full bandwidth and can be
    asynchronous (`non_blocking=True`, GPU011). H100: 64 MiB host-to-device 13.2 GB/s pageable vs 55.1 GB/s
    pinned; a 16 MiB-batch training step went from 4.79 ms to 3.97 ms with pinning and `non_blocking`.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=256, shuffle=True, num_workers=4)
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=256, shuffle=True, num_workers=4, pin_memory=True)
    ```
    When the script picks its device at run time (a `--device` option, `torch.cuda.is_available()`) and
    binds it with `device = torch.device(...)`, the fix follows that choice: `pin_memory=device.type ==
    "cuda"` (a run with `--device cpu` on a GPU machine pins nothing). Otherwise, when the program may run
    without a GPU, it writes `pin_memory=torch.cuda.is_available()`, which avoids torch's "no accelerator is
    found" warning on CPU-only machines.

    An explicit `pin_memory=False` is reported too where the file moves data to a GPU in a CUDA program; its
    fix is unsafe, since turning pinning off may have been deliberate (a host short of memory).

    ## Fix safety
    Safe: pinning changes where a batch's host copy lives, not its values (batches compare equal). It is
    not offered when the dataset or collate function already yields CUDA tensors (pinning those raises:
    "cannot pin 'torch.cuda.LongTensor'"), nor when the `collate_fn` cannot be followed to its definition.
    Pinned memory is page-locked RAM: on hosts that are short of memory, prefer fewer workers or smaller
    `prefetch_factor` to turning pinning off.
    """

    code = "GPU010"
    name = "dataloader-no-pin-memory"
    message = "DataLoader without `pin_memory=True` in a CUDA program: host-to-device copies run from pageable memory"
    fix_title = "Add `pin_memory=True`"
    severity = Severity.WARNING
    safety = Safety.SAFE
    priority = "P1"
    triggers = ("DataLoader",)
    examples = [
        Valid(  # the whole dataset in one batch, read once and kept on the GPU: one copy per run
            """
            import torch
            import torchvision
            train = torchvision.datasets.CIFAR10("data", train=True, download=True)
            loader = torch.utils.data.DataLoader(train, batch_size=len(train), num_workers=2)
            images, labels = [t.cuda(non_blocking=True) for t in next(iter(loader))]
            """
        ),
        Valid(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, pin_memory=True)
            x = next(iter(loader))[0].cuda(non_blocking=True)
            """
        ),
        Valid(  # an explicit choice the code makes at run time
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, pin_memory=args.pin_memory)
            model.cuda()
            """
        ),
        Valid(  # turned off where this file sends nothing to the GPU
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, pin_memory=False)
            stats = [x.mean() for x, _ in loader]
            """
        ),
        Invalid(  # turned off, batches copied to the GPU every step (unsafe fix: the choice may be deliberate)
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, pin_memory=False)  # error: GPU010
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, pin_memory=True)  # error: GPU010
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
            """,
        ),
        Valid(  # options we cannot see
            """
            import torch
            from torch.utils.data import DataLoader
            kwargs = {"num_workers": 1, "pin_memory": True} if use_cuda else {}
            loader = DataLoader(ds, batch_size=64, **kwargs)
            model.cuda()
            """
        ),
        Valid(  # the dataset is already on the GPU: pinning would raise
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            x = torch.randn(1000, 8, device="cuda")
            loader = DataLoader(TensorDataset(x), batch_size=64)
            """
        ),
        Valid(  # no CUDA in the program
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64)
            """
        ),
        Valid(  # the collate function builds the batch on the GPU (through a helper): pinning would raise
            """
            import torch
            from torch.utils.data import DataLoader

            def collate_batch(batch, device, pad_id=0):
                ids = [torch.tensor(x, dtype=torch.int64, device=device) for x in batch]
                return torch.nn.utils.rnn.pad_sequence(ids, padding_value=pad_id)

            def create_loader(dataset, device):
                def collate_fn(batch):
                    return collate_batch(batch, device, pad_id=1)
                return DataLoader(dataset, batch_size=32, collate_fn=collate_fn)

            model = Net().cuda()
            """
        ),
        Valid(  # a lambda collate that moves the batch
            """
            import torch
            from torch.utils.data import DataLoader, default_collate
            device = torch.device("cuda")
            loader = DataLoader(ds, batch_size=64, collate_fn=lambda b: [t.to(device) for t in default_collate(b)])
            """
        ),
        Valid(  # partial(...) of a def, bound to a name first
            """
            import functools
            import torch
            from torch.utils.data import DataLoader

            def to_gpu_collate(batch, rank):
                x = torch.stack([b[0] for b in batch])
                return x.cuda(rank, non_blocking=True)

            collate = functools.partial(to_gpu_collate, rank=0)
            loader = DataLoader(ds, batch_size=64, collate_fn=collate)
            model.cuda()
            """
        ),
        Valid(  # the dataset class defined in the program hands out GPU tensors from __getitem__
            """
            import torch
            from torch.utils.data import DataLoader, Dataset

            class TokenDataset(Dataset):
                def __init__(self, tokens, rank):
                    self.tokens, self.rank = tokens, rank

                def __getitem__(self, i):
                    return torch.as_tensor(self.tokens[i]).to(self.rank)

            loader = DataLoader(TokenDataset(tokens, local_rank), batch_size=64)
            model.cuda()
            """
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64, shuffle=True)
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64, shuffle=True, pin_memory=True)
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
            """,
        ),
        Invalid(
            """
            import torch as th
            import torch.utils.data

            device = th.device("cuda" if th.cuda.is_available() else "cpu")
            loader = torch.utils.data.DataLoader(
                train_set,
                batch_size=64,
                num_workers=4,
            )
            """,
            fixed="""
            import torch as th
            import torch.utils.data

            device = th.device("cuda" if th.cuda.is_available() else "cpu")
            loader = torch.utils.data.DataLoader(
                train_set,
                batch_size=64,
                num_workers=4,
                pin_memory=device.type == "cuda",
            )
            """,
        ),
        Invalid(  # a collate function that stays on the CPU: pinning is safe
            """
            import torch
            from torch.utils.data import DataLoader, default_collate

            def collate(batch):
                return default_collate([b for b in batch if b is not None])

            loader = DataLoader(train_set, batch_size=64, collate_fn=collate)
            model.cuda()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader, default_collate

            def collate(batch):
                return default_collate([b for b in batch if b is not None])

            loader = DataLoader(train_set, batch_size=64, collate_fn=collate, pin_memory=True)
            model.cuda()
            """,
        ),
        Invalid(  # tensors returned by a function defined elsewhere: reported, but no fix (they may be on the GPU)
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            from features import extract_features
            feats, labels = extract_features(model, dataset, gather_on_cpu=False)
            loader = DataLoader(TensorDataset(feats, labels), batch_size=256)
            model.cuda()
            """
        ),
        Invalid(  # a collate function we cannot see: reported, but no fix (it may return CUDA tensors)
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64, collate_fn=train_set.collater)
            model.cuda()
            """
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ", "WARN"),
        setup=("from torch.utils.data import DataLoader, TensorDataset\n"
               "ds = TensorDataset(torch.randn(37, 5, device='cpu'), torch.arange(37, device='cpu'))"),
        before=("batches = list(DataLoader(ds, batch_size=8, shuffle=False))\n"
                "xs = torch.cat([b[0] for b in batches]).cpu()\n"
                "ys = torch.cat([b[1] for b in batches]).cpu()"),
        after=("device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
               "batches = list(DataLoader(ds, batch_size=8, shuffle=False, pin_memory=device.type == 'cuda'))\n"
               "xs = torch.cat([b[0] for b in batches]).cpu()\n"
               "ys = torch.cat([b[1] for b in batches]).cpu()"),
        compare=("xs", "ys"),
    )

    def visit_Call(self, node: cst.Call) -> None:
        pinned = call_arg(node, "pin_memory")
        turned_off = pinned is not None and dotted_name(pinned.value) == "False"
        if not checkable_loader_call(self.ctx, node) or pinned is not None and not turned_off:
            return
        if len([a for a in node.args if a.keyword is None]) > _PIN_MEMORY_POSITION:
            return  # pin_memory passed positionally
        if not (self.ctx.analysis.cuda_evidence or self.ctx.analysis.maybe_cuda_evidence
                or self._file_moves_to_device or self._escapes()):
            return  # a CPU-only consumer in this file (statistics, a test): pinning would not be used
        if turned_off and not (self._file_moves_to_device and (self.ctx.analysis.cuda_evidence
                                                               or self.ctx.analysis.maybe_cuda_evidence)):
            return  # `pin_memory=False` where this file sends nothing to a GPU: nothing to speed up
        dataset = loader_arg(node, "dataset")
        if dataset is not None and self._yields_cuda(dataset.value):
            return
        if self._read_once(node):
            return  # pinning a one-off load costs more than it saves (H100: 614 MB, 407 ms pinned vs 65 ms pageable)
        workers = loader_arg(node, "num_workers")
        if (workers is None or int_literal(workers.value) == 0) and dataset is not None and dataset_class(
                self.ctx, dataset.value, LoaderFlow.of(self.ctx.analysis)) in _SMALL_IMAGE_DATASETS:
            return  # pinning in the main process costs more than it saves on batches under 1 MB (H100)
        collate = loader_arg(node, "collate_fn")
        note = None
        unseen = self._unseen_tensor_source(dataset.value) if dataset is not None else None
        if unseen is not None:
            note = (f"the dataset's tensors come from `{unseen}(...)`, which is not visible here: if it returns CUDA "
                    "tensors, `pin_memory=True` raises")
        if collate is not None:
            if self._yields_cuda(collate.value):
                return
            verdict = _Collate(self.ctx).moves(collate.value, self.ctx.ancestors)
            if verdict:
                return  # the collate function builds the batch on the GPU: pinning would raise
            if verdict is None:
                note = _UNKNOWN_COLLATE_NOTE
        if note is not None:
            self.report(node, note=note)
            return
        device = self._device_variable()
        if device is not None:
            value, imports = f'{device}.type == "cuda"', ()  # follows the script's own device choice
        elif self.ctx.program.maybe_cuda_evidence or self._picks_device:
            value, imports = self.ctx.spell("torch.cuda.is_available")
            value += "()"
        else:
            value, imports = "True", ()
        if turned_off:
            self.report(node, "DataLoader with `pin_memory=False` in a CUDA program that moves its batches to the GPU: "
                              "host-to-device copies run from pageable memory", replacements=((pinned.value, value),),
                        imports=imports, safety=Safety.UNSAFE, note=_TURNED_OFF_NOTE)
            return
        self.report(node, replacement=add_keyword(node, "pin_memory", value), imports=imports)

    def _source(self) -> str:
        """The file's text as read (regenerating the module per DataLoader would be quadratic)."""
        return self.ctx.program.sources.get(self.ctx.path) or self.ctx.module.code

    # Facts of the whole file, asked at every DataLoader: computed once per file (per call they were quadratic).

    @cached_property
    def _picks_device(self) -> bool:
        """The script picks its device at run time (`--device`, `torch.cuda.is_available()`)."""
        return bool(_PICKS_DEVICE.search(self._source()))

    @cached_property
    def _device_assignments(self) -> dict[int, list[str]]:
        """id(scope) -> the names bound to `torch.device(...)` directly in that function (or the module), in
        walk order."""
        found: dict[int, list[str]] = {}
        scopes = [self.ctx.module, *(fn for fns in self.ctx.analysis.functions.values() for fn in fns)]
        for scope in scopes:
            names = found.setdefault(id(scope), [])
            for node in walk(scope, into_functions=False):
                if isinstance(node, cst.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0].target, cst.Name) and isinstance(node.value, cst.Call) \
                        and self.ctx.qualname(node.value.func) == "torch.device":
                    names.append(node.targets[0].target.value)
        return found

    def _device_variable(self) -> str | None:
        """The script's device variable at the loader: a name bound to `torch.device(...)` in the enclosing
        function (or at module level, not shadowed by a parameter), when the script picks its device at run
        time (`--device`, `torch.cuda.is_available()`)."""
        if not self._picks_device:
            return None
        function = self.ctx.enclosing(cst.FunctionDef)
        if isinstance(function, cst.FunctionDef):
            local = self._device_assignments.get(id(function))
            if local is None:  # a function the analysis does not list: look at it directly
                local = [n.targets[0].target.value for n in walk(function, into_functions=False)
                         if isinstance(n, cst.Assign) and len(n.targets) == 1
                         and isinstance(n.targets[0].target, cst.Name) and isinstance(n.value, cst.Call)
                         and self.ctx.qualname(n.value.func) == "torch.device"]
            if local:
                return local[0]
            params = {p.name.value for p in (*function.params.params, *function.params.kwonly_params)}
        else:
            params = set()
        return next((name for name in self._device_assignments[id(self.ctx.module)] if name not in params), None)

    def _read_once(self, node: cst.Call) -> bool:
        """The whole dataset in one batch (`batch_size=len(ds)`), or a loader only read by `next(iter(...))` at
        module level outside any loop: one copy per run, not one per step. (A `next` in a function may run every
        step: `def get_batch(): return next(it)`.)"""
        batch = loader_arg(node, "batch_size")
        if batch is not None and isinstance(batch.value, cst.Call) and dotted_name(batch.value.func) == "len":
            return True
        flow = LoaderFlow.of(self.ctx.analysis)
        carriers = flow.carriers(node)
        reads = flow.next_calls(carriers)
        return bool(reads) and not carriers.lightning_train and not flow.iterating_loops(carriers) and not any(
            isinstance(n, (cst.For, cst.While, cst.CompFor, cst.FunctionDef, cst.Lambda))
            for read in reads for n in flow.ancestors(read))

    # -- is the loader's output headed for the GPU? -------------------------------------------

    @cached_property
    def _file_moves_to_device(self) -> bool:
        placement = Placement(self.ctx)
        for node in walk(self.ctx.module, into_functions=True):
            if isinstance(node, cst.Call) and method_name(node) in ("to", "cuda") \
                    and isinstance(node.func, cst.Attribute):
                if method_name(node) == "cuda" or placement.target_of_to(node) == DEVICE:
                    return True
                target = call_arg(node, "device", 0)
                if target is not None and _DEVICE_VAR.search(dotted_name(target.value) or ""):
                    return True  # `.to(device)` with `device` chosen at run time (accelerator or CPU)
        return False

    def _escapes(self) -> bool:
        """The loader leaves this file: returned, stored on `self`, or bound at module level."""
        ancestors = self.ctx.ancestors
        parent = ancestors[-2] if len(ancestors) > 1 else None
        if isinstance(parent, cst.Return):
            return True
        statement = next((n for n in reversed(ancestors) if isinstance(n, cst.Assign)), None)
        if statement is None or statement.value is not ancestors[-1]:
            return False
        function = next((n for n in reversed(ancestors) if isinstance(n, cst.FunctionDef)), None)
        names = set()
        for target in statement.targets:
            if isinstance(target.target, cst.Attribute):
                return True  # self.train_loader = DataLoader(...)
            names |= {n.value for n in walk(target.target) if isinstance(n, cst.Name)}
        if function is None:
            return True  # module level: importable by the training script
        for node in walk(function.body):
            if isinstance(node, cst.Return) and node.value is not None and any(
                    isinstance(n, cst.Name) and n.value in names for n in walk(node.value)):
                return True
        return False

    # -- does a dataset / collate function hand out CUDA tensors? ----------------------------

    def _yields_cuda(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        if depth > 4:
            return False
        placement = Placement(self.ctx)
        if isinstance(node, cst.Call):
            if any(placement.of(arg.value) == DEVICE for arg in node.args if not arg.star):
                return True  # TensorDataset(x_cuda, y_cuda)
            if any(arg.keyword is not None and arg.keyword.value in ("device", "dev") for arg in node.args):
                return True  # MyDataset(..., device=device)
            if any(isinstance(arg.value, (cst.Name, cst.Attribute)) and re.search(
                    r"(^|_)(device|dev|cuda|gpu)$", dotted_name(arg.value) or "") for arg in node.args):
                return True  # MyDataset(path, device)
            if any(self._yields_cuda(arg.value, depth + 1) for arg in node.args if not arg.star):
                return True  # Subset(TensorDataset(x_cuda), idx)
            return self._class_moves_to_device(node.func)
        if isinstance(node, cst.Lambda):
            return bool(_MOVES_TO_DEVICE.search(self.ctx.code(node.body)))
        if isinstance(node, cst.Name):
            bindings = [b for b in self.ctx.analysis.bindings_of(node.value, self.ctx.ancestors)
                        if b.kind in (BindingKind.ASSIGN, BindingKind.UNPACK, BindingKind.FOR, BindingKind.PARAM)]
            if bindings:  # a variable: look at what was assigned to it, or the element it was unpacked from
                flow = LoaderFlow.of(self.ctx.analysis)
                return any(b.kind is BindingKind.ASSIGN and b.value is not None
                           and self._yields_cuda(b.value, depth + 1) for b in bindings) or any(
                    b.kind is BindingKind.UNPACK and b.value is not None and len(b.path) == 1
                    and self._yields_cuda(tuple_element(self.ctx, b.value, b.path[0], flow) or cst.Tuple([]),
                                          depth + 1) for b in bindings)
            return self._function_moves_to_device(node.value) or self._class_moves_to_device(node)
        if isinstance(node, cst.Attribute) and dotted_name(node) and dotted_name(node).startswith("self."):
            info = self.ctx.analysis.enclosing_class(self.ctx.ancestors)
            for binding in (info.attrs.get(node.attr.value, []) if info else []):
                if binding.kind is BindingKind.ASSIGN and binding.value is not None \
                        and self._yields_cuda(binding.value, depth + 1):
                    return True
            return self._function_moves_to_device(node.attr.value)
        return False

    def _unseen_tensor_source(self, node: cst.BaseExpression) -> str | None:
        """`TensorDataset(feats, labels)` where `feats, labels = extract_features(...)` is unpacked from a call
        whose definition is not in this file: the name of that call."""
        if not isinstance(node, cst.Call) or (dotted_name(node.func) or "").rsplit(".", 1)[-1] != "TensorDataset":
            return None
        flow = LoaderFlow.of(self.ctx.analysis)
        for arg in node.args:
            if not isinstance(arg.value, cst.Name):
                continue
            for binding in self.ctx.analysis.bindings_of(arg.value.value, self.ctx.ancestors):
                value = binding.value
                if binding.kind is BindingKind.UNPACK and isinstance(value, cst.Call) \
                        and tuple_element(self.ctx, value, binding.path[0] if binding.path else 0, flow) is None:
                    return dotted_name(value.func) or "a call"
        return None

    def _function_moves_to_device(self, name: str) -> bool:
        """A collate function defined in this file or elsewhere in the program that moves data to the GPU."""
        for fn in self.ctx.analysis.functions.get(name, []):
            if _MOVES_TO_DEVICE.search(self.ctx.code(fn)):
                return True
        return bool(_program_block_moves(self.ctx, "def", name))

    def _class_moves_to_device(self, func: cst.BaseExpression) -> bool:
        name = dotted_name(func)
        if name is None:
            return False
        last = name.rsplit(".", 1)[-1]
        info = self.ctx.analysis.classes.get(last)
        if info is not None:
            return bool(_MOVES_TO_DEVICE.search(self.ctx.code(info.node))) or _Collate(self.ctx).class_moves(info.node)
        return bool(_program_block_moves(self.ctx, "class", last))


class _Collate:
    """Follows a `collate_fn` (or a dataset's item methods) to its definition in this file and asks whether
    it puts tensors on a device. `moves` answers True (it does), False (it resolves and does not) or None
    (it cannot be resolved). Positions are tracked with `LoaderFlow` parents, so names resolve in the scope
    of the code that uses them, not at the DataLoader call."""

    _ITEM_METHODS = ("__getitem__", "__getitems__", "__iter__", "__next__")

    def __init__(self, ctx) -> None:  # noqa: ANN001 - RuleContext
        self.ctx = ctx
        self.a = ctx.analysis
        self.flow = LoaderFlow.of(ctx.analysis)
        self._seen: set[int] = set()

    # -- resolving the collate expression ----------------------------------------------------

    def moves(self, node: cst.BaseExpression, ancestors, depth: int = 0) -> bool | None:  # noqa: ANN001
        if depth > 5:
            return None
        if isinstance(node, cst.Name) and node.value == "None":
            return False
        if isinstance(node, cst.Lambda):
            return self._body_moves(node.body, depth)
        if isinstance(node, cst.Call):
            return self._call(node, ancestors, depth)
        if isinstance(node, cst.Name):
            return self._name(node, ancestors, depth)
        if isinstance(node, cst.Attribute):
            return self._attribute(node, ancestors, depth)
        return None

    def _call(self, node: cst.Call, ancestors, depth: int) -> bool | None:  # noqa: ANN001
        qual = self.a.call_qualname(node) or dotted_name(node.func) or ""
        if qual == "functools.partial" or qual.rsplit(".", 1)[-1] == "partial":
            positional = [a for a in node.args if a.keyword is None and not a.star]
            if not positional:
                return None
            for arg in node.args:
                if arg.keyword is not None and arg.keyword.value in ("device", "dev") \
                        and not self._is_host(arg.value, self.flow.ancestors(arg.value)):
                    return True  # partial(collate, device=device)
            return self.moves(positional[0].value, ancestors, depth + 1)
        if qual.startswith(_HOST_COLLATE_PREFIXES):
            return False
        last = (dotted_name(node.func) or "").rsplit(".", 1)[-1]
        info = self.a.classes.get(last)
        if info is not None:  # a collator object defined here: its `__call__`
            return self.class_moves(info.node, ("__call__",)) or bool(_MOVES_TO_DEVICE.search(self.ctx.code(info.node)))
        return _program_block_moves(self.ctx, "class", last) if last else None

    def _name(self, node: cst.Name, ancestors, depth: int) -> bool | None:  # noqa: ANN001
        qual = self.a.qualname(node) or node.value
        if qual.startswith(_HOST_COLLATE_PREFIXES):
            return False  # torch.utils.data.default_collate
        bindings = self.a.bindings_of(node.value, ancestors)
        assigned = [b for b in bindings if b.kind is BindingKind.ASSIGN and b.value is not None]
        if assigned:  # collate = partial(...) / lambda ...
            return _any_of(self.moves(b.value, self.flow.ancestors(b.value), depth + 1) for b in assigned)
        if any(b.kind is not BindingKind.OTHER for b in bindings):
            return None  # a parameter, a loop variable: the value is not in sight
        functions = self.a.functions.get(node.value, [])
        if functions:
            return any(self._function_moves(fn, depth) for fn in functions)
        # imported from another file of the program
        return _program_block_moves(self.ctx, "def", qual.rsplit(".", 1)[-1])

    def _attribute(self, node: cst.Attribute, ancestors, depth: int) -> bool | None:  # noqa: ANN001
        qual = self.a.qualname(node) or ""
        if qual.startswith(_HOST_COLLATE_PREFIXES):
            return False
        attr = node.attr.value
        if isinstance(node.value, cst.Name) and node.value.value == "self":
            info = self.a.enclosing_class(ancestors)
            if info is not None:
                assigned = [b for b in info.attrs.get(attr, []) if b.kind is BindingKind.ASSIGN and b.value is not None]
                if assigned:
                    return _any_of(self.moves(b.value, self.flow.ancestors(b.value), depth + 1) for b in assigned)
                methods = [fn for fn in walk(info.node.body, into_functions=True) if isinstance(fn, cst.FunctionDef)
                           and fn.name.value == attr]
                if methods:
                    return any(self._function_moves(fn, depth) for fn in methods)
        # `dataset.collater`, `utils.collate_fn`: a method or function defined somewhere in the program
        return _program_block_moves(self.ctx, "def", attr)

    # -- does a body put tensors on a device? ------------------------------------------------

    def class_moves(self, cls: cst.ClassDef, methods: tuple[str, ...] = _ITEM_METHODS) -> bool:
        return any(self._function_moves(fn, 0) for fn in walk(cls.body, into_functions=True)
                   if isinstance(fn, cst.FunctionDef) and fn.name.value in methods)

    def _function_moves(self, fn: cst.FunctionDef, depth: int) -> bool:
        if id(fn) in self._seen or depth > 4:
            return False
        self._seen.add(id(fn))
        return self._body_moves(fn.body, depth)

    def _body_moves(self, body: cst.CSTNode, depth: int) -> bool:
        for call in walk(body, into_functions=True):
            if not isinstance(call, cst.Call):
                continue
            name = method_name(call) if isinstance(call.func, cst.Attribute) else None
            if name == "cuda":
                return True
            if name == "to":
                target = call_arg(call, "device", 0)
                if target is not None and self._is_device(target.value, self.flow.ancestors(target.value)):
                    return True
            device = call_arg(call, "device")
            if device is not None and name != "to" and not self._is_host(device.value,
                                                                        self.flow.ancestors(device.value)):
                return True  # torch.tensor(..., device=device)
            # helpers it calls: `return collate_batch(batch, ..., device)`
            callee = call.func.value if isinstance(call.func, cst.Name) else call.func.attr.value if (
                isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name)
                and call.func.value.value == "self") else None
            if callee is not None and any(self._function_moves(fn, depth + 1)
                                          for fn in self.a.functions.get(callee, [])):
                return True
        return False

    def _is_host(self, node: cst.BaseExpression, ancestors) -> bool:  # noqa: ANN001
        """`device=None`, `device="cpu"`, `torch.device("cpu")`, or a name that only ever holds the CPU."""
        if isinstance(node, cst.Name) and node.value == "None":
            return True
        return Evidence(self.a, ancestors).device_of(node) is Device.CPU

    def _is_device(self, node: cst.BaseExpression, ancestors) -> bool:  # noqa: ANN001
        """The target of `.to(x)` is a device (not a dtype, not the CPU)."""
        device = Evidence(self.a, ancestors).device_of(node)
        if device is not None:
            return device is not Device.CPU
        if string_value(node) is not None:
            return False  # "cpu", "mps"
        qual = self.a.qualname(node) or ""
        if qual == "torch.device" or (isinstance(node, cst.Call) and self.a.call_qualname(node) == "torch.device"):
            return True
        if qual.startswith("torch."):
            return False  # torch.float16: a cast
        if isinstance(node, cst.Attribute) and node.attr.value == "device":
            return True  # .to(other.device)
        return bool(_DEVICE_LIKE.search(dotted_name(node) or ""))


def _any_of(verdicts) -> bool | None:  # noqa: ANN001 - iterable of bool | None
    """True if any says True, else None if any is unknown, else False."""
    result: bool | None = False
    for verdict in verdicts:
        if verdict:
            return True
        if verdict is None:
            result = None
    return result


# `def name(` / `class name` at the start of a line, in any file of the program
_BLOCK_HEADER = re.compile(r"(?m)^(?P<indent>[ \t]*)(?P<kind>def|class)\s+(?P<name>\w+)(?P<call>\s*\()?")
_CODE_LINE = re.compile(r"(?m)^(?P<i>[ \t]*)[^\s#]")


class _ProgramBlocks:
    """The `def` and `class` blocks of the program's files by (kind, name), and whether each moves data to the
    GPU: one scan of the program per run, one answer per name (asking per call site rescanned the program)."""

    def __init__(self, program) -> None:  # noqa: ANN001 - ProgramFacts
        self.headers: dict[tuple[str, str], list[re.Match[str]]] = {}
        for _, match in program.search(_BLOCK_HEADER):
            if match.group("kind") == "class" or match.group("call"):
                self.headers.setdefault((match.group("kind"), match.group("name")), []).append(match)
        self.answers: dict[tuple[str, str], bool | None] = {}

    def moves(self, kind: str, name: str) -> bool | None:
        key = (kind, name)
        if key not in self.answers:
            matches = self.headers.get(key)
            self.answers[key] = None if not matches else any(_block_moves(match) for match in matches)
        return self.answers[key]


def _block_moves(match: re.Match[str]) -> bool:
    text = match.string
    indent = len(match.group("indent"))
    body = text.find("\n", match.end()) + 1 or len(text)
    end = len(text)
    for line in _CODE_LINE.finditer(text, body):
        if len(line.group("i")) <= indent:
            end = line.start()
            break
    return bool(_MOVES_TO_DEVICE.search(text, match.start(), end))


def _program_block_moves(ctx, kind: str, name: str) -> bool | None:  # noqa: ANN001 - RuleContext
    """Does the indented block of `def name(` / `class name` in any file of the program move data to the GPU?
    None when no file of the program has such a block."""
    return ctx.program.derived("GPU010 blocks", _ProgramBlocks).moves(kind, name)
