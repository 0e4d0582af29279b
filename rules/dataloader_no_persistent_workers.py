from __future__ import annotations

import re

from dataclasses import dataclass

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import BindingKind, dotted_name, method_name, walk
from gpulint.builders import add_keyword
from gpulint.pins import torch_pinned_below
from gpulint.program import function_calls
from gpulint.semantic.loaders import LoaderFlow, checkable_loader_call, int_literal, loader_arg

# what a `worker_init_fn` that only seeds random generators calls (`np.random.seed(torch.initial_seed() % 2**32)`)
_SEEDING = frozenset({"seed", "manual_seed", "manual_seed_all", "SeedSequence", "generate_state", "default_rng",
                      "initial_seed", "get_state", "get_worker_info", "int", "abs", "hash"})

_COUNT_FUNCTIONS = {"os.cpu_count", "multiprocessing.cpu_count", "torch.get_num_threads"}


class DataloaderNoPersistentWorkers(Rule):
    """
    ## What it does
    Finds a `DataLoader` with worker processes (`num_workers > 0`) that is iterated once per epoch inside an
    epoch loop but does not pass `persistent_workers=True`.

    ## Why is this slow
    Without `persistent_workers=True` the DataLoader shuts its worker processes down at the end of every pass
    and starts new ones at the next `for batch in loader`. Each start re-imports modules, re-creates the
    dataset in every worker and refills the prefetch queue, so the first batches of every epoch stall the
    GPU; with heavy datasets or imports this costs seconds per epoch.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=64, num_workers=8)
    for epoch in range(epochs):
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=64, num_workers=8, persistent_workers=True)
    ```
    When `num_workers` is a variable that may be 0, the fix writes `persistent_workers=num_workers > 0`
    (`persistent_workers=True` with no workers raises a ValueError).

    ## Fix safety
    Unsafe. Persistent workers keep their own copy of the dataset for the whole run, so per-epoch changes
    made to the dataset object in the main process (curriculum stages, `dataset.set_epoch(...)`) no longer
    reach them, and `worker_init_fn` runs once instead of every epoch. The rule does not fire when the epoch
    loop visibly changes the dataset (sampler `set_epoch` is fine: the sampler runs in the main process), when
    a `worker_init_fn` does more than seed random generators, for single-epoch loops, or when `*args`/`**kwargs`
    may already set the option.
    """

    code = "GPU051"
    name = "dataloader-no-persistent-workers"
    message = "DataLoader workers are restarted every epoch; pass `persistent_workers=True`"
    fix_title = "Add `persistent_workers=True`"
    severity = Severity.INFO
    safety = Safety.UNSAFE
    priority = "P2"
    triggers = ("DataLoader",)
    examples = [
        Valid(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64, num_workers=8, persistent_workers=True)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """
        ),
        Valid(  # one pass only: nothing to keep alive
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64, num_workers=8)
            for x, y in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # the dataset changes every epoch: persistent workers would not see it
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64, num_workers=8)
            for epoch in range(10):
                train_set.set_epoch(epoch)
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """
        ),
        Valid(  # rebuilt for every dataset it is iterated for; a helper called in a loop on other loaders
            """
            import torch
            from torch.utils.data import DataLoader
            def evaluate(model, loader):
                for i, (x, y) in enumerate(loader):
                    model(x.cuda())
            def evaluate_all(model, datasets):
                for dataset in datasets:
                    loader = DataLoader(dataset, batch_size=64, num_workers=8)
                    evaluate(model, loader)
            def sweep(model, loaders):
                for loader in loaders:
                    evaluate(model, loader)
            def final(model, test_set):
                loader = DataLoader(test_set, batch_size=64, num_workers=8)
                evaluate(model, loader)
            """
        ),
        Valid(  # the worker count is a name bound to 0: no worker processes to keep alive
            """
            import torch
            from torch.utils.data import DataLoader
            num_workers = 0
            loader = DataLoader(train_set, batch_size=64, num_workers=num_workers)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """
        ),
        Valid(  # the same inside a function, through a second name
            """
            import torch
            from torch.utils.data import DataLoader
            def main(train_set, model, optimizer):
                workers = None
                n = workers
                loader = DataLoader(train_set, batch_size=64, num_workers=n)
                for epoch in range(10):
                    for x, y in loader:
                        model(x.cuda()).sum().backward()
                        optimizer.step()
            """
        ),
        Valid(  # a helper whose worker count defaults to none
            """
            import torch
            from torch.utils.data import DataLoader
            def create_loader(data, batch_size=4, num_workers=0):
                return DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=num_workers)
            loader = create_loader(train_set)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """
        ),
        Invalid(  # the epoch function iterates a progress bar bound in a tuple assignment
            """
            import torch
            from tqdm import tqdm
            from torch.utils.data import DataLoader
            def train(net, data_loader, opt):
                total_loss, total_num, train_bar = 0.0, 0, tqdm(data_loader)
                for x, y in train_bar:
                    net(x.cuda()).sum().backward()
                    opt.step()
            loader = DataLoader(train_set, batch_size=512, shuffle=True, num_workers=16, pin_memory=True)  # error: GPU051
            for epoch in range(1, 500):
                train(model, loader, optimizer)
            """,
            fixed="""
            import torch
            from tqdm import tqdm
            from torch.utils.data import DataLoader
            def train(net, data_loader, opt):
                total_loss, total_num, train_bar = 0.0, 0, tqdm(data_loader)
                for x, y in train_bar:
                    net(x.cuda()).sum().backward()
                    opt.step()
            loader = DataLoader(train_set, batch_size=512, shuffle=True, num_workers=16, pin_memory=True, persistent_workers=True)  # error: GPU051
            for epoch in range(1, 500):
                train(model, loader, optimizer)
            """,
        ),
        Invalid(  # the same helper, called with workers
            """
            import torch
            from torch.utils.data import DataLoader
            def create_loader(data, batch_size=4, num_workers=0):
                return DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=num_workers)
            loader = create_loader(train_set, num_workers=4)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            def create_loader(data, batch_size=4, num_workers=0):
                return DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=num_workers, persistent_workers=num_workers > 0)
            loader = create_loader(train_set, num_workers=4)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # a name bound to 0 and, elsewhere, to a positive count: the workers may exist
            """
            import torch
            from torch.utils.data import DataLoader
            num_workers = 0
            if torch.cuda.is_available():
                num_workers = 4
            loader = DataLoader(train_set, batch_size=64, num_workers=num_workers)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            num_workers = 0
            if torch.cuda.is_available():
                num_workers = 4
            loader = DataLoader(train_set, batch_size=64, num_workers=num_workers, persistent_workers=num_workers > 0)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=8)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=8, persistent_workers=True)
            for epoch in range(10):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """,
        ),
        Invalid(  # a variable worker count may be 0: keep the option valid then
            """
            import torch
            from torch.utils.data import DataLoader
            def train(model, loader, optimizer):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            loader = DataLoader(train_set, batch_size=64, num_workers=args.workers)
            for epoch in range(args.epochs):
                train(model, loader, optimizer)
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            def train(model, loader, optimizer):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            loader = DataLoader(train_set, batch_size=64, num_workers=args.workers, persistent_workers=args.workers > 0)
            for epoch in range(args.epochs):
                train(model, loader, optimizer)
            """,
        ),
        Valid(  # a test loader read once every 20 epochs: starting its workers is paid once in many epochs
            """
            import torch
            from torch.utils.data import DataLoader
            test_interval = 20
            test_loader = DataLoader(test_set, batch_size=20, num_workers=4)
            for epoch in range(epochs):
                train_one_epoch(model, optimizer)
                if epoch % test_interval == test_interval - 1:
                    for inputs, labels in test_loader:
                        evaluate(model(inputs.cuda()), labels)
            """,
        ),
        Invalid(  # loaders kept in a dict by phase, each iterated once per epoch
            """
            import torch
            from torch.utils.data import DataLoader
            train_loader = DataLoader(train_set, batch_size=20, shuffle=True, num_workers=4)
            val_loader = DataLoader(val_set, batch_size=20, num_workers=4)
            loaders = {"train": train_loader, "val": val_loader}
            for epoch in range(epochs):
                for phase in ["train", "val"]:
                    for inputs, labels in tqdm(loaders[phase]):
                        loss = criterion(model(inputs.cuda()), labels.cuda())
                        if phase == "train":
                            loss.backward()
                            optimizer.step()
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            train_loader = DataLoader(train_set, batch_size=20, shuffle=True, num_workers=4, persistent_workers=True)
            val_loader = DataLoader(val_set, batch_size=20, num_workers=4, persistent_workers=True)
            loaders = {"train": train_loader, "val": val_loader}
            for epoch in range(epochs):
                for phase in ["train", "val"]:
                    for inputs, labels in tqdm(loaders[phase]):
                        loss = criterion(model(inputs.cuda()), labels.cuda())
                        if phase == "train":
                            loss.backward()
                            optimizer.step()
            """,
            count=2,
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup=("from torch.utils.data import DataLoader, Dataset\n"
               "class Squares(Dataset):\n"
               "    def __len__(self):\n"
               "        return 32\n"
               "    def __getitem__(self, i):\n"
               "        return torch.arange(3, device='cpu', dtype=torch.float32) * i ** 2\n"
               "ds = Squares()"),
        before=("loader = DataLoader(ds, batch_size=8, num_workers=2)\n"
                "xs = torch.cat([b for epoch in range(2) for b in loader])"),
        after=("loader = DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)\n"
               "xs = torch.cat([b for epoch in range(2) for b in loader])"),
        compare=("xs",),
        options={"host_only": True},  # forked DataLoader workers cannot touch CUDA
    )

    def __init__(self, ctx) -> None:  # noqa: ANN001 - RuleContext
        super().__init__(ctx)
        self._loop_changes: dict[int, _LoopChanges] = {}

    def _only_seeds(self, initializer: cst.BaseExpression) -> bool:
        """A `worker_init_fn` of the program that only seeds random generators from the worker's torch seed
        (`np.random.seed(torch.initial_seed() % 2**32)`), which changes every epoch: run once per persistent
        worker, its generators go on drawing new numbers each epoch, as reseeded ones would. (A seed from the
        worker id alone repeats each epoch's numbers; persistent workers would change that.)"""
        if not isinstance(initializer, cst.Name):
            return False
        calls = function_calls(self.ctx, initializer.value)
        return calls is not None and calls <= _SEEDING and bool(calls & {"initial_seed", "get_worker_info"})

    def visit_Call(self, node: cst.Call) -> None:
        if not checkable_loader_call(self.ctx, node):
            return
        workers = loader_arg(node, "num_workers")
        if workers is None or self._no_workers(workers.value):
            return
        if loader_arg(node, "persistent_workers") is not None:
            return
        initializer = loader_arg(node, "worker_init_fn")
        if initializer is not None and not self._only_seeds(initializer.value):
            return  # it may need to run every epoch
        if torch_pinned_below(self.ctx.path, (1, 7)):
            return  # `persistent_workers` arrived in torch 1.7
        flow = LoaderFlow.of(self.ctx.analysis)
        epoch_loop = flow.iterated_per_epoch(node)
        if epoch_loop is None:
            return
        changes = self._loop_changes.get(id(epoch_loop))
        if changes is None:
            changes = self._loop_changes[id(epoch_loop)] = _LoopChanges.of(epoch_loop)
        if changes.dataset_changed(node):
            return
        value = workers.value
        if self._positive(value):
            self.report(node, replacement=add_keyword(node, "persistent_workers", "True"))
        elif _pure(value):
            text = self.ctx.code(value).strip()
            if isinstance(value, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr, cst.Comparison)) \
                    and not value.lpar:
                text = f"({text})"
            self.report(node, replacement=add_keyword(node, "persistent_workers", f"{text} > 0"))
        else:
            self.report(node, note="`num_workers` is computed by a call here; add `persistent_workers=True` "
                                   "where the worker count is known to be positive")

    def _no_workers(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """`0`, `None`, or a name that is only ever bound to them (`num_workers = 0` ... `num_workers=num_workers`),
        a parameter whose default is one of them included (`def create_loader(..., num_workers=0)`) when no call
        in the program passes it another value: no worker processes, nothing to keep alive."""
        if int_literal(node) == 0 or _is_none(node):
            return True
        if not isinstance(node, cst.Name) or depth > 3:
            return False
        flow = LoaderFlow.of(self.ctx.analysis)
        bindings = self.ctx.analysis.bindings_of(node.value, flow.ancestors(node))
        if any(b.kind is BindingKind.PARAM for b in bindings):
            function = flow.enclosing_function(node)
            if function is None or self._callers_pass_workers(function.name.value, node.value):
                return False
        return bool(bindings) and all(b.kind in (BindingKind.ASSIGN, BindingKind.PARAM) and b.value is not None
                                      and self._no_workers(b.value, depth + 1) for b in bindings)

    def _callers_pass_workers(self, function: str, parameter: str) -> bool:
        """Does some call of `function` in the program pass `parameter=` anything but 0 (`num_workers=4`,
        `num_workers=args.workers`)? Then the worker processes may exist whatever the default says."""
        call = re.compile(r"\b" + re.escape(function) + r"\s*\(")
        keyword = re.compile(r"\b" + re.escape(parameter) + r"\s*=\s*([^,()\s]+)")
        for path, match in self.ctx.program.search(call):
            text = self.ctx.program.sources.get(path, "")
            depth, end = 1, match.end()
            while end < len(text) and depth:  # the call's argument text, to its closing parenthesis
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            if any(value not in ("0", "None") for value in keyword.findall(text[match.end():end])):
                return True
        return False

    def _positive(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """Provably >= 1: a positive literal, `min` of positives, `max` with a positive, `cpu_count() or 1`."""
        if depth > 4:
            return False
        value = int_literal(node)
        if value is not None:
            return value > 0
        if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
            return self._positive(node.right, depth + 1) and (
                self._positive(node.left, depth + 1) or self._count(node.left))
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and not any(a.star for a in node.args):
            args = [a.value for a in node.args]
            if node.func.value == "min" and len(args) > 1:
                return all(self._positive(a, depth + 1) for a in args)
            if node.func.value == "max" and len(args) > 1:
                return any(self._positive(a, depth + 1) for a in args)
        return False

    def _count(self, node: cst.BaseExpression) -> bool:
        """An expression that is a CPU count or None (never negative)."""
        if isinstance(node, cst.Call):
            if self.ctx.analysis.call_qualname(node) in _COUNT_FUNCTIONS:
                return True
            if isinstance(node.func, cst.Name) and node.func.value == "len":
                return True
        return False


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _pure(node: cst.BaseExpression) -> bool:
    """Cheap to evaluate twice, without side effects: names, attributes, literals and arithmetic on them."""
    if isinstance(node, (cst.Name, cst.Integer)):
        return True
    if isinstance(node, cst.Attribute):
        return _pure(node.value)
    if isinstance(node, cst.Subscript):
        return _pure(node.value) and all(
            isinstance(e.slice, cst.Index) and isinstance(e.slice.value, (cst.Integer, cst.SimpleString))
            for e in node.slice)
    if isinstance(node, cst.BinaryOperation):
        return _pure(node.left) and _pure(node.right)
    if isinstance(node, cst.BooleanOperation):
        return _pure(node.left) and _pure(node.right)
    if isinstance(node, cst.UnaryOperation):
        return _pure(node.expression)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("int", "min", "max") \
            and node.args and not any(a.star or a.keyword for a in node.args):
        return all(_pure(a.value) for a in node.args)
    return False


@dataclass(frozen=True)
class _LoopChanges:
    """What an epoch loop does to objects, read once per loop (many loaders may share one loop)."""

    set_epoch: bool  # `x.set_epoch(...)` on anything but a sampler
    setter_receivers: frozenset[str]  # `x.set_*(...)`: x
    assigned_receivers: frozenset[str]  # `x.attr = ...`: x

    @classmethod
    def of(cls, epoch_loop: cst.CSTNode) -> "_LoopChanges":
        set_epoch, setters, assigned = False, set(), set()
        for node in walk(epoch_loop, into_functions=False):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                receiver = dotted_name(node.func.value) or ""
                name = method_name(node) or ""
                if "sampler" in receiver.lower():
                    continue
                if name == "set_epoch":
                    set_epoch = True
                elif name.startswith("set_"):
                    setters.add(receiver)
            elif isinstance(node, (cst.Assign, cst.AugAssign)):
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                assigned.update(dotted_name(t.value) or "" for t in targets if isinstance(t, cst.Attribute))
        return cls(set_epoch, frozenset(setters), frozenset(assigned))

    def dataset_changed(self, call: cst.Call) -> bool:
        """Does the loop change the dataset object of `call` (not the sampler)? Persistent workers would not
        see it."""
        if self.set_epoch:
            return True
        dataset = loader_arg(call, "dataset")
        dataset_name = dotted_name(dataset.value) if dataset is not None else None
        return any(receiver == dataset_name or "dataset" in receiver.lower() for receiver in self.setter_receivers) \
            or any(receiver == dataset_name or receiver.endswith(".dataset") or receiver == "dataset"
                   for receiver in self.assigned_receivers)
