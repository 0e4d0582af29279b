from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import (FileAnalysis, PerFileFacts, call_arg, child_nodes, dotted_name, has_star_args,
                              string_value, walk)
from gpulint.builders import add_keyword, replace_keyword_value
from gpulint.rule import is_test_path

# ---------------------------------------------------------------------------------------------
# DataLoader helpers shared by GPU050-GPU053 (imported by their rule files).

DATALOADER_QUALNAMES = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
# torch.utils.data.DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
# pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator, *, prefetch_factor, ...)
_POSITIONAL = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
               "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator")
_ITER_WRAPPERS = {"enumerate", "tqdm", "iter", "islice", "trange", "cycle", "prefetch", "track", "progress_bar",
                  "Prefetcher", "DataPrefetcher", "CudaPrefetcher", "prepare", "prepare_data_loader"}


def is_dataloader_call(analysis: FileAnalysis, call: cst.Call) -> bool:
    return analysis.call_qualname(call) in DATALOADER_QUALNAMES


def loader_arg(call: cst.Call, name: str) -> cst.Arg | None:
    """The argument bound to DataLoader parameter `name` (keyword or positional)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    if name in _POSITIONAL:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        index = _POSITIONAL.index(name)
        if len(positional) > index:
            return positional[index]
    return None


def int_literal(node: cst.BaseExpression | None) -> int | None:
    if isinstance(node, cst.Integer):
        try:
            return int(node.evaluated_value)
        except ValueError:
            return None
    return None


def checkable_loader_call(ctx, call: cst.Call) -> bool:
    """A DataLoader construction the loader rules judge: in CUDA code, outside tests, and without
    `*args`/`**kwargs` that may already set the option in question."""
    return is_dataloader_call(ctx.analysis, call) and not has_star_args(call) and not is_test_path(ctx.path) \
        and ctx.targets_cuda()


def iterated_expressions(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What a loop really iterates: `enumerate(tqdm(loader))` -> [loader]; `zip(a, b)` -> [a, b]."""
    if isinstance(node, cst.Call):
        last = (dotted_name(node.func) or "").rsplit(".", 1)[-1]
        positional = [a.value for a in node.args if a.keyword is None and not a.star]
        if last == "zip":
            return [inner for value in positional for inner in iterated_expressions(value)]
        if last in _ITER_WRAPPERS and positional:
            return iterated_expressions(positional[0])
    return [node]


