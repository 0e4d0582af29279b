"""DataLoader flow: where loaders are built, their arguments, and how they reach the training step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import libcst as cst

from gpulint import HotKind
from gpulint.analysis import (FileAnalysis, FileStructure, PerFileFacts, dotted_name, every_many_steps, has_star_args,
                              walk)
from gpulint.rule import is_test_path

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


def iterated_expressions(node: cst.BaseExpression, yielders: dict[str, int] | None = None) -> list[cst.BaseExpression]:
    """What a loop really iterates: `enumerate(tqdm(loader))` -> [loader]; `zip(a, b)` -> [a, b]; with `yielders`
    (program generators re-yielding an argument: name -> position), `logger.log_every(loader, 10)` -> [loader]."""
    if isinstance(node, cst.Call):
        last = (dotted_name(node.func) or "").rsplit(".", 1)[-1]
        positional = [a.value for a in node.args if a.keyword is None and not a.star]
        if last == "zip":
            return [inner for value in positional for inner in iterated_expressions(value, yielders)]
        if last in _ITER_WRAPPERS and positional:
            return iterated_expressions(positional[0], yielders)
        if yielders and last in yielders and yielders[last] < len(positional):
            return iterated_expressions(positional[yielders[last]], yielders)
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
    fed_elsewhere: bool = False  # returned to, or passed into, a training loop of another function or file
    fed_per_epoch: bool = False  # returned to, or passed into, code elsewhere that iterates it again and again
    # loops here that hand it, pass after pass, to a function iterating it (`for epoch ...: train(loader)`)
    handing_loops: list[cst.CSTNode] = field(default_factory=list)
    # (id(scope node), name) -> positions of a list or tuple that hold it (`train(..., [train_loader, val_loader])`)
    elements: dict[tuple[int, str], set[int]] = field(default_factory=dict)
    added: list[tuple] = field(default_factory=list)  # every key above, in the order it was found (a work list)

    def add_name(self, scope: int, name: str) -> bool:
        if (scope, name) in self.names:
            return False
        self.names.add((scope, name))
        self.added.append(("n", scope, name))
        return True

    def add_element(self, scope: int, name: str, position: int) -> bool:
        positions = self.elements.setdefault((scope, name), set())
        if position in positions:
            return False
        positions.add(position)
        self.added.append(("n", scope, name))
        return True

    def add_attr(self, attr: str) -> bool:
        if attr in self.attrs:
            return False
        self.attrs.add(attr)
        self.added.append(("a", attr))
        return True


def _called_name(call: cst.Call) -> str | None:
    """`f` for `f(...)` and `obj.f(...)`."""
    func = call.func
    return func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None


class LoaderFlow(PerFileFacts):
    """Per-file facts to decide whether a DataLoader's batches reach the training step (catalog: "its batches
    reach H") and whether it is iterated once per epoch. Purely syntactic, name-based, one file.

    Every question about one loader costs time in proportion to the places its value reaches, not to the
    file: the assignments, call arguments, loops and `next()` calls of the file are indexed once by the names
    they read (`_uses`), and calls by the name they call (`calls_to`)."""

    def __init__(self, analysis: FileAnalysis) -> None:
        super().__init__(analysis)
        # the program's generators that re-yield an argument's items (the call graph's `#yields-argument:` markers)
        self.yielders = {name: int(position) for key in analysis.program_keys if "#yields-argument:" in key
                         for name, _, position in [key.split("#yields-argument:", 1)[1].rpartition(":")]}
        structure = FileStructure.of(analysis)
        self.parents = structure.parents
        self.loops, self.assigns, self.calls, self.returns = (structure.loops, structure.assigns, structure.calls,
                                                              structure.returns)
        self._training: dict[int, bool] = {}
        self._by_called: dict[str, list[cst.Call]] | None = None
        self._use_index: dict[tuple, list[tuple]] | None = None

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

    def calls_to(self, name: str) -> list[cst.Call]:
        """Calls of the file whose callee is named `name` (`name(...)` or `obj.name(...)`), in file order."""
        if self._by_called is None:
            self._by_called = {}
            for site in self.calls:
                called = _called_name(site)
                if called is not None:
                    self._by_called.setdefault(called, []).append(site)
        return self._by_called.get(name, [])

    # -- where the loader goes ----------------------------------------------------------------

    def _keys(self, node: cst.BaseExpression) -> list[tuple]:
        """The carrier keys `_is_carrier` would test for `node`."""
        if isinstance(node, (cst.List, cst.Tuple)):  # a loader handed over inside a list (see `_into_call`)
            return [key for element in node.elements for key in self._keys(element.value)]
        if isinstance(node, cst.Dict):  # `loaders = {"train": train_loader, "val": val_loader}`
            return [key for element in node.elements if isinstance(element, cst.DictElement)
                    for key in self._keys(element.value)]
        keys = []
        for inner in iterated_expressions(node, self.yielders):
            inner = _strip_subscript(inner)
            if isinstance(inner, cst.Name):
                keys.append(("n", self.scope_of_use(inner.value, inner), inner.value))
            elif isinstance(inner, cst.Attribute):
                keys.append(("a", inner.attr.value))
        return keys

    def _uses(self) -> dict[tuple, list[tuple]]:
        """Carrier key -> the places that read it: ("assign", statement), ("arg", call, arg), ("loop", index in
        `loops`), ("next", index in `calls`). Built once per file, on the first loader question."""
        if self._use_index is not None:
            return self._use_index
        index: dict[tuple, list[tuple]] = {}

        def add(node: cst.BaseExpression, entry: tuple) -> None:
            for key in self._keys(node):
                index.setdefault(key, []).append(entry)

        for assign in self.assigns:
            value = assign.value
            if value is None:
                continue
            add(value, ("assign", assign))
            if isinstance(value, cst.Call) and isinstance(assign, cst.Assign):
                for arg in value.args:
                    if arg.keyword is None and not arg.star:
                        add(arg.value, ("assign", assign))
        for position, site in enumerate(self.calls):
            for arg in site.args:
                if not arg.star:
                    add(arg.value, ("arg", site, arg))
            if isinstance(site.func, cst.Name) and site.func.value == "next" and site.args:
                add(site.args[0].value, ("next", position))
        for position, loop in enumerate(self.loops):
            if isinstance(loop, (cst.For, cst.CompFor)):
                add(loop.iter, ("loop", position))
            elif isinstance(loop, cst.Yield) and isinstance(loop.value, cst.From):
                add(loop.value.item, ("loop", position))
        for statement in self.returns:
            if isinstance(statement.value, cst.Tuple):
                for element_index, element in enumerate(statement.value.elements):
                    add(element.value, ("return", statement, element_index))
            elif statement.value is not None:
                add(statement.value, ("return", statement, None))
        self._use_index = index
        return index

    def _read_by(self, carriers: _Carriers, kind: str) -> list[int]:
        """Positions of the loops or `next()` calls that read one of the carriers, in file order."""
        index = self._uses()
        return sorted({entry[1] for key in carriers.added for entry in index.get(key, ()) if entry[0] == kind})

    def _is_carrier(self, node: cst.BaseExpression, carriers: _Carriers) -> bool:
        for inner in iterated_expressions(node, self.yielders):
            inner = _strip_subscript(inner)
            if isinstance(inner, cst.Name) and (self.scope_of_use(inner.value, inner), inner.value) in carriers.names:
                return True
            if isinstance(inner, cst.Attribute) and inner.attr.value in carriers.attrs:
                return True
        return False

    def _bind(self, target: cst.BaseExpression, carriers: _Carriers, at: cst.CSTNode) -> bool:
        if isinstance(target, cst.Name):
            return carriers.add_name(self.scope_of_binding(target.value, at), target.value)
        if isinstance(target, cst.Attribute):
            return carriers.add_attr(target.attr.value)
        if isinstance(target, cst.Subscript):
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
                    if isinstance(container, cst.Tuple) and isinstance(grand, cst.Return):
                        self._returned(grand, list(container.elements).index(parent), carriers)
                        return
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
            if isinstance(parent, cst.Return):
                self._returned(parent, None, carriers)
            name = function.name.value
            if name in ("train_dataloader",):
                carriers.lightning_train = True
            for site in self.calls_to(name):
                if site is not call:
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

    def _program_says(self, node: cst.CSTNode, marker: str) -> bool:
        """Whether the call graph marked the function around `node` so (`<key><marker>`)."""
        function = self.enclosing_function(node)
        key = self.a.key_of(function)
        return f"{key}{marker}" in self.a.program_keys

    def _returned(self, statement: cst.Return, index: int | None, carriers: _Carriers) -> None:
        """The loader is returned (alone, or as element `index` of a tuple): a training loop of the program
        iterates what the function returns (`train_loader, val_loader = get_loaders(cfg)` in another file)."""
        for kind in ("training", "epoch"):
            if self._program_says(statement, f"#returns-{kind}-data") or (
                    index is not None and self._program_says(statement, f"#returns-{kind}-data{index}")):
                carriers.fed_elsewhere |= kind == "training"
                carriers.fed_per_epoch |= kind == "epoch"

    def _into_call(self, call: cst.Call, arg: cst.Arg, carriers: _Carriers) -> bool:
        if isinstance(arg.value, (cst.List, cst.Tuple)):
            # `train(..., [train_loader, val_loader])`, unpacked there: `train_loader, val_loader = loaders`
            changed = False
            for position, element in enumerate(arg.value.elements):
                if not isinstance(element, cst.StarredElement) and self._is_carrier(element.value, carriers):
                    for fn, param in self._params_for(call, arg):
                        changed |= carriers.add_element(id(fn), param, position)
            return changed
        called = _called_name(call)
        if called is not None and not arg.star:
            slot = arg.keyword.value if arg.keyword is not None else [
                a for a in call.args if a.keyword is None].index(arg)
            for kind in ("training", "epoch"):  # `train(model, loader)`: a (training) loop in another file
                if self._program_says(call, f"#passes-{kind}-data:{called}:{slot}"):
                    carriers.fed_elsewhere |= kind == "training"
                    carriers.fed_per_epoch |= kind == "epoch"
            # `for epoch in ...: train_one_epoch(model, loader)`, the loop over the loader in another file
            if self._program_says(call, f"#passes-iterated-data:{called}:{slot}") and self._outer_loop(call):
                carriers.handing_loops.append(self._outer_loop(call))
        changed = False
        for fn, param in self._params_for(call, arg):
            changed |= carriers.add_name(id(fn), param)
        return changed

    def _flow_through(self, assign: cst.CSTNode, carriers: _Carriers) -> None:
        """An assignment that reads a carrier binds its targets (or, from a call, the matching tuple element)."""
        value = assign.value
        if isinstance(value, cst.Name) and isinstance(assign, cst.Assign):
            positions = carriers.elements.get((self.scope_of_use(value.value, value), value.value), ())
            for target in assign.targets:
                if isinstance(target.target, (cst.Tuple, cst.List)):
                    for position in positions:
                        if position < len(target.target.elements):
                            self._bind(target.target.elements[position].value, carriers, assign)
        held = isinstance(value, cst.Dict) and any(isinstance(element, cst.DictElement) and self._is_carrier(
            element.value, carriers) for element in value.elements)  # `loaders[phase]` iterates one of them
        if held or self._is_carrier(value, carriers):
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            for target in targets:
                self._bind(target, carriers, assign)
        elif isinstance(value, cst.Call) and isinstance(assign, cst.Assign):
            # model, opt, loader = accelerator.prepare(model, opt, loader)
            positional = [a for a in value.args if a.keyword is None and not a.star]
            for target in assign.targets:
                if isinstance(target.target, (cst.Tuple, cst.List)) and \
                        len(target.target.elements) == len(positional) > 1:
                    for element, arg in zip(target.target.elements, positional):
                        if self._is_carrier(arg.value, carriers):
                            self._bind(element.value, carriers, assign)

    def carriers(self, call: cst.Call) -> _Carriers:
        """Every name and attribute the loader built by `call` flows into (through assignments, tuple unpacking
        of a call's result and parameters of local functions), to a fixpoint. A work list of new keys visits
        only the places that read them, so the cost follows the loader's reach, not the file's size."""
        carriers = _Carriers()
        self._seed(call, carriers)
        uses = self._uses()
        done = 0
        while done < len(carriers.added):
            key = carriers.added[done]
            done += 1
            for entry in uses.get(key, ()):
                if entry[0] == "assign":
                    self._flow_through(entry[1], carriers)
                elif entry[0] == "arg":
                    self._into_call(entry[1], entry[2], carriers)
                elif entry[0] == "return":
                    self._returned(entry[1], entry[2], carriers)
        return carriers

    def iterating_loops(self, carriers: _Carriers) -> list[cst.CSTNode]:
        return list(carriers.direct_loops) + [self.loops[i] for i in self._read_by(carriers, "loop")]

    def next_calls(self, carriers: _Carriers) -> list[cst.Call]:
        """`next(it)` on an iterator of the loader."""
        return [self.calls[i] for i in self._read_by(carriers, "next")]

    def reaches_training(self, call: cst.Call) -> bool:
        carriers = self.carriers(call)
        if carriers.lightning_train or carriers.fed_elsewhere:
            return True
        if any(self.is_training_loop(loop) for loop in self.iterating_loops(carriers)):
            return True
        return any(self.in_training(site) for site in self.next_calls(carriers))

    def iterated_per_epoch(self, call: cst.Call) -> cst.CSTNode | None:
        """The outer (epoch) loop around an iteration of this loader, if there is one; for a loader iterated
        once per epoch in another function or file, the scope that builds it (nothing there re-builds it)."""
        carriers = self.carriers(call)
        if carriers.fed_per_epoch:
            return self.enclosing_function(call) or self.a.module
        for loop in carriers.handing_loops:
            if not self._inside(call, loop):  # (a loader built inside that loop is a new one every pass)
                return loop
        for loop in self.iterating_loops(carriers):
            outer = self._outer_loop(loop)
            if outer is not None and self._rarely_reached(loop, outer):
                continue  # `if epoch % test_interval == 0:` (20): worker start-up is paid once in many epochs
            if outer is not None:
                return None if self._inside(call, outer) else outer  # rebuilt every pass: nothing persists
            function = self.enclosing_function(loop)
            if function is None:
                continue
            # the loader arrives as a parameter: only call sites that pass this loader count
            params = {p.name.value for p in [*function.params.posonly_params, *function.params.params,
                                             *function.params.kwonly_params]}
            via_parameter = isinstance(loop, (cst.For, cst.CompFor)) and any(
                isinstance(inner, cst.Name) and inner.value in params
                for inner in iterated_expressions(loop.iter, self.yielders))
            # the function iterating the loader is itself called inside a loop (one level)
            for site in self.calls_to(function.name.value):
                if (via_parameter and not any(
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

    def _rarely_reached(self, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
        """Is `node` under an `if` (inside `outer`) that lets it run once in many passes (`every_many_steps`)?"""
        current = self.parents.get(id(node))
        while current is not None and current is not outer:
            if isinstance(current, cst.If) and every_many_steps(self.a, current.test):
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


def resolve(ctx, node: cst.BaseExpression, flow: LoaderFlow, depth: int = 0) -> cst.BaseExpression:
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
    for site in flow.calls_to(function.name.value):
        func = site.func
        if any(a.star for a in site.args):
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


def dataset_class(ctx, node: cst.BaseExpression, flow: LoaderFlow) -> str | None:
    """The class a dataset expression is built from (`MNIST` for `ds = datasets.MNIST(...)`), if visible."""
    expr = resolve(ctx, node, flow)
    while isinstance(expr, cst.Subscript):
        expr = resolve(ctx, expr.value, flow)
    if not isinstance(expr, cst.Call):
        return None
    return (dotted_name(expr.func) or "").rsplit(".", 1)[-1] or None
