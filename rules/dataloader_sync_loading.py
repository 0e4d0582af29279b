from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg, dotted_name, string_value, walk
from gpulint.builders import add_keyword, replace_keyword_value
from gpulint.semantic.loaders import LoaderFlow, checkable_loader_call, int_literal, loader_arg, resolve
from gpulint.semantic.program_text import shared_dirs

# ---------------------------------------------------------------------------------------------
# DataLoader helpers shared by GPU050-GPU053 (imported by their rule files).


# ---------------------------------------------------------------------------------------------
# what the dataset is


@dataclass
class DatasetFacts:
    kind: str  # "map" (map-style, known), "iterable", "iterable-sharded", "unknown"
    gpu_resident: bool = False
    cheap: bool = False  # an in-memory dataset whose __getitem__ only indexes (IPC would cost more)
    unpicklable: str | None = None  # why workers may fail to pickle it under spawn/forkserver
    fork_unsafe: str | None = None  # an open handle created in __init__
    constructed: bool = False  # built here from a dataset class (`CocoDataset(...)`), even one not visible


_MAP_STYLE_PREFIXES = ("torchvision.datasets.", "torchaudio.datasets.", "torchtext.datasets.")
_MAP_STYLE_CALLS = {"ImageFolder", "DatasetFolder", "Subset", "ConcatDataset", "MNIST", "FashionMNIST", "CIFAR10",
                    "CIFAR100", "ImageNet", "SVHN", "CelebA", "STL10", "LSUN", "CocoDetection", "VOCSegmentation",
                    "Cityscapes", "Omniglot", "EMNIST", "KMNIST", "QMNIST", "Places365", "Flowers102",
                    "Food101", "OxfordIIITPet", "StanfordCars", "Caltech101"}
_CUDA_IN_CLASS = re.compile(r"\.cuda\(|\.to\(\s*(self\.)?(device|dev)\b|\.to\(\s*['\"]cuda|device\s*=\s*(self\.)?device|"
                            r"device\s*=\s*['\"]cuda")
_FORK_UNSAFE = re.compile(r"\b(h5py\.File|lmdb\.open|sqlite3\.connect|tables\.open_file|zarr\.open|"
                          r"psycopg2\.connect|pymongo\.MongoClient|cv2\.VideoCapture)\s*\(")
_ITERABLE_BASE = re.compile(r"\b(IterableDataset|IterDataPipe)\b")


def _class_source(ctx, name: str) -> tuple[str, str] | None:
    """(bases text, body text) of a class `name` defined in this file or elsewhere in the program."""
    info = ctx.analysis.classes.get(name)
    if info is not None:
        bases = " ".join(ctx.code(b) for b in info.node.bases)
        return bases, ctx.code(info.node)
    pattern = re.compile(r"^([ \t]*)class\s+" + re.escape(name) + r"\s*\(([^)]*)\)\s*:", re.M)
    # the definition nearest to this file first (`from datautils import MyTrainDataset` beside it), not the
    # first of the run: a copy of the class elsewhere in the run (a truncated one, another project's) may differ
    found = sorted(ctx.program.search(pattern), key=lambda item: -shared_dirs(ctx.path, item[0]))
    for path, match in found:
        text = ctx.program.sources.get(path, "")
        indent = match.group(1)
        rest = text[match.end():]
        end = re.search(r"^" + re.escape(indent) + r"(class|def|@)\b|^\S", rest, re.M)
        body = rest[:end.start()] if end else rest
        return match.group(2), body
    return None


def _init_source(body: str) -> str:
    match = re.search(r"def\s+__init__\s*\(.*?(?=\n[ \t]*def\s|\Z)", body, re.S)
    return match.group(0) if match else ""