def _strip_subscript(node: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(node, cst.Subscript):  # loaders["train"] -> loaders
        node = node.value
    return node


@dataclass
class _Carriers:
    """Where a DataLoader object travels inside one file: local names (scope-aware) and attribute names."""

    names: set[tuple[int, str]] = field(default_factory=set)  # (id(scope node), name)
    attrs: set[str] = field(default_factory=set)
    direct_loops: list[cst.CSTNode] = field(default_factory=list)  # `for b in DataLoader(...)`
    lightning_train: bool = False  # returned from `train_dataloader()`


class LoaderFlow(PerFileFacts):
    """Per-file facts to decide whether a DataLoader's batches reach the training step (catalog: "its batches
    reach H") and whether it is iterated once per epoch. Purely syntactic, name-based, one file."""

    def __init__(self, analysis: FileAnalysis) -> None:
        super().__init__(analysis)
        self.parents: dict[int, cst.CSTNode] = {}
        self.loops: list[cst.CSTNode] = []
        self.assigns: list[cst.CSTNode] = []
        self.calls: list[cst.Call] = []
        stack: list[cst.CSTNode] = [analysis.module]
        while stack:
            node = stack.pop()
            if isinstance(node, (cst.For, cst.While, cst.CompFor)):
                self.loops.append(node)
            elif isinstance(node, (cst.Assign, cst.AnnAssign)):
                self.assigns.append(node)
            elif isinstance(node, cst.Call):
                self.calls.append(node)
            for child in child_nodes(node):
                self.parents[id(child)] = node
                stack.append(child)
        self._training: dict[int, bool] = {}

    # -- structure -------------------------------------------------------------------------

    def ancestors(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        chain = [node]
        while id(chain[-1]) in self.parents:
            chain.append(self.parents[id(chain[-1])])
        return chain[::-1]

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        current = self.parents.get(id(node))
        while current is not None:
            if isinstance(current, cst.FunctionDef):
                return current
            current = self.parents.get(id(current))
        return None

    def _scopes_outward(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current: cst.CSTNode | None = node
        while current is not None:
            if isinstance(current, cst.FunctionDef) and current is not node:
                yield current
            current = self.parents.get(id(current))
        yield self.a.module

    def scope_of_use(self, name: str, node: cst.CSTNode) -> int:
        """id of the scope a name read at `node` resolves to."""
        for scope_node in self._scopes_outward(node):
            scope = self.a.scopes.get(id(scope_node))
            if scope is not None and name in scope.bindings and name not in scope.globals_:
                return id(scope_node)
        return id(self.a.module)

    def scope_of_binding(self, name: str, node: cst.CSTNode) -> int:
        for scope_node in self._scopes_outward(node):
            scope = self.a.scopes.get(id(scope_node))
            if scope is not None and name in scope.globals_:
                continue
            return id(scope_node)
        return id(self.a.module)

    def is_training_loop(self, loop: cst.CSTNode) -> bool:
        """A loop that is a training-step loop or contains one (same function)."""
        cached = self._training.get(id(loop))
        if cached is None:
            cached = any(self.a.hot.get(id(inner)) is HotKind.STEP_LOOP
                         for inner in walk(loop) if isinstance(inner, (cst.For, cst.While)))
            self._training[id(loop)] = cached
        return cached

    def in_training(self, node: cst.CSTNode) -> bool:
        """Is `node` inside a training loop or a training-step function?"""
        for ancestor in reversed(self.ancestors(node)):
            if isinstance(ancestor, (cst.For, cst.While)) and self.is_training_loop(ancestor):
                return True
            if isinstance(ancestor, cst.FunctionDef):
                return self.a.hot.get(id(ancestor)) is HotKind.STEP_FUNCTION
        return False

    # -- where the loader goes ----------------------------------------------------------------

    def _is_carrier(self, node: cst.BaseExpression, carriers: _Carriers) -> bool:
        for inner in iterated_expressions(node):
            inner = _strip_subscript(inner)
            if isinstance(inner, cst.Name) and (self.scope_of_use(inner.value, inner), inner.value) in carriers.names:
                return True
            if isinstance(inner, cst.Attribute) and inner.attr.value in carriers.attrs:
                return True
        return False

    def _bind(self, target: cst.BaseExpression, carriers: _Carriers, at: cst.CSTNode) -> bool:
        if isinstance(target, cst.Name):
            key = (self.scope_of_binding(target.value, at), target.value)
            if key not in carriers.names:
                carriers.names.add(key)
                return True
        elif isinstance(target, cst.Attribute):
            if target.attr.value not in carriers.attrs:
                carriers.attrs.add(target.attr.value)
                return True
        elif isinstance(target, cst.Subscript):
            return self._bind(_strip_subscript(target), carriers, at)
        return False

    def _seed(self, call: cst.Call, carriers: _Carriers, depth: int = 0) -> None:
        """Record where the value of `call` (a DataLoader or a function returning one) is stored."""
        node: cst.CSTNode = call
        parent = self.parents.get(id(node))
        # climb through wrappers: iter(DataLoader(...)), accelerator.prepare(DataLoader(...)), {"train": ...}
        while True:
            if isinstance(parent, cst.Arg) and isinstance(self.parents.get(id(parent)), cst.Call):
                outer = self.parents[id(parent)]
                assert isinstance(outer, cst.Call)
                last = (dotted_name(outer.func) or "").rsplit(".", 1)[-1]
                if last in _ITER_WRAPPERS:
                    node, parent = outer, self.parents.get(id(outer))
                    continue
                break
            if isinstance(parent, (cst.DictElement, cst.Element)):
                container = self.parents.get(id(parent))
                if isinstance(container, (cst.Dict, cst.List, cst.Tuple)):
                    grand = self.parents.get(id(container))
                    if isinstance(grand, (cst.Assign, cst.AnnAssign)) and not (
                            isinstance(container, cst.Tuple) and isinstance(grand, cst.Assign)
                            and any(isinstance(t.target, cst.Tuple) for t in grand.targets)):
                        node, parent = container, grand
                        continue
                    if isinstance(container, cst.Tuple) and isinstance(grand, cst.Assign):
                        index = list(container.elements).index(parent)
                        for target in grand.targets:
                            if isinstance(target.target, (cst.Tuple, cst.List)) and \
                                    len(target.target.elements) == len(container.elements):
                                self._bind(target.target.elements[index].value, carriers, grand)
                        return
                break
            break
        if isinstance(parent, cst.Assign):
            for target in parent.targets:
                self._bind(target.target, carriers, parent)
        elif isinstance(parent, cst.AnnAssign):
            self._bind(parent.target, carriers, parent)
        elif isinstance(parent, (cst.Return, cst.Yield)) and depth < 2:
            function = self.enclosing_function(parent)
            if function is None:
                return
            name = function.name.value
            if name in ("train_dataloader",):
                carriers.lightning_train = True
            for site in self.calls:
                func = site.func
                called = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(
                    func, cst.Attribute) else None
                if called == name and site is not call:
                    self._seed(site, carriers, depth + 1)
        elif isinstance(parent, cst.For) and parent.iter is node:
            carriers.direct_loops.append(parent)
        elif isinstance(parent, cst.Arg):
            outer = self.parents.get(id(parent))
            if isinstance(outer, cst.Call):
                self._into_call(outer, parent, carriers)

    def _params_for(self, call: cst.Call, arg: cst.Arg) -> list[tuple[cst.FunctionDef, str]]:
        """Parameter names of functions defined in this file that `arg` of `call` binds to."""
        func = call.func
        if isinstance(func, cst.Name):
            name, via_attribute = func.value, False
        elif isinstance(func, cst.Attribute):
            name, via_attribute = func.attr.value, True
        else:
            return []
        defs: list[cst.FunctionDef] = list(self.a.functions.get(name, []))
        is_class = name in self.a.classes
        if is_class:
            defs = [fn for fn in self.a.functions.get("__init__", [])
                    if self.a.function_class.get(id(fn)) is self.a.classes[name]]
        found = []
        for fn in defs:
            params = [*fn.params.posonly_params, *fn.params.params]
            method = id(fn) in self.a.function_class and (via_attribute or is_class)
            if method and params and params[0].name.value in ("self", "cls"):
                params = params[1:]
            if arg.keyword is not None:
                names = {p.name.value for p in [*params, *fn.params.kwonly_params]}
                if arg.keyword.value in names:
                    found.append((fn, arg.keyword.value))
                continue
            positional = [a for a in call.args if a.keyword is None]
            if any(a.star for a in positional[:positional.index(arg) + 1]):
                continue
            index = positional.index(arg)
            if index < len(params):
                found.append((fn, params[index].name.value))
        return found

    def _into_call(self, call: cst.Call, arg: cst.Arg, carriers: _Carriers) -> bool:
        changed = False
        for fn, param in self._params_for(call, arg):
            key = (id(fn), param)
            if key not in carriers.names:
                carriers.names.add(key)
                changed = True
        return changed

    def carriers(self, call: cst.Call) -> _Carriers:
        carriers = _Carriers()
        self._seed(call, carriers)
        for _ in range(6):  # propagate to a fixpoint (bounded)
            changed = False
            for assign in self.assigns:
                value = assign.value
                if value is None:
                    continue
                if self._is_carrier(value, carriers):
                    targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
                    for target in targets:
                        changed |= self._bind(target, carriers, assign)
                elif isinstance(value, cst.Call) and isinstance(assign, cst.Assign):
                    # model, opt, loader = accelerator.prepare(model, opt, loader)
                    positional = [a for a in value.args if a.keyword is None and not a.star]
                    for target in assign.targets:
                        if isinstance(target.target, (cst.Tuple, cst.List)) and \
                                len(target.target.elements) == len(positional) > 1:
                            for element, arg in zip(target.target.elements, positional):
                                if self._is_carrier(arg.value, carriers):
                                    changed |= self._bind(element.value, carriers, assign)
            for site in self.calls:
                for arg in site.args:
                    if not arg.star and self._is_carrier(arg.value, carriers):
                        changed |= self._into_call(site, arg, carriers)
            if not changed:
                break
        return carriers

    def iterating_loops(self, carriers: _Carriers) -> list[cst.CSTNode]:
        loops = list(carriers.direct_loops)
        for loop in self.loops:
            if isinstance(loop, (cst.For, cst.CompFor)) and self._is_carrier(loop.iter, carriers):
                loops.append(loop)
        return loops

    def next_calls(self, carriers: _Carriers) -> list[cst.Call]:
        """`next(it)` on an iterator of the loader."""
        return [c for c in self.calls if isinstance(c.func, cst.Name) and c.func.value == "next" and c.args
                and self._is_carrier(c.args[0].value, carriers)]

    def reaches_training(self, call: cst.Call) -> bool:
        carriers = self.carriers(call)
        if carriers.lightning_train:
            return True
        if any(self.is_training_loop(loop) for loop in self.iterating_loops(carriers)):
            return True
        return any(self.in_training(site) for site in self.next_calls(carriers))

    def iterated_per_epoch(self, call: cst.Call) -> cst.CSTNode | None:
        """The outer (epoch) loop around an iteration of this loader, if there is one."""
        carriers = self.carriers(call)
        for loop in self.iterating_loops(carriers):
            outer = self._outer_loop(loop)
            if outer is not None:
                return None if self._inside(call, outer) else outer  # rebuilt every pass: nothing persists
            function = self.enclosing_function(loop)
            if function is None:
                continue
            # the loader arrives as a parameter: only call sites that pass this loader count
            params = {p.name.value for p in [*function.params.posonly_params, *function.params.params,
                                             *function.params.kwonly_params]}
            via_parameter = isinstance(loop, (cst.For, cst.CompFor)) and any(
                isinstance(inner, cst.Name) and inner.value in params for inner in iterated_expressions(loop.iter))
            # the function iterating the loader is itself called inside a loop (one level)
            for site in self.calls:
                func = site.func
                called = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(
                    func, cst.Attribute) else None
                if called != function.name.value or (via_parameter and not any(
                        not a.star and self._is_carrier(a.value, carriers) for a in site.args)):
                    continue
                outer = self._outer_loop(site)
                if outer is not None and not self._inside(call, outer) and not self._inside(call, function):
                    return outer  # (a loader the function builds itself is used once per call)
        return None

    def _inside(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        current = self.parents.get(id(node))
        while current is not None:
            if current is ancestor:
                return True
            current = self.parents.get(id(current))
        return False

    def _outer_loop(self, node: cst.CSTNode) -> cst.CSTNode | None:
        current = self.parents.get(id(node))
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            if isinstance(current, (cst.For, cst.While)) and not _runs_once(current):
                return current
            current = self.parents.get(id(current))
        return None


def _runs_once(loop: cst.CSTNode) -> bool:
    """`for epoch in range(1)`."""
    if isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call) and dotted_name(loop.iter.func) == "range":
        args = [a.value for a in loop.iter.args]
        return len(args) == 1 and int_literal(args[0]) in (0, 1)
    return False


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
    for path, match in ctx.program.search(pattern):
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


def _resolve(ctx, node: cst.BaseExpression, flow: LoaderFlow, depth: int = 0) -> cst.BaseExpression:
    """Follow a name to the expression it holds, a few steps: its single reaching assignment, an element of
    a tuple it was unpacked from (also from a local function's `return a, b`), or the argument passed for it
    at the first call site in this file when it is a parameter."""
    while depth < 5 and isinstance(node, cst.Name):
        bindings = ctx.analysis.reaching_bindings(node.value, flow.ancestors(node))
        if len(bindings) != 1:
            return node
        binding = bindings[0]
        kind = binding.kind.value
        if kind == "assign" and binding.value is not None:
            node = binding.value
        elif kind == "unpack" and binding.value is not None and len(binding.path) == 1:
            found = tuple_element(ctx, binding.value, binding.path[0], flow)
            if found is None:
                return node
            node = found
        elif kind == "param":
            found = _argument_for(ctx, node, flow)
            if found is None:
                return node
            node = found
        else:
            return node
        depth += 1
    return node


def tuple_element(ctx, value: cst.BaseExpression, index: int, flow: LoaderFlow) -> cst.BaseExpression | None:
    if isinstance(value, cst.Tuple):
        return value.elements[index].value if index < len(value.elements) else None
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
        for fn in ctx.analysis.functions.get(value.func.value, []):
            for inner in walk(fn.body):
                if isinstance(inner, cst.Return) and isinstance(inner.value, cst.Tuple) \
                        and index < len(inner.value.elements):
                    return inner.value.elements[index].value
    return None


def _argument_for(ctx, name: cst.Name, flow: LoaderFlow) -> cst.BaseExpression | None:
    function = flow.enclosing_function(name)
    while function is not None and name.value not in {
            p.name.value for p in [*function.params.posonly_params, *function.params.params,
                                   *function.params.kwonly_params]}:
        function = flow.enclosing_function(function)
    if function is None:
        return None
    params = [p.name.value for p in [*function.params.posonly_params, *function.params.params]]
    method = id(function) in ctx.analysis.function_class
    for site in flow.calls:
        func = site.func
        called = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(
            func, cst.Attribute) else None
        if called != function.name.value or any(a.star for a in site.args):
            continue
        for arg in site.args:
            if arg.keyword is not None and arg.keyword.value == name.value:
                return arg.value
        positional = [a for a in site.args if a.keyword is None]
        offset = 1 if method and isinstance(func, cst.Attribute) and params[:1] in (["self"], ["cls"]) else 0
        if name.value in params:
            index = params.index(name.value) - offset
            if 0 <= index < len(positional):
                return positional[index].value
    return None


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
            resolved = _resolve(ctx, inner, flow)  # `collate = lambda b: ...` at module level, too
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
    expr = _resolve(ctx, node, flow)
    # random_split(...)[0] / a dict of datasets: look at the container's source
    while isinstance(expr, cst.Subscript):
        expr = _resolve(ctx, expr.value, flow)
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


def dataset_class(ctx, node: cst.BaseExpression, flow: LoaderFlow) -> str | None:
    """The class a dataset expression is built from (`MNIST` for `ds = datasets.MNIST(...)`), if visible."""
    expr = _resolve(ctx, node, flow)
    while isinstance(expr, cst.Subscript):
        expr = _resolve(ctx, expr.value, flow)
    if not isinstance(expr, cst.Call):
        return None
    return (dotted_name(expr.func) or "").rsplit(".", 1)[-1] or None


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

    node = _resolve(ctx, node, flow)
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
        expr = _resolve(self.ctx, collate.value, flow)
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