def _getitem_is_indexing(body: str) -> bool:
    """`def __getitem__(self, i): return self.x[i], self.y[i]`: nothing to parallelise."""
    match = re.search(r"def\s+__getitem__\s*\(\s*self\s*,\s*(\w+)[^)]*\)[^:]*:\s*\n((?:[ \t]*(?:#.*)?\n|[ \t]+.*\n?)*)",
                      body)
    if not match:
        return False
    index = match.group(1)
    lines = [ln.strip() for ln in match.group(2).splitlines() if ln.strip() and not ln.strip().startswith("#")]
    # stop at the next def
    statements = []
    for line in lines:
        if line.startswith(("def ", "@")):
            break
        statements.append(line)
    if len(statements) != 1 or not statements[0].startswith("return "):
        return False
    returned = statements[0][len("return "):]
    item = r"self\.\w+\[\s*" + re.escape(index) + r"\s*\]"
    return bool(re.fullmatch(r"\(?\s*" + item + r"(\s*,\s*" + item + r")*\s*,?\s*\)?", returned))


def _unpicklable(ctx, node: cst.CSTNode, flow: LoaderFlow, depth: int = 0) -> str | None:
    """A lambda or a function/class defined inside a function, reachable from `node`."""
    if depth > 2:
        return None
    for inner in walk(node, into_functions=True):
        if isinstance(inner, cst.Lambda):
            return "a lambda"
        if isinstance(inner, cst.Name):
            name = inner.value
            scope_id = flow.scope_of_use(name, inner)
            if scope_id != id(ctx.analysis.module):
                local_defs = [fn for fn in ctx.analysis.functions.get(name, []) if id(fn) != scope_id
                              and flow.enclosing_function(fn) is not None and id(flow.enclosing_function(fn)) == scope_id]
                local_class = name in ctx.analysis.classes and flow.enclosing_function(
                    ctx.analysis.classes[name].node) is not None
                if local_defs or local_class:
                    return f"the local {'class' if local_class else 'function'} `{name}`"
            resolved = resolve(ctx, inner, flow)  # `collate = lambda b: ...` at module level, too
            if resolved is not inner:
                found = _unpicklable(ctx, resolved, flow, depth + 1)
                if found:
                    return found
    return None


def dataset_facts(ctx, call: cst.Call, flow: LoaderFlow) -> DatasetFacts:
    arg = loader_arg(call, "dataset")
    if arg is None:
        return DatasetFacts("unknown")
    facts = expression_facts(ctx, arg.value, flow)
    facts.unpicklable = _unpicklable(ctx, arg.value, flow)
    return facts


def expression_facts(ctx, node: cst.BaseExpression, flow: LoaderFlow, depth: int = 0) -> DatasetFacts:
    """What kind of dataset `node` is, as far as this file and the program's class definitions show."""
    facts = DatasetFacts("unknown")
    expr = resolve(ctx, node, flow)
    # random_split(...)[0] / a dict of datasets: look at the container's source
    while isinstance(expr, cst.Subscript):
        expr = resolve(ctx, expr.value, flow)
    if not isinstance(expr, cst.Call) or depth > 2:
        return facts
    qual = ctx.analysis.call_qualname(expr) or ""
    last = (dotted_name(expr.func) or "").rsplit(".", 1)[-1]
    if last == "TensorDataset" or qual == "torch.utils.data.TensorDataset":
        facts.kind, facts.cheap = "map", True
        facts.gpu_resident = any(_cuda_expr(ctx, a.value, flow) for a in expr.args)
    elif qual.startswith(_MAP_STYLE_PREFIXES) or last in _MAP_STYLE_CALLS:
        facts.kind = "map"
    elif last == "random_split" and expr.args:
        return expression_facts(ctx, expr.args[0].value, flow, depth + 1)
    elif last == "load_dataset":  # Hugging Face datasets: map-style unless streaming
        streaming = next((a for a in expr.args if a.keyword and a.keyword.value == "streaming"), None)
        facts.kind = "iterable" if streaming is not None and dotted_name(streaming.value) != "False" else "map"
    elif last[:1].isupper():
        facts.constructed = True
        source = _class_source(ctx, last)
        if source is not None:
            _facts_from_class(*source, facts)
    elif isinstance(expr.func, cst.Name):  # a same-file helper: what its `return` statements build
        for fn in ctx.analysis.functions.get(expr.func.value, []):
            for inner in walk(fn.body):
                if isinstance(inner, cst.Return) and inner.value is not None:
                    returned = expression_facts(ctx, inner.value, flow, depth + 1)
                    if returned.kind != "unknown":
                        return returned
    return facts


def _facts_from_class(bases: str, body: str, facts: DatasetFacts) -> None:
    if _ITERABLE_BASE.search(bases) or (re.search(r"def\s+__iter__\s*\(", body)
                                        and not re.search(r"def\s+__getitem__\s*\(", body)):
        facts.kind = "iterable-sharded" if "get_worker_info" in body else "iterable"
    elif re.search(r"def\s+__getitem__\s*\(", body):
        facts.kind = "map"
        facts.cheap = _getitem_is_indexing(body)
    if _CUDA_IN_CLASS.search(body):
        facts.gpu_resident = True
    init = _init_source(body)
    handle = _FORK_UNSAFE.search(init)
    if handle:
        facts.fork_unsafe = handle.group(1)


def _cuda_expr(ctx, node: cst.BaseExpression, flow: LoaderFlow) -> bool:
    from gpulint.analysis import Device, Evidence, method_name

    node = resolve(ctx, node, flow)
    for inner in walk(node):
        if isinstance(inner, cst.Call):
            name = method_name(inner)
            if name == "cuda":
                return True
            evidence = Evidence(ctx.analysis, flow.ancestors(inner))
            if name == "to" and inner.args and evidence.device_of(inner.args[0].value) in (Device.CUDA,
                                                                                             Device.MAYBE_CUDA):
                return True
            for arg in inner.args:  # an explicit `device=` that is not provably the CPU: maybe the GPU
                if arg.keyword is not None and arg.keyword.value == "device" and \
                        evidence.device_of(arg.value) is not Device.CPU:
                    return True
    return False


# ---------------------------------------------------------------------------------------------


class DataloaderSyncLoading(Rule):
    """
    ## What it does
    Finds a `DataLoader` whose batches feed the training step but that loads data in the main process
    (`num_workers` absent or `0`).

    ## Why is this slow
    With `num_workers=0` every batch is read, decoded and augmented by the training process itself, between
    two optimizer steps, so the GPU idles while the CPU prepares the next batch. Worker processes prepare
    batches in parallel and ahead of time. Measured on an H100 host with a CPU-heavy dataset: 3811 samples/s
    with no workers, 12724 samples/s with 4 workers, `pin_memory` and persistent workers (x3.3). The PyTorch
    tuning guide: "Setting num_workers > 0 enables asynchronous data loading and overlap between the training
    and data loading".

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=64, shuffle=True)
    for x, y in loader:
        loss = criterion(model(x.cuda()), y.cuda())
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=min(8, os.cpu_count() or 1))
    ```
    Pair it with `pin_memory=True` (GPU010) and `persistent_workers=True` (GPU051).

    ## Fix safety
    Unsafe. Worker processes must be able to receive the dataset: under the spawn/forkserver start methods
    (Windows, macOS, and Linux from Python 3.14) lambdas and local functions cannot be pickled; datasets that
    hold open file or database handles may break after a fork; random augmentations use per-worker seeds, so
    batches differ from a run without workers. The rule reports without a fix when it can see such a hazard
    (lambda or local function in `collate_fn`/`worker_init_fn`/the dataset, an `IterableDataset` that does not
    shard with `get_worker_info()`, a handle opened in `__init__`, a script that trains at module level without
    `if __name__ == "__main__":`, which each spawned worker would re-run) or cannot see the dataset's type. It does not
    fire for datasets that live on the GPU or only index in-memory tensors (`TensorDataset`), where worker IPC
    costs more than it saves, for calls that pass `*args`/`**kwargs`, or in tests.
    """

    code = "GPU050"
    name = "dataloader-sync-loading"
    message = "DataLoader feeding the training step loads batches in the main process (`num_workers` is 0)"
    fix_title = "Add `num_workers=min(8, os.cpu_count() or 1)`"
    severity = Severity.WARNING
    safety = Safety.UNSAFE
    priority = "P1"
    triggers = ("DataLoader",)
    examples = [
        Invalid(  # a script that trains at module level: spawned workers would re-run it, so no fix
            """
            import torch
            from torch.utils.data import DataLoader, Dataset
            class Frames(Dataset):
                def __len__(self):
                    return 1000
                def __getitem__(self, i):
                    return torch.load(f"frames/{i}.pt")
            model = build().cuda()
            for frame in DataLoader(Frames(), batch_size=8):
                model(frame.cuda(non_blocking=True)).mean().backward()
            """,
            fixed=None,
        ),
        Valid(
            """
            import os
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            device = torch.device("cuda")
            train_set = datasets.MNIST("data", train=True, download=True)
            loader = DataLoader(train_set, batch_size=64, num_workers=4)
            for x, y in loader:
                loss = model(x.to(device)).sum()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a TensorDataset from a same-file helper; a parameter of unknown type; a collate on the GPU
            """
            import functools
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            def load_features(path):
                ids = torch.load(path)
                return TensorDataset(ids, ids)
            def train(model, optimizer, dataset, path):
                cached = DataLoader(load_features(path), batch_size=32)
                given = DataLoader(dataset, batch_size=32)
                on_gpu = DataLoader(dataset, batch_size=32, collate_fn=functools.partial(pad, device="cuda:0"))
                for x, y in cached:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
                for x, y in given:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
                for x, y in on_gpu:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """
        ),
        Valid(  # a GPU-resident TensorDataset: workers cannot touch CUDA tensors
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            x = torch.randn(1000, 8).cuda()
            y = torch.randn(1000, 1).cuda()
            loader = DataLoader(TensorDataset(x, y), batch_size=64)
            for xb, yb in loader:
                loss = (model(xb) - yb).pow(2).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # **kwargs may carry num_workers
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            kwargs = {"num_workers": 1, "pin_memory": True} if torch.cuda.is_available() else {}
            loader = DataLoader(datasets.MNIST("data"), batch_size=64, **kwargs)
            for x, y in loader:
                model(x).sum().backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            def main():
                train_set = datasets.CIFAR10("data", train=True, download=True)
                loader = DataLoader(train_set, batch_size=128, shuffle=True)
                for epoch in range(10):
                    for x, y in loader:
                        loss = criterion(model(x.to(device)), y.to(device))
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            import os
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            def main():
                train_set = datasets.CIFAR10("data", train=True, download=True)
                loader = DataLoader(train_set, batch_size=128, shuffle=True, num_workers=min(8, os.cpu_count() or 1))
                for epoch in range(10):
                    for x, y in loader:
                        loss = criterion(model(x.to(device)), y.to(device))
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # a lambda collate_fn cannot be pickled under spawn: reported without a fix
            """
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            loader = DataLoader(datasets.MNIST("data"), batch_size=64, num_workers=0,
                                collate_fn=lambda b: torch.utils.data.default_collate(b))
            for x, y in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup=("import os\n"
               "from torch.utils.data import DataLoader, Dataset\n"
               "class Squares(Dataset):\n"
               "    def __len__(self):\n"
               "        return 64\n"
               "    def __getitem__(self, i):\n"
               "        return torch.arange(3, device='cpu', dtype=torch.float32) * i ** 2, i\n"
               "ds = Squares()"),
        before=("batches = list(DataLoader(ds, batch_size=8, shuffle=False))\n"
                "xs = torch.cat([b[0] for b in batches])\n"
                "ids = torch.cat([b[1] for b in batches])"),
        after=("batches = list(DataLoader(ds, batch_size=8, shuffle=False, num_workers=min(8, os.cpu_count() or 1)))\n"
               "xs = torch.cat([b[0] for b in batches])\n"
               "ids = torch.cat([b[1] for b in batches])"),
        compare=("xs", "ids"),
        options={"host_only": True},  # forked DataLoader workers cannot touch CUDA
    )

    def visit_Call(self, node: cst.Call) -> None:
        if not checkable_loader_call(self.ctx, node):
            return
        workers = loader_arg(node, "num_workers")
        if workers is not None and int_literal(workers.value) != 0:
            return
        flow = LoaderFlow.of(self.ctx.analysis)
        if not flow.reaches_training(node):
            return
        facts = dataset_facts(self.ctx, node, flow)
        if facts.gpu_resident or facts.cheap or self._collate_builds_on_device(node, flow):
            return
        if facts.kind == "unknown" and not facts.constructed:
            return  # a parameter or another module's helper: nothing shows that loading costs anything
        reason = self._no_fix_reason(node, facts, flow)
        if reason is not None:
            self.report(node, note=reason)
            return
        cpu_count, imports = self.ctx.spell("os.cpu_count")
        value = f"min(8, {cpu_count}() or 1)"
        if workers is None:
            replacement = add_keyword(node, "num_workers", value)
        elif workers.keyword is not None:
            replacement = replace_keyword_value(node, "num_workers", value)
        else:
            replacement = node.deep_replace(workers.value, cst.parse_expression(value))
        self.report(node, replacement=replacement, imports=imports)

    def _collate_builds_on_device(self, node: cst.Call, flow: LoaderFlow) -> bool:
        """`collate_fn=partial(make_batch, device="cuda:0")`: batches are built on the GPU, where worker
        processes cannot work."""
        collate = loader_arg(node, "collate_fn")
        if collate is None:
            return False
        expr = resolve(self.ctx, collate.value, flow)
        if not isinstance(expr, cst.Call) or (dotted_name(expr.func) or "").rsplit(".", 1)[-1] != "partial":
            return False
        device = call_arg(expr, "device") or call_arg(expr, "dev")
        return device is not None and string_value(device.value) != "cpu"

    def _no_fix_reason(self, node: cst.Call, facts: DatasetFacts, flow: LoaderFlow) -> str | None:
        if facts.kind == "iterable":
            return ("the dataset is an IterableDataset that does not shard with `get_worker_info()`: every worker "
                    "would yield the whole stream (duplicated samples); shard it before adding workers")
        if facts.fork_unsafe:
            return (f"the dataset opens `{facts.fork_unsafe}` in `__init__`; open it lazily in each worker "
                    "before adding workers")
        for keyword in ("collate_fn", "worker_init_fn", "sampler", "batch_sampler"):
            arg = loader_arg(node, keyword)
            if arg is not None:
                why = _unpicklable(self.ctx, arg.value, flow)
                if why:
                    return (f"`{keyword}` is {why}, which worker processes cannot unpickle under the spawn/forkserver "
                            "start methods; use a function defined at module level before adding workers")
        if facts.unpicklable:
            return (f"the dataset uses {facts.unpicklable}, which worker processes cannot unpickle under the "
                    "spawn/forkserver start methods; use a function defined at module level before adding workers")
        if facts.kind == "unknown":
            return ("the dataset's type is not visible here (an IterableDataset would yield duplicated samples with "
                    "workers); set `num_workers` after checking it")
        if self._script_without_main_guard(node):
            return ("the script runs at import time without `if __name__ == \"__main__\":`; under the spawn/"
                    "forkserver start methods every worker would re-run it; add the guard before adding workers")
        return None

    def _script_without_main_guard(self, node: cst.Call) -> bool:
        """A script whose training runs at module level (the loader is built there, or a top-level loop runs):
        worker processes started by spawn/forkserver import `__main__` again, re-running all of it."""
        module = self.ctx.module
        if self.ctx.analysis.main_guard is not None:
            return False
        return self.ctx.enclosing(cst.FunctionDef, cst.Lambda) is None or any(
            isinstance(statement, (cst.For, cst.While)) for statement in module.body)
