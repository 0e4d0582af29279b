"""How often each function of the program runs: a call graph across the run's files with memoised summaries.

A rule sees one file, but a training step rarely sits in one function: `train()` loops over batches and calls
`update()`, which calls `compute_loss()` in another module; a self-play loop calls `play_move()` once per move.
Here every file of the program is summarised once with CPython's `ast` (an order of magnitude cheaper than the
libcst parse rules get): its functions, their call sites, and how often each site runs *within* its function —
inside a training-step loop, a rollout loop (an environment or game step, or a network evaluated per iteration
outside a data loader), another loop, or once. Calls are resolved to definitions in the program (same file,
`from x import f`, `module.f`, `self.method`, a receiver built from a program class, or a method name that only
one class of the program defines). Frequencies then flow from per-step call sites into callees, transitively,
to a fixed point bounded in depth; a call under a throttling `if` (`step % N`, `if done:`, a log flag) or into
an output helper (save/plot/log) does not carry the caller's frequency.
"""

from __future__ import annotations

import ast
import enum
import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Callable, Iterator, TypeVar
from pathlib import PurePosixPath

from gpulint import legacy
from gpulint.rule import is_test_path
from gpulint.semantic import pyast, vocab

T = TypeVar("T")

MAX_DEPTH = 6  # call levels followed from a per-step site


class Frequency(enum.IntEnum):
    ONCE = 0
    PER_ITERATION = 1  # inside a loop that is neither a step nor a rollout: per episode, per epoch
    PER_ROLLOUT_STEP = 2  # per environment step, per move, per tree-search simulation
    PER_STEP = 3  # per training step (or per forward pass)


# generic method names: resolving them by name alone would guess (optimizer.step, list.append, module.train)
_GENERIC_METHODS = frozenset({
    "step", "to", "train", "eval", "forward", "zero_grad", "backward", "item", "append", "extend", "get",
    "items", "keys", "values", "pop", "copy", "clone", "detach", "cpu", "cuda", "numpy", "reset", "close",
    "load_state_dict", "state_dict", "parameters", "named_parameters", "apply", "run", "format", "join", "split",
    "insert", "clear", "save", "load", "log", "write", "read", "render", "seed", "sum",
    "mean", "max", "min", "view", "reshape", "size", "float", "long", "int", "half", "__call__", "__init__",
    # torch.distributions' methods: `dist.log_prob(a)` is not the program's one class defining `log_prob`
    "log_prob", "rsample", "entropy", "cdf", "icdf",
})


@dataclass(frozen=True)
class ProgramCalls:
    """What the call graph tells one file: how often its functions run (by key), and the names of the program's
    functions that do one training step / one rollout step per call (a loop calling one is such a loop)."""

    frequencies: dict[str, Frequency]
    step_names: frozenset[str]
    rollout_names: frozenset[str]
    trainer_names: frozenset[str]  # functions that train when called (a step or a whole step loop)


# methods that return their receiver (a module moved or switched mode is the same object)
_KEEPS_RECEIVER = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "double", "bfloat16",
                             "requires_grad_", "share_memory"})

_NOTHING = (False, False, False, False)  # a loop's verdict when it calls nothing that matters

# names too common to mark a loop by: `model.train()`, `scheduler.step()`, `runner.run()`
_AMBIGUOUS_STEP_NAMES = frozenset({"step", "train", "eval", "run", "forward", "__call__"})


@dataclass
class CallSite:
    target: tuple[str, ...]  # ("name", f) | ("self", m) | ("attr", receiver_dotted, m)
    frequency: Frequency  # how often it runs within its own function
    throttled: bool  # under a throttling `if`
    loops: tuple[int, ...]  # ids of the loops around it in its function, outermost first
    passed: tuple[tuple[str | int, str], ...] = ()  # (keyword or position, name) of plain-name arguments
    built: tuple[tuple[str | int, str], ...] = ()  # (keyword or position, class) of `Class(...)` arguments
    # (keyword or position, dotted name) of attribute arguments: a bound method handed on (`MCTS(net.policy_fn)`)
    references: tuple[tuple[str | int, str], ...] = ()
    read_back: bool = False  # its result is only read back to the host (`f(s).detach().cpu().numpy()`)
    guards: tuple[str, ...] = ()  # names tested bare by the `if`s around it in its function (`if vis_result:`)
    numbers_only: bool = False  # passes only Python numbers (`logger.update(loss=loss.item(), lr=lr)`)
    # (keyword or position) of arguments an environment returned (`agent.act(time_step.observation)`)
    observed: tuple[str | int, ...] = ()
    # every (keyword or position) passed, None when a `*args`/`**kwargs` hides some; those holding GPU tensors
    slots: tuple[str | int, ...] | None = None
    device_slots: tuple[str | int, ...] = ()
    handed: tuple[tuple[str | int, str], ...] = ()  # (slot, parameter) of the caller's parameters passed unchanged
    # (slot, name) of arguments that are a part of a name: an item (`data[0]`, `batch["image"]`) or a field
    parts: tuple[tuple[str | int, str], ...] = ()

    @property
    def loop(self) -> int:
        return self.loops[-1] if self.loops else 0


@dataclass
class FunctionSummary:
    key: str  # "f", "Class.method", "outer.inner"
    class_name: str | None
    name: str
    sites: list[CallSite] = field(default_factory=list)
    seed: Frequency = Frequency.ONCE  # what the function is by itself: forward / step function / compiled
    steps_at_top: bool = False  # backward/optimizer step outside its own loops: one call is one training step
    env_at_top: bool = False  # an environment step outside its own loops: one call is one rollout step
    network_at_top: bool = False  # evaluates a network outside its own loops (`play_move(net, state)`)
    has_step_loop: bool = False  # contains a training-step loop (`train_epoch`, `agent.update`)
    params: tuple[str, ...] = ()  # parameter names in order (`self` included for methods)
    static: bool = False  # a `@staticmethod`: calls on the class or an instance pass no `self`
    rebound: set[str] = field(default_factory=set)  # names assigned so far in the walk (a parameter changes value)
    # names listed in a list or tuple display (`[rgb2hsv, self.adjust_hue]`), as the call sites they are if they
    # name program functions (added to `sites` once the program is known)
    listed: list[CallSite] = field(default_factory=list)
    loops: list[int] = field(default_factory=list)  # ids of its loops in source order (nested defs excluded)
    around_hot: set[int] = field(default_factory=set)  # ids of loops enclosing a training-step loop
    busy_loops: bool = False  # has a step, rollout or search loop of its own
    # local names (or `self.x`) bound to a call's result, with the tuple element taken (`a, b = f()`)
    results: dict[str, list[tuple[tuple[str, ...], int | None]]] = field(default_factory=dict)
    loop_reads: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)  # (loop id, what it iterates)
    # loops over a program call's result: (loop id, call target, positional arguments' sources), resolved once the
    # program is known (`for it, batch in enumerate(logger.log_every(loader, 10))`: a generator yielding `loader`'s)
    call_loops: list[tuple[int, tuple[str, ...], tuple[tuple[tuple[str, ...], ...], ...]]] = field(default_factory=list)
    yields_parameter: str | None = None  # a generator re-yielding a parameter's items (`for x in it: ...; yield x`)
    # loop id -> the names its `for` target binds to the items (`for i, (x, y) in enumerate(loader)` -> x, y)
    loop_targets: dict[int, tuple[str, ...]] = field(default_factory=dict)
    copies: dict[str, list[str]] = field(default_factory=dict)  # `self.loader = loader`: target -> sources
    rebound_in_loops: set[str] = field(default_factory=set)  # result names bound inside a loop (rebuilt each pass)
    backward_names: set[str] = field(default_factory=set)  # names backpropagated here (`loss.backward()`, the
    # `fabric.backward(loss)` argument, the operands of `loss = a + b` that is)
    operands: dict[str, set[str]] = field(default_factory=dict)  # `loss = pi_loss + v_loss`: name -> operand names
    uploads: bool = False  # returns a parameter turned into a tensor on the host and moved to a device
    downloads: bool = False  # returns a parameter read back to the host (`def to_np(t): return t.cpu().numpy()`)
    # `self.<attr>` of the array each data parameter is written into (`self.val_buf[self.ptr] = val`); empty unless
    # every data parameter is: a recorder whose arguments become NumPy data if those attributes are NumPy arrays
    stored_into: frozenset[str] = frozenset()
    returns_host: bool = False  # returns tensors it builds on the host (`ReplayBuffer.sample` -> torch.tensor(...))
    returns_factory: bool = False  # returns a torch factory's new CPU tensor (`return torch.randint(1, T, (n,))`)
    moves_parameter: bool = False  # returns a tensor parameter moved to a device (`return Variable(x).cuda()`)
    # positions of the returned tuple (None: the whole result) holding values it backpropagates (`return loss, acc`)
    returns_losses: tuple[int | None, ...] = ()
    moves_to_device: bool = False  # calls `.to(...)` or `.cuda()` (a collate function that does delivers device batches)
    # computes its result with tensor ops from its parameters, never reading back or moving (`def normalise(h):
    # return (h - h.min()) / h.max()`): the result lives where the arguments do
    tensor_helper: bool = False  # (provided the functions it calls by plain name are tensor helpers too)
    plain_calls: set[str] = field(default_factory=set)  # names it calls as plain functions (`signed_parabolic(x)`)
    abstract: bool = False  # only raises NotImplementedError (or passes): the subclasses' overrides do the work
    # parameters it reads back to the host unconditionally (`value.item()`, `float(value)`): a logging helper
    reads_params: set[str] = field(default_factory=set)
    cpu_defaults: tuple[tuple[int, str], ...] = ()  # (position, name) of parameters defaulting to the CPU
    builds: tuple[str, ...] = ()  # program classes it returns instances of (`def create_diffusion(): return Spaced(...)`)
    # names set from a throttling test (`vis = step % k == 0`, `if step % k == 0: vis = True else: vis = False`)
    throttle_flags: set[str] = field(default_factory=set)
    # names bound to what a host-side environment returns (`obs, r, done, _ = env.step(a)`, `obs = env.reset()`)
    env_names: set[str] = field(default_factory=set)
    # names holding GPU tensors at this point of the walk, by how they were made: moved (`x.cuda()`), computed from
    # such names with tensor ops (`acc = (y_hat == y).float().mean()`), backpropagated
    device_names: set[str] = field(default_factory=set)
    # names bound to a dict literal with string keys, at this point of the walk (`kwargs = {"actor": actor}`)
    keyword_dicts: dict[str, list[tuple[str, ast.expr]]] = field(default_factory=dict)
    # names bound to a count to iterate (`indices = list(range(self.num_timesteps))[::-1]`, `bar = tqdm(indices)`)
    counters: set[str] = field(default_factory=set)
    # a function it defines and returns (`def make_train_fn(...): def train(x, y): ...; return train`)
    returns_function: str | None = None
    # parameters annotated with a class (`def evaluate(state, nn: NeuralNetwork)`): name -> the class's last name
    param_classes: dict[str, str] = field(default_factory=dict)


@dataclass
class FileSummary:
    path: str
    functions: dict[str, FunctionSummary] = field(default_factory=dict)
    imports: dict[str, tuple[int, str, str | None]] = field(default_factory=dict)  # local -> (level, module, name)
    star_imports: list[tuple[int, str]] = field(default_factory=list)  # `from .utils import *`: (level, module)
    classes: dict[str, list[str]] = field(default_factory=dict)  # class -> base names (last parts)
    instances: dict[str, list[str]] = field(default_factory=dict)  # name or self.attr -> classes built into it
    compiled: set[str] = field(default_factory=set)  # names passed to torch.compile
    loader_loops: set[int] = field(default_factory=set)  # ids of loops over a data loader (evaluation, epochs)
    repeating_loops: set[int] = field(default_factory=set)  # ids of `while` / `for _ in range(n)` loops
    env_loops: set[int] = field(default_factory=set)  # ids of loops that step an environment or game directly
    step_loops: set[int] = field(default_factory=set)  # ids of loops that do a training step themselves
    nested_loops: set[int] = field(default_factory=set)  # ids of loops inside another loop of their function
    collate_functions: set[str] = field(default_factory=set)  # names passed as a DataLoader's `collate_fn`
    collate_scopes: dict[str, str] = field(default_factory=dict)  # such a name -> the function that passes it
    device_collate: bool = False  # a DataLoader's `collate_fn` is bound to a device (`partial(collate, device=d)`)
    device_loaders: bool = False  # hands loaders to a framework that delivers device batches (`accelerator.prepare`)
    # (function name, keyword or position) of the arguments calls pass by keyword or position, `partial`'s included
    arguments_passed: set[tuple[str, str | int]] = field(default_factory=set)
    # `name = partial(function, ...)`: name -> (function, whether a `device=` is bound)
    partials: dict[str, tuple[str | None, bool]] = field(default_factory=dict)
    numpy_arrays: dict[str, set[str]] = field(default_factory=dict)  # class -> `self.<attr> = np.zeros(...)` attrs


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):  # `self.net(x).argmax` style receivers: name the call's function
        inner = _dotted(node.func)
        return ".".join([inner, *reversed(parts)]) if inner else None
    return None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _calls_outside_nested(body: list[ast.stmt], *, into_loops: bool) -> list[ast.Call]:
    """Calls in `body`, not inside nested functions/classes (nor nested loops unless `into_loops`)."""
    found: list[ast.Call] = []
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES) or (not into_loops and isinstance(node, _LOOPS)):
            continue
        if isinstance(node, ast.Call):
            found.append(node)
        stack.extend(pyast.child_nodes(node))
    return found


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _calls_and_comprehensions(roots: list[ast.AST]) -> tuple[list[ast.Call], list[ast.AST], list[str]]:
    """In one walk: the calls under `roots` outside nested functions/classes (as `_calls_outside_nested` with
    `into_loops`), every comprehension under them, nested scopes included, and the dotted names listed in list and
    tuple displays outside nested scopes (`[rgb2hsv, self.adjust_hue, hsv2rgb]`: functions to be called in turn)."""
    calls: list[ast.Call] = []
    comprehensions: list[ast.AST] = []
    listed: list[str] = []
    stack: list[tuple[ast.AST, bool]] = [(root, False) for root in roots]
    while stack:
        node, nested = stack.pop()
        if isinstance(node, _SCOPES):
            nested = True
        elif not nested and isinstance(node, ast.Call):
            calls.append(node)
        elif not nested and isinstance(node, (ast.List, ast.Tuple)) and isinstance(node.ctx, ast.Load):
            listed.extend(name for element in node.elts if isinstance(element, (ast.Name, ast.Attribute))
                          and (name := _dotted(element)) is not None)
        if isinstance(node, _COMPREHENSIONS):
            comprehensions.append(node)
        stack.extend((child, nested) for child in pyast.child_nodes(node))
    return calls, comprehensions, listed


def _call_target(dotted: str) -> tuple[str, ...]:
    """How a call names its callee: ("name", f), ("self", m) or ("attr", receiver, m)."""
    parts = dotted.split(".")
    if len(parts) > 2 and parts[-1] == "remote":  # a Ray actor's method: `buffer.sample.remote(n)` runs `sample`
        parts.pop()
    if len(parts) == 1:
        return ("name", parts[0])
    if parts[0] == "self" and len(parts) == 2:
        return ("self", parts[1])
    return ("attr", ".".join(parts[:-1]), parts[-1])


def _is_number(value: ast.expr, names: frozenset[str] = frozenset()) -> bool:
    """A Python number: a literal, `t.item()`, `float(x)`, a learning rate read from `param_groups`, or a name
    only ever bound to one of these."""
    if isinstance(value, ast.Constant):
        return isinstance(value.value, (int, float)) and not isinstance(value.value, bool)
    if isinstance(value, ast.Name):
        return value.id in names
    if isinstance(value, ast.Call):
        return isinstance(value.func, ast.Attribute) and value.func.attr == "item" or isinstance(
            value.func, ast.Name) and value.func.id in ("float", "int", "round", "len")
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Subscript):  # `opt.param_groups[0]["lr"]`
        return vocab.last_part(_dotted(value.value.value)) == "param_groups"
    return False


def _number_names(assigns: list[ast.Assign]) -> frozenset[str]:
    """Names every assignment of which binds a Python number (`loss_value = loss.item()`)."""
    verdicts: dict[str, bool] = {}
    for assign in assigns:
        for target in assign.targets:
            if isinstance(target, ast.Name):
                verdicts[target.id] = verdicts.get(target.id, True) and _is_number(assign.value)
            else:
                for name in pyast.walk(target):
                    if isinstance(name, ast.Name):
                        verdicts[name.id] = False
    return frozenset(name for name, number in verdicts.items() if number)


def _argument_names(call: ast.Call) -> list[str | None]:
    return [_dotted(a) for a in call.args] + [_dotted(k.value) for k in call.keywords]


def _started_function(dotted: str, call: ast.Call) -> str | None:
    """The function a process or thread is started with: `Process(target=f)`, `Thread(target=self.f)`,
    `mp.spawn(f, ...)`."""
    last = vocab.last_part(dotted)
    if last in ("Process", "Thread"):
        started = next((k.value for k in call.keywords if k.arg == "target"), None)
    elif last == "spawn" and call.args:
        started = call.args[0]
    else:
        return None
    return _dotted(started) if started is not None else None


# calls that apply the function they are given to each item, right away: `map(f, xs)`, `tree_map(tu.np2th, obs)`
_APPLYING_CALLS = frozenset({"map", "starmap", "tree_map", "map_structure", "map_nested"})


def _applied_function(dotted: str, call: ast.Call) -> str | None:
    """The function a map-like call applies where it stands (`tree_map(tu.np2th, self._venv.observe())`)."""
    if vocab.last_part(dotted) not in _APPLYING_CALLS or not call.args:
        return None
    return _dotted(call.args[0]) if isinstance(call.args[0], (ast.Name, ast.Attribute)) else None


# calls that iterate what they are given: `for i, (x, y) in enumerate(tqdm(loader))`
_ITERATING_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip", "islice", "cycle", "track"})


def _loop_sources(iterable: ast.expr) -> list[tuple[str, ...]]:
    """What a `for` loop iterates: ("value", name) for a name or `self.x` (`loaders["train"]` counts as
    `loaders`), ("call", *target) for a call's result (`for x, y in make_loader(ds)`)."""
    if isinstance(iterable, ast.Call):
        dotted = _dotted(iterable.func)
        if dotted is None:
            return []
        if vocab.last_part(dotted) in _ITERATING_WRAPPERS:
            return [source for arg in iterable.args for source in _loop_sources(arg)]
        return [("call", *_call_target(dotted))]
    while isinstance(iterable, ast.Subscript):
        iterable = iterable.value
    name = _dotted(iterable)
    return [("value", name)] if name else []


def _iterator_names(assigns: list[ast.Assign]) -> dict[str, list[tuple[str, ...]]]:
    """Names bound to an iterating wrapper of a value (`epoch_iterator = tqdm(train_loader, desc=...)`) -> what
    the wrapper iterates (`_loop_sources`)."""
    found: dict[str, list[tuple[str, ...]]] = {}
    for assign in assigns:
        for name, value in _assigned_pairs(assign):  # also `total, bar = 0.0, tqdm(loader)`
            if isinstance(name, ast.Name) and isinstance(value, ast.Call) \
                    and vocab.last_part(_dotted(value.func)) in _ITERATING_WRAPPERS:
                sources = [source for source in _loop_sources(value) if source[0] == "value"]
                if sources:
                    found.setdefault(name.id, []).extend(sources)
    return found


def _assigned_pairs(assign: ast.Assign) -> Iterator[tuple[ast.expr, ast.expr]]:
    """(target, value) of each target of an assignment, element by element where a tuple is assigned a tuple of
    the same length (`a, b = x, y`)."""
    for target in assign.targets:
        if isinstance(target, ast.Tuple) and isinstance(assign.value, ast.Tuple) \
                and len(target.elts) == len(assign.value.elts):
            yield from zip(target.elts, assign.value.elts)
        else:
            yield target, assign.value


def _unwrapped(iterable: ast.expr) -> ast.expr:
    """What `enumerate(tqdm(x))`-style wrappers iterate: `x`."""
    while isinstance(iterable, ast.Call) and vocab.last_part(_dotted(iterable.func)) in _ITERATING_WRAPPERS \
            and iterable.args:
        iterable = iterable.args[0]
    return iterable


def _iterated_call(iterable: ast.expr) -> tuple[str, list[ast.expr]] | None:
    """The program call a loop iterates, through `enumerate`/`tqdm`-style wrappers: (dotted callee, its positional
    arguments)."""
    iterable = _unwrapped(iterable)
    if not isinstance(iterable, ast.Call) or (dotted := _dotted(iterable.func)) is None:
        return None
    return dotted, [arg for arg in iterable.args if not isinstance(arg, ast.Starred)]


def _yielded_parameter(node: ast.FunctionDef | ast.AsyncFunctionDef, params: set[str]) -> str | None:
    """`def log_every(self, iterable, n): for obj in iterable: ...; yield obj`: the parameter whose items it yields."""
    for loop in pyast.walk(node):
        if not isinstance(loop, ast.For):
            continue
        iterated = _unwrapped(loop.iter)  # `for i, obj in enumerate(iterable)`: still `iterable`'s items
        items = {n.id for n in pyast.walk(loop.target) if isinstance(n, ast.Name)}
        if isinstance(iterated, ast.Name) and iterated.id in params and any(
                isinstance(n, ast.Yield) and isinstance(n.value, ast.Name) and n.value.id in items
                for n in pyast.walk(loop)):
            return iterated.id
    return None


_READ_BACK_ATTRIBUTES = frozenset({"detach", "cpu", "numpy", "item", "tolist", "data"})
_HOST_READS = frozenset({"numpy", "item", "tolist"})  # reads to the host that NumPy values share


def _moves_to_device(body: list) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("to", "cuda")
               for statement in body for n in pyast.walk(statement))


def _item_names(loop: ast.For | ast.AsyncFor) -> tuple[str, ...]:
    """The names a `for` target binds to parts of the items, not to an `enumerate` counter."""
    target = loop.target
    if isinstance(loop.iter, ast.Call) and _dotted(loop.iter.func) == "enumerate" and isinstance(target, ast.Tuple) \
            and len(target.elts) == 2:
        target = target.elts[1]
    return tuple(n.id for n in pyast.walk(target) if isinstance(n, ast.Name))


def _iterates_loader(loop: ast.AST) -> bool:
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    return any(isinstance(n, (ast.Name, ast.Attribute)) and vocab.LOADER_TEXT.search(_dotted(n) or "")
               for n in pyast.walk(loop.iter))


def _leaves(body: list[ast.stmt]) -> bool:
    """Ends by leaving the loop around it (a `return` leaves the function: per call, which may be per step)."""
    return bool(body) and isinstance(body[-1], (ast.Break, ast.Raise))


def _repeats(loop: ast.AST, counters: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
    """A loop that repeats a step (`while not done`, `for t in range(horizon)`, `for _ in trange(n)`, `for i in
    indices` with `indices = list(range(T))[::-1]` among `counters`), as a rollout or a search does, not one over a
    collection of inputs (`for prompts in data`, a loader), nor one that retries on failure (`while retries:`)."""
    header = loop.test if isinstance(loop, ast.While) else getattr(loop, "target", None)
    if header is not None and any(isinstance(n, ast.Name) and vocab.RETRY_NAME.search(n.id)
                                  for n in pyast.walk(header)):
        return False
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return True
    return _counts(loop.iter, counters)


def _counts(iterable: ast.expr, counters: set[str]) -> bool:
    """`range(n)`, `tqdm(range(n))`, `list(range(T))[::-1]`, or a name in `counters` (bound to such a value)."""
    while isinstance(iterable, ast.Subscript) or isinstance(iterable, ast.Call) and iterable.args \
            and vocab.last_part(_dotted(iterable.func)) in vocab.COUNT_KEEPING_WRAPPERS:
        iterable = iterable.value if isinstance(iterable, ast.Subscript) else iterable.args[0]
    if isinstance(iterable, ast.Name):
        return iterable.id in counters
    return isinstance(iterable, ast.Call) and vocab.last_part(_dotted(iterable.func)) in vocab.COUNTING_ITERABLES


def _throttling(test: ast.expr, constants: dict[str, int]) -> bool:
    """A test that lets its body run only now and then; `step % log_interval == 0` with `log_interval = 1` (a
    module constant or an argparse default) runs every step."""
    every = set()
    has_modulo = False
    for node in pyast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            divisor = node.right
            key = divisor.id if isinstance(divisor, ast.Name) else divisor.attr if isinstance(
                divisor, ast.Attribute) else None
            value = divisor.value if isinstance(divisor, ast.Constant) and type(divisor.value) is int else \
                constants.get(key) if key is not None else None
            if vocab.every_step(value):
                every.add(key)
            else:
                has_modulo = True
    names = {n.id for n in pyast.walk(test) if isinstance(n, ast.Name)}
    names |= {n.attr for n in pyast.walk(test) if isinstance(n, ast.Attribute)}
    # `if logger is not None:` asks whether a logger was given, not how often; `if not load_checkpoint:` and `if not
    # done:` hold on the common path
    names -= {vocab.last_part(_dotted(n.left)) for n in pyast.walk(test) if isinstance(n, ast.Compare)
              and len(n.ops) == 1 and isinstance(n.ops[0], (ast.Is, ast.IsNot))
              and isinstance(n.comparators[0], ast.Constant) and n.comparators[0].value is None}
    names -= {n.id if isinstance(n, ast.Name) else n.attr for node in pyast.walk(test)
              if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
              for n in pyast.walk(node.operand) if isinstance(n, (ast.Name, ast.Attribute))}
    return vocab.throttles(names - every, has_modulo)


def _observed(value: ast.expr, names: set[str]) -> bool:
    """Is the argument an environment's output: a name bound to one, an attribute or item of it
    (`time_step.observation`, `obs[None]`), or one of those wrapped by NumPy (`np.array(state)`)?"""
    if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords \
            and (_dotted(value.func) or "").split(".")[0] in ("np", "numpy"):
        value = value.args[0]
    while isinstance(value, (ast.Attribute, ast.Subscript)):
        value = value.value
    return isinstance(value, ast.Name) and value.id in names


def _resets_its_counter(node: ast.If) -> bool:
    """`if self.steps == self.sample_size: train(); self.steps = 0`: a counter compared in the test and set back
    to zero in the body, so the body runs once every N iterations (an on-policy update per collected rollout).
    Without the reset (`if steps > warmup: train()`) the body runs every iteration once the test holds."""
    compared = {pyast.dotted(operand) for test in pyast.walk(node.test) if isinstance(test, ast.Compare)
                and all(isinstance(op, (ast.Eq, ast.GtE, ast.Gt)) for op in test.ops)
                for operand in (test.left, *test.comparators)} - {None}
    return any(isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
               and statement.value.value == 0 and not isinstance(statement.value.value, bool)
               and any(pyast.dotted(target) in compared for target in statement.targets)
               for statement in node.body)


def _flags_set(body: list[ast.stmt], value: bool) -> set[str]:
    """Names a branch sets to the constant `value` (`vis_result = True`)."""
    return {target.id for statement in body if isinstance(statement, ast.Assign)
            and isinstance(statement.value, ast.Constant) and statement.value.value is value
            for target in statement.targets if isinstance(target, ast.Name)}


def _integer_constants(tree: ast.Module, arguments: bool = True) -> dict[str, int]:
    """Integers a file fixes by name: module-level `log_interval = 1`, `parser.add_argument("--policy-delay",
    default=2)` (read as `policy_delay`); a name assigned twice is not a constant."""
    found: dict[str, int] = {}
    assigned: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            name = statement.targets[0].id
            value = statement.value
            if name in assigned:
                found.pop(name, None)
            elif isinstance(value, ast.Constant) and type(value.value) is int:
                found[name] = value.value
            assigned.add(name)
    for node in pyast.walk(tree) if arguments else ():
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if isinstance(default, ast.Constant) and type(default.value) is int:
                found.setdefault(node.args[0].value.lstrip("-").replace("-", "_"), default.value)
    return found


class _Summariser:
    def __init__(self, path: str, tree: ast.Module, module_classes: frozenset[str], arguments: bool = True,
                 yields: bool = True) -> None:
        """`arguments`, `yields`: the text calls `add_argument`, says `yield` (else those searches are skipped)."""
        self.file = FileSummary(path)
        self.constants = _integer_constants(tree, arguments)
        self._yields = yields
        self.module_classes = module_classes
        self.network_names = vocab.network_class_names(module_classes)
        # per function being summarised: names whose value is read back (`a.detach().cpu()`), and the sites bound
        # to a name (`a = f(s)`), to mark the sites whose result is only ever read back
        self._read_names: dict[int, set[str]] = {}
        self._bound_sites: dict[int, list[tuple[str, int]]] = {}
        self._read_counts: dict[int, dict[str, int]] = {}
        self._binding: dict[int, str] = {}  # id(call) -> the plain name its statement binds its result to
        self._guards: list[str] = []  # bare names tested by the `if`s around the statement being summarised
        self._number_names: frozenset[str] = frozenset()  # names the function being summarised binds to numbers
        # names the function being summarised binds to an iterating wrapper (`bar = tqdm(loader)`): what they iterate
        self._wrapping: dict[str, list[tuple[str, ...]]] = _iterator_names(
            [s for s in _statements(tree.body) if isinstance(s, ast.Assign)])
        self.module_fn = FunctionSummary("<module>", None, "<module>")
        self._visit_block(tree.body, self.module_fn, [], False, ())
        self._mark_read_back(tree, self.module_fn)

    def _loop_frequency(self, loop: ast.AST, fn: FunctionSummary) -> Frequency:
        nodes = _calls_outside_nested(loop.body, into_loops=False)  # type: ignore[attr-defined]
        calls = [_dotted(c.func) for c in nodes]
        if any(vocab.is_training_step_call(d) for d in calls) or any(vocab.steps_with(_argument_names(c))
                                                                     for c in nodes):
            return Frequency.PER_STEP
        if any(vocab.is_env_step(d) for d in calls):
            self.file.env_loops.add(id(loop))
            return Frequency.PER_ROLLOUT_STEP
        if (_repeats(loop, fn.counters) and not vocab.EVAL_FUNCTION.match(fn.name)
                and any(vocab.is_network_call(d, self.network_names) for d in calls)):
            return Frequency.PER_ROLLOUT_STEP
        return Frequency.PER_ITERATION

    def _visit_block(self, body: list[ast.stmt], fn: FunctionSummary, loops: list[tuple[Frequency, int]], throttled: bool,
                     owner: tuple[str, ...]) -> None:
        for statement in body:
            self._visit_statement(statement, fn, loops, throttled, owner)

    def _visit_statement(self, node: ast.stmt, fn: FunctionSummary, loops: list[tuple[Frequency, int]], throttled: bool,
                         owner: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._visit_function(node, owner)
            return
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Lambda):
            # `to_np = lambda x: x.detach().cpu().numpy()`: a helper, summarised as the function it stands for
            self._visit_function(_lambda_function(node.targets[0].id, node.value), owner)
            return
        if isinstance(node, ast.ClassDef):
            self.file.classes[node.name] = [(_dotted(b) or "").rsplit(".", 1)[-1] for b in node.bases]
            self._visit_block(node.body, fn, loops, throttled, (*owner, node.name))
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not owner:
            self._record_import(node)
        if isinstance(node, _LOOPS):
            self._scan_expressions([node.iter if not isinstance(node, ast.While) else node.test], fn, loops, throttled)
            inner = [*loops, (self._loop_frequency(node, fn), id(node))]
            fn.loops.append(id(node))
            if inner[-1][0] is Frequency.PER_STEP:
                fn.around_hot.update(loop_id for _, loop_id in loops)
            fn.busy_loops |= inner[-1][0] >= Frequency.PER_ROLLOUT_STEP
            fn.has_step_loop |= inner[-1][0] is Frequency.PER_STEP
            if inner[-1][0] is Frequency.PER_STEP:
                self.file.step_loops.add(id(node))
            if isinstance(node, (ast.For, ast.AsyncFor)):
                sources = _loop_sources(node.iter)
                # `for i, batch in enumerate(bar)` with `bar = tqdm(train_loader)`: the loop iterates `train_loader`
                sources += [wrapped for source in sources if source[0] == "value"
                            for wrapped in self._wrapping.get(source[1], ())]
                fn.loop_reads.extend((id(node), source) for source in sources)
                if (called := _iterated_call(node.iter)) is not None:
                    fn.call_loops.append((id(node), _call_target(called[0]),
                                          tuple(tuple(_loop_sources(arg)) for arg in called[1])))
                fn.loop_targets[id(node)] = _item_names(node)
                bound = [n.id for n in pyast.walk(node.target) if isinstance(n, ast.Name)]
                fn.device_names.difference_update(bound)
                fn.rebound.update(bound)
            if loops:
                self.file.nested_loops.add(id(node))
            if _iterates_loader(node):
                self.file.loader_loops.add(id(node))
            if _repeats(node, fn.counters):
                self.file.repeating_loops.add(id(node))
            # a training-step loop runs step by step even when an `if` decides when the update phase starts
            # (`if games_since_ckpt >= games_per_ckpt: while steps < target: ... loss.backward()`)
            body_throttled = throttled and inner[-1][0] is not Frequency.PER_STEP
            self._visit_block(node.body, fn, inner, body_throttled, owner)
            self._visit_block(node.orelse, fn, loops, throttled, owner)
            return
        if isinstance(node, ast.If):
            self._scan_expressions([node.test], fn, loops, throttled)
            gated = throttled or _throttling(node.test, self.constants) or _resets_its_counter(node)
            if gated and not throttled:
                fn.throttle_flags |= _flags_set(node.body, True) & _flags_set(node.orelse, False)
            # a branch that leaves the loop (`if done: save(); break`) runs once per loop, not per iteration
            self._guards.extend([node.test.id] if isinstance(node.test, ast.Name) else [])
            self._visit_block(node.body, fn, loops, gated or bool(loops) and _leaves(node.body), owner)
            del self._guards[len(self._guards) - isinstance(node.test, ast.Name):]
            # the `else:` of a throttling test runs the other times: usually (`if args.render: ... else: train`)
            self._visit_block(node.orelse, fn, loops, throttled or bool(loops) and _leaves(node.orelse), owner)
            return
        if isinstance(node, (ast.With, ast.AsyncWith)):
            self._scan_expressions([item.context_expr for item in node.items], fn, loops, throttled)
            self._visit_block(node.body, fn, loops, throttled, owner)
            return
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            self._visit_block(node.body, fn, loops, throttled, owner)  # type: ignore[attr-defined]
            for handler in node.handlers:  # type: ignore[attr-defined]
                self._visit_block(handler.body, fn, loops, True, owner)  # error path: runs when something fails
            self._visit_block(node.orelse, fn, loops, throttled, owner)  # type: ignore[attr-defined]
            self._visit_block(node.finalbody, fn, loops, throttled, owner)  # type: ignore[attr-defined]
            return
        if type(node).__name__ == "Match":  # loops in its cases count in source order, as libcst sees them
            self._scan_expressions([node.subject], fn, loops, throttled)  # type: ignore[attr-defined]
            for case in node.cases:  # type: ignore[attr-defined]
                self._visit_block(case.body, fn, loops, throttled, owner)
            return
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            self._record_instance(node)
            self._record_partial(node)
            self._record_result(node, fn, bool(loops))
            if isinstance(node, ast.Assign) and vocab.returns_observation(_dotted(node.value.func)):
                fn.env_names.update(n.id for t in node.targets for n in pyast.walk(t) if isinstance(n, ast.Name))
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self._binding[id(node.value)] = node.targets[0].id
            wrapped = _unwrapped(node.value)
            if isinstance(node, ast.Assign) and wrapped is not node.value and (source := _dotted(wrapped)):
                # `batch_iterator = tqdm(train_loader, desc=...)`: iterating the wrapper iterates the loader
                for bound in node.targets:
                    if (name := _dotted(bound)) is not None:
                        fn.copies.setdefault(name, []).append(source)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.IfExp):
            self._record_instance(node)
        elif isinstance(node, ast.Assign) and (source := _dotted(node.value)) is not None:
            for bound in node.targets:
                if (name := _dotted(bound)) is not None:
                    fn.copies.setdefault(name, []).append(source)
                    if source.split(".")[0] in fn.env_names and isinstance(bound, ast.Name):
                        fn.env_names.add(bound.id)  # `obs = next_obs`, `obs = time_step.observation`
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, (ast.Compare, ast.BoolOp)) and _throttling(node.value, self.constants):
            fn.throttle_flags.add(node.targets[0].id)  # `vis = step % config.vis_interval == 0`
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, (ast.BinOp, ast.UnaryOp)):
            fn.operands.setdefault(node.targets[0].id, set()).update(
                n.id for n in pyast.walk(node.value) if isinstance(n, ast.Name))
        self._scan_expressions([node], fn, loops, throttled)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            # (after the calls of the value are recorded: they read the names as they were before)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            fn.rebound.update(n.id for t in targets for n in pyast.walk(t) if isinstance(n, ast.Name))
            self._track_device_names(node, fn)
            _track_keyword_dicts(node, fn)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                (fn.counters.add if _counts(node.value, fn.counters) else fn.counters.discard)(node.targets[0].id)

    def _scan_expressions(self, roots: list[ast.AST], fn: FunctionSummary, loops: list[tuple[Frequency, int]],
                          throttled: bool) -> None:
        frequency = max((f for f, _ in loops), default=Frequency.ONCE)
        loop_ids = tuple(i for _, i in loops)
        calls, comprehensions, listed = _calls_and_comprehensions(roots)
        # a function listed to be applied in turn runs here: a call site once the name resolves to one
        fn.listed.extend(CallSite(_call_target(name), frequency, throttled, loop_ids, guards=tuple(self._guards))
                         for name in listed)
        for node in comprehensions:  # `[net(x) for x, _ in loader]` iterates `loader` like a `for` statement
            fn.loop_reads.extend((id(generator), source) for generator in node.generators
                                 for source in _loop_sources(generator.iter))
        read_back = set()
        for call in calls:  # `f(s).detach().cpu().numpy()`: `f(s)` is read back; `a.cpu()`: the name `a` is
            if isinstance(call.func, ast.Attribute) and call.func.attr in _READ_BACK_ATTRIBUTES:
                receiver, chain = call.func.value, {call.func.attr}
                while isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) \
                        and receiver.func.attr in _READ_BACK_ATTRIBUTES:
                    chain.add(receiver.func.attr)
                    receiver = receiver.func.value
                # `value.item()` of a parameter: the helper's own read is not proven a tensor's (NumPy has `.item()`
                # too), so its callers are told; `p.detach().cpu()` is, and is judged where it is written
                reads = chain & _HOST_READS and not chain & {"cpu", "detach"}
                while isinstance(receiver, ast.Attribute) and receiver.attr == "data":
                    receiver = receiver.value
                if isinstance(receiver, ast.Call):
                    read_back.add(id(receiver))
                elif isinstance(receiver, ast.Name):
                    if receiver is call.func.value:
                        self._read_names.setdefault(id(fn), set()).add(receiver.id)
                        counts = self._read_counts.setdefault(id(fn), {})
                        counts[receiver.id] = counts.get(receiver.id, 0) + 1
                    # `p.detach().cpu().numpy()` of a parameter, unconditionally: the helper reads its argument
                    if reads and receiver.id in fn.params and not throttled and not loops:
                        fn.reads_params.add(receiver.id)
            elif isinstance(call.func, ast.Name) and call.func.id in ("float", "int") and len(call.args) == 1 \
                    and isinstance(call.args[0], ast.Name) and call.args[0].id in fn.params and not throttled \
                    and not loops:
                fn.reads_params.add(call.args[0].id)
        for call in calls:
            if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
                loss = call.args[0] if call.args else call.func.value
                fn.backward_names.update(n.id for n in pyast.walk(loss) if isinstance(n, ast.Name))
                if isinstance(loss, ast.Name):  # backpropagated: a tensor, of the step of a CUDA program
                    fn.device_names.add(loss.id)
            elif isinstance(call.func, ast.Attribute) and call.func.attr == "grad" and call.args \
                    and vocab.last_part(_dotted(call.func.value)) == "autograd":
                # `torch.autograd.grad(kl, params)` differentiates its outputs as `.backward()` does
                fn.backward_names.update(n.id for n in pyast.walk(call.args[0]) if isinstance(n, ast.Name))
            dotted = _dotted(call.func)
            if dotted is None:
                continue
            if vocab.last_part(dotted) == "compile" and call.args and isinstance(call.args[0], ast.Name):
                self.file.compiled.add(call.args[0].id)
            if vocab.last_part(dotted) == "DataLoader":
                self._record_collate(call, fn)
            self.file.device_loaders |= isinstance(call.func, ast.Attribute) \
                and call.func.attr in vocab.DEVICE_LOADER_WRAPPERS
            self._record_arguments(dotted, call)
            target = _call_target(dotted)
            # (`Trainer(**kwargs)` with `kwargs = {"actor": actor, ...}` built in the function: its entries)
            keywords = [(k.arg, k.value) for k in call.keywords if k.arg] + [
                entry for k in call.keywords if k.arg is None and isinstance(k.value, ast.Name)
                for entry in fn.keyword_dicts.get(k.value.id, ())]
            passed = tuple((i, a.id) for i, a in enumerate(call.args) if isinstance(a, ast.Name)) + tuple(
                (keyword, value.id) for keyword, value in keywords if isinstance(value, ast.Name))
            arguments = [*enumerate(call.args), *keywords]
            built = tuple((slot, cls) for slot, value in arguments if (cls := _constructed_class(value)))
            references = tuple((slot, reference) for slot, value in arguments
                               if isinstance(value, ast.Attribute) and (reference := _dotted(value)))
            values = [*call.args, *(value for _, value in keywords)]
            observed = tuple(slot for slot, value in arguments if _observed(value, fn.env_names)) \
                if fn.env_names else ()
            hidden = any(isinstance(a, ast.Starred) for a in call.args) or any(
                k.arg is None and not (isinstance(k.value, ast.Name) and k.value.id in fn.keyword_dicts)
                for k in call.keywords)
            device_slots = () if hidden else tuple(
                slot for slot, value in arguments if self._on_device(value, fn.device_names, fn))
            handed = tuple((slot, name) for slot, name in passed if name in fn.params and name not in fn.rebound)
            parts = tuple((slot, part.value.id) for slot, part in arguments if isinstance(part, ast.Subscript)
                          and isinstance(part.value, ast.Name) and isinstance(part.slice, ast.Constant))
            fn.sites.append(CallSite(target, frequency, throttled, loop_ids, passed, built, references,
                                     id(call) in read_back, tuple(self._guards), bool(values) and all(
                                         _is_number(v, self._number_names) for v in values), observed,
                                     None if hidden else tuple(slot for slot, _ in arguments), device_slots, handed,
                                     parts))
            started = _started_function(dotted, call) or _applied_function(dotted, call)
            if started is not None:  # `mp.Process(target=run_training, ...)`: the process runs the function
                fn.sites.append(CallSite(_call_target(started), frequency, throttled, loop_ids,
                                         guards=tuple(self._guards)))
            if (bound := self._binding.get(id(call))) is not None:
                self._bound_sites.setdefault(id(fn), []).append((bound, len(fn.sites) - 1))
            if not loops and not throttled:
                if vocab.is_training_step_call(dotted) or vocab.steps_with(_argument_names(call)):
                    fn.steps_at_top = True
                elif vocab.is_env_step(dotted):
                    fn.env_at_top = True
                elif vocab.is_network_call(dotted, self.network_names) or self._annotated_network(fn, dotted):
                    fn.network_at_top = True

    def _track_device_names(self, node: ast.Assign | ast.AnnAssign | ast.AugAssign, fn: FunctionSummary) -> None:
        """Keep `fn.device_names` as the walk passes an assignment: its targets hold GPU tensors from here on, or
        no longer do (`loss = loss.item()`); `total += loss` makes `total` one, adding a number keeps it."""
        value = node.value
        if isinstance(node, ast.AugAssign):
            if isinstance(node.target, ast.Name) and self._on_device(value, fn.device_names, fn):
                fn.device_names.add(node.target.id)
            return
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(value.elts):
                pairs = list(zip(target.elts, value.elts))  # `x, y = x.cuda(), y.cuda()`
            elif isinstance(target, (ast.Tuple, ast.List)):
                pairs = [(element, None) for element in target.elts]
            else:
                pairs = [(target, value)]
            for bound, part in pairs:
                if isinstance(bound, ast.Name):
                    if part is not None and self._on_device(part, fn.device_names, fn):
                        fn.device_names.add(bound.id)
                    else:
                        fn.device_names.discard(bound.id)

    def _on_device(self, node: ast.expr, device: set[str], fn: FunctionSummary, depth: int = 0) -> bool:
        """Does `node` evaluate to a GPU tensor, given the names in `device` hold some? A move to a device, or
        tensor ops (operators, tensor methods, `torch.*`/`F.*` functions) on such a value; never a read back
        (`.item()`, `.cpu()`), a shape or a size. Bounded: a long generated expression (`1 + 1 + ... + 1`) is
        not followed to its end."""
        if depth > _DEVICE_DEPTH:
            return False
        if isinstance(node, ast.Name):
            return node.id in device
        if isinstance(node, ast.Subscript):  # `out[0]`, not `x.shape[0]` (an attribute: not followed)
            return self._on_device(node.value, device, fn, depth + 1)
        if isinstance(node, ast.BinOp):
            return any(self._on_device(side, device, fn, depth + 1) for side in (node.left, node.right))
        if isinstance(node, ast.UnaryOp):
            return not isinstance(node.op, ast.Not) and self._on_device(node.operand, device, fn, depth + 1)
        if isinstance(node, ast.Compare):
            return not any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops) and any(
                self._on_device(side, device, fn, depth + 1) for side in (node.left, *node.comparators))
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = _dotted(func.value)
            if func.attr in ("cuda", "to") and _module_moved(func.value):
                return False  # `Net().cuda()`, `model.to(device)`: a network moved, no tensor
            if func.attr == "cuda" and receiver not in ("torch", "torch.cuda"):
                return True
            if func.attr == "to":
                return _to_a_device(node)
            if func.attr in vocab.TENSOR_PRESERVING_METHODS and not (receiver or "").startswith(("np.", "numpy.", "math.")):
                return self._on_device(func.value, device, fn, depth + 1)
            if receiver in _TORCH_FUNCTION_MODULES:
                return any(self._on_device(a, device, fn, depth + 1)
                           for a in (*node.args, *(k.value for k in node.keywords)))
        # (a network's output is not taken for one: where the network runs is not known here, and self-play workers
        # often run a CPU copy)
        return False

    def _annotated_network(self, fn: FunctionSummary, dotted: str | None) -> bool:
        """`nn(x)` or `nn.forward_for_alphazero(x)` on a parameter annotated with a network class of the program
        (`def evaluate(state, nn: NeuralNetwork)`)."""
        if not dotted or not fn.param_classes:
            return False
        parts = dotted.split(".")
        annotated = fn.param_classes.get(parts[0])
        return len(parts) <= 2 and annotated is not None and vocab.normalised_name(annotated) in self.network_names

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, owner: tuple[str, ...]) -> None:
        key = ".".join((*owner, node.name))
        class_name = owner[-1] if owner and owner[-1] in self.file.classes else None
        arguments = node.args
        params = tuple(a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs))
        summary = FunctionSummary(key, class_name, node.name, params=params,
                                  static=any(_dotted(d) == "staticmethod" for d in node.decorator_list))
        annotated = ((a.arg, vocab.last_part(_dotted(a.annotation)) if a.annotation is not None else "")
                     for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs))
        summary.param_classes = {name: cls for name, cls in annotated if cls[:1].isupper()}
        if class_name is not None and node.name in ("forward", "training_step") and self._is_module(class_name):
            summary.seed = Frequency.PER_STEP
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if vocab.last_part(_dotted(target)) == "compile":
                summary.seed = Frequency.PER_STEP
        data_params = set(params) - {"self", "cls"} | ({arguments.vararg.arg} if arguments.vararg else set())
        returns, assigns = _returns_and_assigns(node)
        enclosing_numbers, self._number_names = self._number_names, _number_names(assigns)
        enclosing_wrapping, self._wrapping = self._wrapping, _iterator_names(assigns)
        if returns:
            summary.returns_host = _returns_host_tensors(returns, assigns)
            summary.returns_factory = _returns_factory_tensor(returns, assigns)
            summary.moves_parameter = bool(data_params) and any(_moved_parameter(r, data_params) for r in returns)
            summary.builds = tuple(dict.fromkeys(c for r in returns if (c := _constructed_class(r))))
            nested = {d.name for d in node.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
            summary.returns_function = next((r.id for r in returns if isinstance(r, ast.Name) and r.id in nested),
                                            None)
            if data_params:
                summary.uploads = _uploads_parameter(node, data_params, returns, assigns)
                summary.downloads = _downloads_parameter(data_params, returns)
        if class_name is not None:
            self.file.numpy_arrays.setdefault(class_name, set()).update(_numpy_attributes(assigns))
            if data_params and not arguments.vararg:
                summary.stored_into = _stored_into(assigns, data_params)
        summary.abstract = _is_abstract(node)
        summary.yields_parameter = _yielded_parameter(node, data_params) if self._yields else None
        summary.cpu_defaults = _cpu_defaults(arguments)
        self.file.functions.setdefault(key, summary)
        self._visit_block(node.body, summary, [], False, (*owner, node.name))
        self._number_names = enclosing_numbers
        self._wrapping = enclosing_wrapping
        if node.name == "forward" and self.file.step_loops & set(summary.loops):
            summary.seed = Frequency.ONCE  # `Trainer(nn.Module).forward()` runs the whole training: not per step
        if returns and summary.backward_names:
            summary.returns_losses = _returned_positions(returns, summary.backward_names)
        # from the calls the walk above collected (its own, nested definitions left out)
        summary.moves_to_device = any(site.target[-1] in ("to", "cuda") for site in summary.sites)
        if returns and data_params and (not summary.loops or _loops_over_settings(node)) and not summary.uploads:
            summary.tensor_helper = _computes_on_arguments(summary, data_params, returns, assigns,
                                                           class_name is not None and self._is_module(class_name),
                                                           _computed_lists(node))
            if summary.tensor_helper:
                summary.plain_calls = {site.target[1] for site in summary.sites if site.target[0] == "name"}
        self._mark_read_back(node, summary)

    def _mark_read_back(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Module, fn: FunctionSummary) -> None:
        """`a = self.actor.get_action(s)` then only `a.detach().cpu().numpy()`: that site's result is read back."""
        read = self._read_names.pop(id(fn), set())
        bound = [(name, index) for name, index in self._bound_sites.pop(id(fn), []) if name in read]
        if not bound:
            return
        loads: dict[str, int] = {}
        for statement in node.body:
            for found in pyast.walk(statement):
                if isinstance(found, ast.Name) and found.id in read and isinstance(found.ctx, ast.Load):
                    loads[found.id] = loads.get(found.id, 0) + 1
        reads = self._read_counts.pop(id(fn), {})
        for name, index in bound:
            if loads.get(name, 0) == reads.get(name, 0):
                fn.sites[index].read_back = True

    def _record_arguments(self, dotted: str, call: ast.Call) -> None:
        """Which arguments a call passes, for the parameters whose CPU default a caller may override (`partial(f,
        device=d)` passes `device` to `f`)."""
        function, arguments = vocab.last_part(dotted), call.args
        if function == "partial" and call.args:
            function, arguments = vocab.last_part(_dotted(call.args[0]) or ""), call.args[1:]
        if not function:
            return
        self.file.arguments_passed.update((function, k.arg) for k in call.keywords if k.arg)
        self.file.arguments_passed.update((function, i) for i in range(len(arguments)))

    def _record_partial(self, node: ast.Assign | ast.AnnAssign) -> None:
        call = node.value
        assert isinstance(call, ast.Call)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if vocab.last_part(_dotted(call.func)) != "partial" or len(targets) != 1 or not isinstance(targets[0], ast.Name):
            return
        function = vocab.last_part(_dotted(call.args[0])) if call.args else None
        self.file.partials[targets[0].id] = (function, any(k.arg == "device" for k in call.keywords))

    def _record_collate(self, loader: ast.Call, fn: FunctionSummary) -> None:
        collate = next((k.value for k in loader.keywords if k.arg == "collate_fn"), None)
        if collate is None and len(loader.args) > 6:
            collate = loader.args[6]  # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, workers, collate)
        if isinstance(collate, ast.Call) and vocab.last_part(_dotted(collate.func)) == "partial":
            self.file.device_collate |= any(k.arg == "device" for k in collate.keywords)
            collate = collate.args[0] if collate.args else None
        if isinstance(collate, ast.Lambda):
            self.file.device_collate |= _moves_to_device([collate.body])
        elif collate is not None and (name := vocab.last_part(_dotted(collate))):
            self.file.collate_functions.add(name)
            self.file.collate_scopes.setdefault(name, fn.key)  # (a closure: `def collate_fn(b): ...` beside it)

    def _is_module(self, class_name: str, depth: int = 0) -> bool:
        bases = self.file.classes.get(class_name, [])
        return depth < 8 and any(b in ("Module", "LightningModule") or b in self.module_classes
                                 or (b in self.file.classes and self._is_module(b, depth + 1)) for b in bases)

    def _record_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                self.file.imports[local] = (0, alias.name if alias.asname else alias.name.split(".")[0], None)
            return
        for alias in node.names:
            if alias.name == "*":
                self.file.star_imports.append((node.level, node.module or ""))
            else:
                self.file.imports[alias.asname or alias.name] = (node.level, node.module or "", alias.name)

    @staticmethod
    def _record_result(node: ast.Assign | ast.AnnAssign, fn: FunctionSummary, in_loop: bool) -> None:
        """`train_loader, val_loader = get_loaders(cfg)`: which names hold which element of which call."""
        dotted = _dotted(node.value.func)  # type: ignore[union-attr]
        if dotted is None:
            return
        target = _call_target(dotted)
        for bound in (node.targets if isinstance(node, ast.Assign) else [node.target]):
            named = [(_dotted(element), index) for index, element in enumerate(bound.elts)] \
                if isinstance(bound, (ast.Tuple, ast.List)) else [(_dotted(bound), None)]
            for name, index in named:
                if name is not None:
                    fn.results.setdefault(name, []).append((target, index))
                    if in_loop:
                        fn.rebound_in_loops.add(name)

    def _record_instance(self, node: ast.Assign | ast.AnnAssign) -> None:
        value = node.value
        # `self.memory = PrioritizedMemory(...) if use_per else Memory(...)`: either class
        options = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for built in filter(None, map(_constructed_class, options)):
            for target in targets:
                name = _dotted(target)
                if name is not None:
                    classes = self.file.instances.setdefault(name, [])
                    if built not in classes:  # `if acktr: self.opt = KFAC(...) else: self.opt = optim.RMSprop(...)`
                        classes.append(built)


_DEVICE_DEPTH = 32  # nested operations followed when judging whether an expression is a GPU tensor
_TORCH_FUNCTION_MODULES = frozenset({"torch", "F", "torch.nn.functional", "nn.functional"})
_NOT_DEVICES = frozenset({"cpu", "float", "double", "half", "bfloat16", "float16", "float32", "float64", "int64",
                          "long", "int", "int32", "bool", "uint8"})


def _lambda_function(name: str, lambda_: ast.Lambda) -> ast.FunctionDef:
    """`def name(args): return body` for `name = lambda args: body`, at the lambda's place."""
    returned = ast.copy_location(ast.Return(value=lambda_.body), lambda_.body)
    fields = {"type_params": []} if "type_params" in ast.FunctionDef._fields else {}
    function = ast.FunctionDef(name=name, args=lambda_.args, body=[returned], decorator_list=[], returns=None,
                               type_comment=None, **fields)
    return ast.copy_location(function, lambda_)


def _track_keyword_dicts(node: ast.Assign | ast.AnnAssign | ast.AugAssign, fn: FunctionSummary) -> None:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for target in targets:
        if isinstance(target, ast.Name):
            value = node.value
            if isinstance(value, ast.Dict) and not isinstance(node, ast.AugAssign) and all(
                    isinstance(key, ast.Constant) and isinstance(key.value, str) for key in value.keys):
                fn.keyword_dicts[target.id] = [
                    (key.value, v) for key, v in zip(value.keys, value.values)]  # type: ignore[union-attr]
            else:
                fn.keyword_dicts.pop(target.id, None)


def _module_moved(receiver: ast.expr) -> bool:
    """The receiver of a `.cuda()`/`.to()` is a module: a class built there (`Net(...)`) or a value named as networks
    are (`model`, `self.policy`)."""
    if isinstance(receiver, ast.Call):
        built = vocab.last_part(_dotted(receiver.func))
        return built[:1].isupper() and not built.endswith("Tensor") and built != "Variable"
    name = _dotted(receiver)
    return name is not None and bool(vocab.MODEL_NAME.search(vocab.last_part(name)))


def _to_a_device(call: ast.Call) -> bool:
    """`x.to(device)`, `x.to("cuda", non_blocking=True)`, `x.to(device=d)`; not `x.to(torch.float16)`, `x.to("cpu")`,
    `x.to(dtype=...)`."""
    target = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device"), None)
    if target is None:
        return False
    if isinstance(target, ast.Constant):
        return isinstance(target.value, str) and target.value.startswith("cuda")
    name = _dotted(target)
    return name is not None and vocab.last_part(name) not in _NOT_DEVICES and not name.endswith("dtype")


_HOST_CONSTRUCTORS = frozenset({"from_numpy", "tensor", "as_tensor", "asarray", "Tensor", "FloatTensor", "LongTensor",
                                "DoubleTensor", "IntTensor", "BoolTensor", "ByteTensor"})


def _returns_and_assigns(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[ast.expr], list[ast.Assign]]:
    """The values the function returns and its assignments, its nested definitions left out."""
    returns: list[ast.expr] = []
    assigns: list[ast.Assign] = []
    for statement in _statements(node.body):
        if isinstance(statement, ast.Return) and statement.value is not None:
            returns.append(statement.value)
        elif isinstance(statement, ast.Assign):
            assigns.append(statement)
    return returns, assigns


def _uploads_parameter(node: ast.FunctionDef | ast.AsyncFunctionDef, params: set[str], returned: list[ast.expr],
                       assigns: list[ast.Assign]) -> bool:
    """A helper such as `def tensor(x): return torch.from_numpy(np.asarray(x)).to(DEVICE)`: what it returns is one of
    its parameters turned into a tensor on the host and moved to a device (`.to(...)` / `.cuda()`, or `device=`), so
    every call of it is a host-to-device copy of the caller's data. A function that uploads its input only to use it
    (`select_action(state)` returning an action) is not one: its own line is the copy; nor is a memoised one."""
    if any(vocab.last_part(_dotted(d.func if isinstance(d, ast.Call) else d)) in ("lru_cache", "cache", "cached")
           for d in node.decorator_list):
        return False  # memoised: one copy per distinct argument
    uploaded = {t.id for a in assigns if _is_upload(a.value, params) for t in a.targets if isinstance(t, ast.Name)}
    return any(_is_upload(value, params) or isinstance(value, ast.Name) and value.id in uploaded for value in returned)


def _downloads_parameter(params: set[str], returned: list[ast.expr]) -> bool:
    """A helper such as `def to_np(t): return t.cpu().detach().numpy()`: it returns one of its parameters read back
    to the host (`.cpu()`, `.numpy()`, `.item()`, `.tolist()` on it), so its callers use a value as data."""
    for value in returned:
        reads = False
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            reads |= value.func.attr in ("cpu", "numpy", "item", "tolist")
            value = value.func.value
        if reads and isinstance(value, ast.Name) and value.id in params:
            return True
    return False


_NUMPY_ARRAY_BUILDERS = frozenset({"zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like",
                                   "full_like", "array"})


def _numpy_attributes(assigns: list[ast.Assign]) -> set[str]:
    """Attributes a method sets to a NumPy array (`self.val_buf = np.zeros(size, dtype=np.float32)`)."""
    found = set()
    for assign in assigns:
        value = assign.value
        if isinstance(value, ast.Call) and (_dotted(value.func) or "").split(".")[0] in ("np", "numpy") \
                and vocab.last_part(_dotted(value.func)) in _NUMPY_ARRAY_BUILDERS:
            found.update(t.attr for t in assign.targets if isinstance(t, ast.Attribute)
                         and isinstance(t.value, ast.Name) and t.value.id == "self")
    return found


def _stored_into(assigns: list[ast.Assign], params: set[str]) -> frozenset[str]:
    """`def store(self, obs, val): self.obs_buf[self.ptr] = obs; self.val_buf[self.ptr] = val`: the attributes its
    parameters are written into, when every parameter is written into an element of one (else empty)."""
    into: dict[str, str] = {}
    for assign in assigns:
        if not isinstance(assign.value, ast.Name) or assign.value.id not in params:
            continue
        for target in assign.targets:
            array = target.value if isinstance(target, ast.Subscript) else None
            if isinstance(array, ast.Attribute) and isinstance(array.value, ast.Name) and array.value.id == "self":
                into[assign.value.id] = array.attr
    return frozenset(into.values()) if set(into) == params else frozenset()


def _cpu_defaults(arguments: ast.arguments) -> tuple[tuple[int, str], ...]:
    """`def collate(batch, device="cpu")`: (position, name) of parameters whose default is the CPU."""
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = [*([None] * (len(positional) - len(arguments.defaults))), *arguments.defaults]
    pairs = [(i, a.arg, d) for i, (a, d) in enumerate(zip(positional, defaults))]
    pairs += [(-1, a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]
    return tuple((i, name) for i, name, default in pairs if default is not None and _names_cpu(default))


def _names_cpu(value: ast.expr) -> bool:
    if isinstance(value, ast.Call) and vocab.last_part(_dotted(value.func)) == "device" and value.args:
        value = value.args[0]
    return isinstance(value, ast.Constant) and value.value == "cpu"


def _is_abstract(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return all(isinstance(s, (ast.Pass, ast.Raise)) for s in body)


_COMPUTED = (ast.Call, ast.BinOp, ast.UnaryOp, ast.Subscript)
# builtins a tensor helper may call (not `float`, `int`, `bool`: they read a tensor back)
_PLAIN_BUILTINS = frozenset({"len", "max", "min", "abs", "isinstance", "getattr", "hasattr", "range", "tuple", "list",
                             "super"})
_READS_BACK = frozenset({"cpu", "numpy", "item", "tolist", "to", "cuda"})


def _computes_on_arguments(fn: FunctionSummary, params: set[str], returned: list[ast.expr],
                           assigns: list[ast.Assign], module_method: bool, lists: set[str]) -> bool:
    """A tensor helper (`def normalise(h): lo = h.min(1)[0]; return (h - lo) / (h.max(1)[0] - lo)`, a helper
    calling `torch.softmax(logits)`, a network's method calling its layers `self.head(h)`, the classic
    `accuracy(output, target, topk=(1, 5))` appending one value per k to a list it returns): code without loops
    over data (the caller checks) that calls torch, methods of its parameters or (a module's method) its own
    layers and methods, returns a computed value (or a list of `lists`, of computed values), and never reads a
    value back to the host, moves one, or calls NumPy. Judged from the call sites of its summary."""
    computed = set(params) | lists | {n.id for a in assigns if isinstance(a.value, _COMPUTED)
                                      for target in a.targets for n in pyast.walk(target) if isinstance(n, ast.Name)}
    values = [e for v in returned for e in (v.elts if isinstance(v, ast.Tuple) else [v])]
    if not all(isinstance(v, _COMPUTED) or isinstance(v, ast.Name) and v.id in computed for v in values):
        return False
    uses_torch = False
    for site in fn.sites:
        receiver = site.target[1] if site.target[0] == "attr" else ""
        if site.target[-1] in _READS_BACK or receiver.split(".", 1)[0] in ("np", "numpy"):
            return False
        uses_torch |= receiver.split(".", 1)[0] in ("torch", "F") or receiver.split(".", 1)[0] in params \
            or module_method and site.target[0] == "self"
    return uses_torch


def _loops_over_settings(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Every loop of the function runs over a setting, not over data: `for k in topk` with `topk=(1, 5)` a
    parameter default, a literal tuple or list, `range(3)`."""
    arguments = node.args
    positional = [*arguments.posonlyargs, *arguments.args]
    settings = {a.arg for a, default in zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults)
                if isinstance(default, (ast.Tuple, ast.List, ast.Constant))}
    settings |= {a.arg for a, default in zip(arguments.kwonlyargs, arguments.kw_defaults)
                 if isinstance(default, (ast.Tuple, ast.List, ast.Constant))}
    for loop in _statements(node.body):
        if isinstance(loop, ast.While):
            return False
        if isinstance(loop, (ast.For, ast.AsyncFor)):
            iterable = loop.iter
            if not (isinstance(iterable, ast.Name) and iterable.id in settings
                    or isinstance(iterable, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Constant)
                                                                           for e in iterable.elts)
                    or isinstance(iterable, ast.Call) and _dotted(iterable.func) == "range"
                    and all(isinstance(a, ast.Constant) for a in iterable.args)):
                return False
    return True


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a body and of the blocks inside it (last first), nested definitions left out: statements
    only, no expressions, so cheap on every function."""
    pending = list(body)
    while pending:
        statement = pending.pop()
        yield statement
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(statement, field, ()):
                    pending.extend(child.body if isinstance(child, (ast.ExceptHandler, ast.match_case)) else [child])


def _computed_lists(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names bound to `[]` that the function only appends computed values to (`res.append(wrong_k.mul_(100))`)."""
    lists = {target.id for statement in _statements(node.body) if isinstance(statement, ast.Assign)
             and isinstance(statement.value, ast.List) and not statement.value.elts
             for target in statement.targets if isinstance(target, ast.Name)}
    for call in pyast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
                and call.func.value.id in lists and (call.func.attr != "append" or len(call.args) != 1
                                                     or not isinstance(call.args[0], (*_COMPUTED, ast.Name))):
            lists.discard(call.func.value.id)
    return lists


def _returns_host_tensors(returned: list[ast.expr], assigns: list[ast.Assign]) -> bool:
    """A sampler such as `def sample(self, n): ...; return torch.tensor(obs), torch.from_numpy(acts)`: what it returns
    (a value, or the elements of a returned tuple) are tensors it builds on the host, none moved to a device, so a
    caller's `.to(device)` of them copies host memory."""
    built: dict[str, bool] = {}
    for assign in reversed(assigns):  # statement order (the walk collected them last first)
        for name, value in _assigned_pairs(assign):
            if isinstance(name, ast.Name):
                built[name.id] = _builds_on_host(value) or isinstance(value, ast.Name) and built.get(value.id, False)
    for value in returned:
        elements = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value]
        verdicts = [_builds_on_host(e) or isinstance(base := _shape_kept(e), ast.Name) and built.get(base.id, False)
                    for e in elements]
        if any(verdicts) and not any(isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute)
                                     and e.func.attr in ("to", "cuda") for e in elements):
            return True
    return False


def _returns_factory_tensor(returned: list[ast.expr], assigns: list[ast.Assign]) -> bool:
    """`def sample_timesteps(self, n): return torch.randint(1, self.T, (n,))`: every return is a torch factory's new
    tensor made without `device=` (directly, cast, or through a name bound to one), so it is a CPU tensor, and a
    caller's `.to(device)` of it copies what the device could have made itself."""
    bound = {target.id: assign.value for assign in assigns for target in assign.targets
             if isinstance(target, ast.Name)}
    # `out = torch.zeros(n, d); out[rows, labels] = 1; return out`: filled on the host, a different trade-off
    written = {target.value.id for assign in assigns for target in assign.targets
               if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)}
    if not returned:
        return False
    for value in returned:
        value = _shape_kept(value)
        if isinstance(value, ast.Name):
            if value.id in written:
                return False
            value = _shape_kept(bound.get(value.id, value))
        if not (isinstance(value, ast.Call) and not any(k.arg == "device" for k in value.keywords)
                and (_dotted(value.func) or "").split(".")[0] == "torch"
                and (_dotted(value.func) or "").count(".") == 1
                and vocab.last_part(_dotted(value.func)) in vocab.TORCH_FACTORIES):
            return False
    return True


def _moved_parameter(value: ast.expr, params: set[str]) -> bool:
    """`x.to(device)`, `x.cuda(i)`, `Variable(x).cuda()` with `x` a parameter."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in ("to", "cuda")):
        return False
    moved = value.func.value
    if isinstance(moved, ast.Call) and vocab.last_part(_dotted(moved.func)) == "Variable" and len(moved.args) == 1:
        moved = moved.args[0]
    return isinstance(moved, ast.Name) and moved.id in params


def _returned_positions(returned: list[ast.expr], names: set[str]) -> tuple[int | None, ...]:
    """Where every `return` puts one of `names`: positions in the returned tuple, None for the whole value."""
    found: set[int | None] | None = None
    for value in returned:
        here = {None} if isinstance(value, ast.Name) and value.id in names else {
            i for i, e in enumerate(value.elts) if isinstance(e, ast.Name) and e.id in names
        } if isinstance(value, ast.Tuple) else set()
        found = here if found is None else found & here
    return tuple(sorted(found or (), key=lambda i: -1 if i is None else i))


def _shape_kept(value: ast.expr) -> ast.expr:
    """`x` of `x.float().reshape(n, -1)`: casts and reshapes keep a tensor where it is."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in ("float", "long", "int", "double", "bool", "byte", "contiguous", "unsqueeze",
                                    "squeeze", "view", "reshape"):
        value = value.func.value
    return value


def _builds_on_host(value: ast.expr) -> bool:
    """`torch.tensor(x)`, `torch.from_numpy(a).float()`, `torch.FloatTensor(b)`, without `device=`; also a choice
    between one and a value passed through (`torch.from_numpy(x) if isinstance(x, np.ndarray) else x`)."""
    if isinstance(value, ast.IfExp):
        return _builds_on_host(value.body) or _builds_on_host(value.orelse)
    value = _shape_kept(value)
    if not isinstance(value, ast.Call) or any(k.arg == "device" for k in value.keywords):
        return False
    dotted = _dotted(value.func) or ""
    return dotted.split(".")[0] == "torch" and vocab.last_part(dotted) in _HOST_CONSTRUCTORS | {"tensor", "as_tensor"}


_CASTS = frozenset({"float", "long", "int", "double", "bool", "byte", "contiguous"})


def _is_upload(value: ast.expr, params: set[str]) -> bool:
    """`torch.from_numpy(x).float().to(device)`, `torch.tensor(x, device=d)` with `x` (or `np.asarray(x)`) a parameter;
    also each item of one (`tuple(torch.as_tensor(x, device=d) for x in xs)`) or several (`return a.to(d), b.to(d)`)."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("tuple", "list") \
            and len(value.args) == 1:
        value = value.args[0]
    if isinstance(value, (ast.ListComp, ast.GeneratorExp)) and len(value.generators) == 1:
        generator = value.generators[0]
        return isinstance(generator.iter, ast.Name) and generator.iter.id in params and _is_upload(
            value.elt, {n.id for n in pyast.walk(generator.target) if isinstance(n, ast.Name)})
    if isinstance(value, (ast.Tuple, ast.List)):
        return bool(value.elts) and all(_is_upload(element, params) for element in value.elts)
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _CASTS:
        value = value.func.value  # `torch.from_numpy(x).to(device).float()`: cast after the move
    if not isinstance(value, ast.Call):
        return False
    source: ast.expr = value
    if isinstance(value.func, ast.Attribute) and value.func.attr in ("to", "cuda"):
        source = value.func.value
        while isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) and source.func.attr in _CASTS:
            source = source.func.value
    elif not any(k.arg == "device" for k in value.keywords):
        return False
    if not isinstance(source, ast.Call) or vocab.last_part(_dotted(source.func)) not in _HOST_CONSTRUCTORS:
        return False
    data = source.args[0] if source.args else None
    while isinstance(data, ast.Call) and data.args:  # `np.asarray(x, dtype=np.float32)`
        data = data.args[0]
    if isinstance(data, ast.Starred):  # `def from_numpy(*args): return torch.from_numpy(*args).to(device)`
        data = data.value
    return isinstance(data, ast.Name) and data.id in params


def _constructed_class(value: ast.AST | None) -> str | None:
    """`Agent(config)` (also `Agent(...).to(device)`, which is still the Agent): the class name, else None.
    Qualified by the module it is reached through (`OurDDPG.DDPG(...)` beside `DDPG.DDPG(...)`: two classes)."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _KEEPS_RECEIVER:
        value = value.func.value
    if not isinstance(value, ast.Call):
        return None
    built = _dotted(value.func)
    # (class names are capitalised, or at least hold a capital: `discrete_BCQ.discrete_BCQ(...)`; a function name
    # that does is only looked up as a class and not found)
    return built if built and any(c.isupper() for c in vocab.last_part(built)) else None


def _plain_class(name: str) -> str:
    """`DDPG` of `OurDDPG.DDPG` or of `agents/ddpg.py::DDPG`."""
    return name.rpartition("::")[2] if "::" in name else vocab.last_part(name)


@lru_cache(maxsize=4096)
def _summarise_text(path: str, text: str, module_classes: frozenset[str]) -> FileSummary | None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        old_spelling = legacy.repair(text)  # `x.cuda(async=True)`: torch <= 0.3 code, read as it meant it
        if old_spelling is None:
            return None
        tree = ast.parse(old_spelling.text)
    except (ValueError, RecursionError, MemoryError):
        return None
    try:
        summariser = _Summariser(path, tree, module_classes, "add_argument" in text, "yield" in text)
    except RecursionError:
        return None  # too deeply nested to summarise: left out of the graph (its own lint reports it), the rest stands
    summary = summariser.file
    summary.functions["<module>"] = summariser.module_fn
    _throttle_flagged_branches(summary)
    for name in summary.compiled:
        if name in summary.functions:
            summary.functions[name].seed = Frequency.PER_STEP
    return summary


def _throttle_flagged_branches(summary: FileSummary) -> None:
    """Calls under `if vis_result:` in a function of the file whose callers in the file pass it a flag set every N
    steps (`update_weights(..., vis_result)` with `vis_result = step % k == 0`) run every N steps: throttled."""
    flagged: dict[str, set[str]] = {}
    for fn in summary.functions.values():
        for site in fn.sites:
            callee = summary.functions.get(site.target[1]) if site.target[0] == "name" else None
            for slot, name in site.passed:
                if callee is not None and name in fn.throttle_flags:
                    parameter = callee.params[slot] if isinstance(slot, int) and slot < len(callee.params) else slot
                    flagged.setdefault(callee.key, set()).add(str(parameter))
    for key, parameters in flagged.items():
        fn = summary.functions[key]
        fn.sites = [replace(site, throttled=True) if set(site.guards) & parameters else site for site in fn.sites]


def _module_names(path: str) -> list[str]:
    parts = [p for p in PurePosixPath(os.path.normpath(path.replace("\\", "/"))).with_suffix("").parts
             if p not in ("", "/", ".", "..")]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return [".".join(parts[start:]) for start in range(len(parts))]


_TESTS_TEXT = re.compile(r"^\s*(def test|class Test|import (pytest|unittest)|from (pytest|unittest)\b)", re.M)


class CallGraph:
    """Frequencies of the functions of every file of a program, computed once."""

    def __init__(self, sources: dict[str, str], module_classes: frozenset[str] = frozenset()) -> None:
        self.files: dict[str, FileSummary] = {}
        # test files: named like tests and holding tests (`td3_test.py` that trains an agent is the entry script)
        self._tests = {path for path, text in sources.items() if is_test_path(path) and _TESTS_TEXT.search(text)}
        for path, text in sources.items():
            if "def " not in text and "for " not in text and "import" not in text:
                continue  # nothing to summarise (a script with imports may build the program's objects and call
                # them; a package's __init__ may re-export: `from .misc import *`)
            summary = _summarise_text(path, text, module_classes)
            if summary is not None:
                self.files[path] = summary
        self._by_module: dict[str, list[str]] = {}
        for path in self.files:
            for name in _module_names(path):
                self._by_module.setdefault(name, []).append(path)
        self._methods: dict[str, list[tuple[str, str]]] = {}  # method name -> [(path, key)]
        self._classes: dict[str, list[tuple[str, str]]] = {}  # class name -> [(path, class)]
        self._class_by_normalised: dict[str, list[str]] | None = None  # `replaybuffer` -> ["ReplayBuffer"]
        for path, summary in self.files.items():
            for fn in summary.functions.values():
                if fn.class_name is not None:
                    self._methods.setdefault(fn.name, []).append((path, fn.key))
            for name in summary.classes:
                self._classes.setdefault(name, []).append((path, name))
        self.frequency: dict[tuple[str, str], Frequency] = {}
        self._override_cache: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._subclass_cache: dict[str, list[tuple[str, str]]] = {}
        self._resolved: dict[tuple[str, str, tuple[str, ...]], list[tuple[str, str]]] = {}
        self._env_steps = [(path, key) for path, summary in self.files.items() for key, fn in summary.functions.items()
                           if fn.class_name and fn.name in vocab.ENV_STEP_METHODS
                           and any(vocab.ENV_CLASS.search(name)
                                   for name in (fn.class_name, *summary.classes.get(fn.class_name, [])))]
        self._files_by_norm = {os.path.normpath(path.replace("\\", "/")): path for path in self.files}
        self._passed_in: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
        self._loop_verdicts: dict[tuple[str, str], dict[int, tuple[bool, bool, bool, bool]]] = {}
        self._objects_in: dict[tuple[str, str, str], list[str]] = {}
        self._reads_cache: dict[tuple[str, str], list[tuple[int, tuple[str, ...]]]] = {}
        self._passed_in = self._functions_passed_in()
        self._objects_in = self._objects_passed_in()
        self._resolved.clear()  # resolutions made before the passed-in functions and objects were known
        for path, summary in self.files.items():
            for fn in summary.functions.values():
                fn.sites.extend(site for site in fn.listed if self.resolve(path, fn, site.target))
        self._resolved.clear()
        self._reads_cache.clear()
        self._propagate()

    # -- resolution ------------------------------------------------------------------------------

    def _module_file(self, here: str, level: int, module: str) -> str | None:
        if level:
            base = PurePosixPath(os.path.normpath(here.replace("\\", "/"))).parent
            for _ in range(level - 1):
                base = base.parent
            stem = (base / module.replace(".", "/")) if module else base
            for candidate in (f"{stem.as_posix()}.py", f"{stem.as_posix()}/__init__.py"):
                found = self._files_by_norm.get(os.path.normpath(candidate))
                if found is not None:
                    return found
            return None
        candidates = self._by_module.get(module, [])
        if len(candidates) > 1:  # Python looks in the script's own folder first: `common/x.py` beside it wins
            folder = PurePosixPath(os.path.normpath(here.replace("\\", "/"))).parent / module.replace(".", "/")
            for candidate in (f"{folder.as_posix()}.py", f"{folder.as_posix()}/__init__.py"):
                found = self._files_by_norm.get(os.path.normpath(candidate))
                if found is not None:
                    return found
        return self._nearest(here, candidates)

    @staticmethod
    def _nearest(here: str, candidates: list[str]) -> str | None:
        """The one of several same-named files or classes an import in `here` means: Python puts a script's own
        folder first on the path, so a copy beside the importer wins (`naive/train.py` importing `Agent` gets
        `naive/Agent.py`, not the top-level `Agent.py`); else the only one."""
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        folder = PurePosixPath(os.path.normpath(here.replace("\\", "/"))).parent
        beside = [c for c in candidates if PurePosixPath(os.path.normpath(c.replace("\\", "/"))).parent == folder]
        return beside[0] if len(beside) == 1 else None

    def _function_in(self, path: str | None, name: str) -> list[tuple[str, str]]:
        """(path, key) of `name` defined at the top of `path`, following re-exports (`from .x import f`)."""
        found = self._exported(path, name, lambda summary, n: n in summary.functions)
        return [found] if found else []

    def _exported(self, path: str | None, name: str, defines: Callable[[FileSummary, str], bool],
                  depth: int = 0) -> tuple[str, str] | None:
        """(file, name there) where module `path`'s `name` is defined (`defines`), following its re-exports:
        `from .a2c_acktr import A2C_ACKTR` in a package's `__init__.py`, `from deep_rl import *` re-exporting
        `from .misc import *`."""
        if path is None or depth > 4:
            return None
        summary = self.files[path]
        if defines(summary, name):
            return path, name
        if name in summary.imports:
            level, module, imported = summary.imports[name]
            return None if imported is None else \
                self._exported(self._module_file(path, level, module), imported, defines, depth + 1)
        for level, module in summary.star_imports:
            found = self._exported(self._module_file(path, level, module), name, defines, depth + 1)
            if found:
                return found
        return None

    def _held_objects(self, path: str, class_name: str, attr: str) -> list[str]:
        """The program classes of the objects callers pass to `class_name.__init__` for the parameter it keeps in
        `self.<attr>`."""
        init = self.files[path].functions.get(f"{class_name}.__init__")
        if init is None:
            return []
        return [built for source in init.copies.get(f"self.{attr}", ()) if source in init.params
                for built in self._objects_in.get((path, init.key, source), ())]

    def _classes_named_like(self, name: str) -> list[str]:
        """The program's one class whose name a value is named after (`replay_buffer`, `replayBuffer` for
        `ReplayBuffer`); none for a name that is no class's, or that is the class itself."""
        if name[:1].isupper() or "_" not in name and name.islower():
            return []  # `Net(...)`; `buffer`, `model`: a generic word names no particular class
        if self._class_by_normalised is None:
            by_name: dict[str, list[str]] = {}
            for cls in self._classes:
                by_name.setdefault(vocab.normalised_name(cls), []).append(cls)
            self._class_by_normalised = by_name
        found = self._class_by_normalised.get(vocab.normalised_name(name), [])
        return found if len(found) == 1 else []

    def _called_method(self, path: str, class_name: str) -> list[tuple[str, str]]:
        """What calling an instance runs: a network's `forward`, any other class's `__call__`
        (`self.proposal_layer(...)` with `self.proposal_layer = ProposalCreator(self)`)."""
        return self._method(path, class_name, "forward") or self._method(path, class_name, "__call__")

    def _method(self, path: str, class_name: str, method: str, depth: int = 0) -> list[tuple[str, str]]:
        if depth > 6:
            return []
        class_path = self._class_file(path, class_name)
        if class_path is None:
            return []
        class_name = _plain_class(class_name)
        summary = self.files[class_path]
        key = f"{class_name}.{method}"
        if key in summary.functions:
            return [(class_path, key)]
        for base in summary.classes.get(class_name, []):
            found = self._method(class_path, base, method, depth + 1)
            if found:
                return found
        return []

    def _inherited_instances(self, path: str, class_name: str, receiver: str, depth: int = 0
                             ) -> list[tuple[str, str]]:
        """(file, class) of the objects the base classes of `class_name`, in other files, build into `receiver`."""
        if depth > 6:
            return []
        class_path = self._class_file(path, class_name)
        if class_path is None:
            return []
        found: list[tuple[str, str]] = []
        for base in self.files[class_path].classes.get(_plain_class(class_name), []):
            base_path = self._class_file(class_path, base)
            if base_path is None:
                continue
            built = self.files[base_path].instances.get(receiver, ())
            found += [(base_path, cls) for cls in built] if built else self._inherited_instances(
                class_path, base, receiver, depth + 1)
        return found

    def _class_file(self, path: str, class_name: str) -> str | None:
        """The file defining the program class `class_name` as `path` sees it: its own, the one it imports (also
        through `from common.policies import *`), the only one; None when unknown or several could be meant.
        A qualified name (`OurDDPG.DDPG`, `agents.dqn.Agent`) is looked up in the module its head imports; one
        located already (`path::Class`) is where it says."""
        if "::" in class_name:
            where, _, class_name = class_name.partition("::")
            return where if class_name in self.files[where].classes else None
        if "." in class_name:
            head, _, rest = class_name.partition(".")
            module, _, class_name = rest.rpartition(".")
            imported = self.files[path].imports.get(head)
            if imported is None:
                return None
            level, base, name = imported
            qualified = ".".join(part for part in (base, name, module) if part)
            found = self._exported(self._module_file(path, level, qualified), class_name,
                                   lambda summary, n: n in summary.classes)
            return found[0] if found and found[1] == class_name else None
        places = [p for p, _ in self._classes.get(class_name, [])]
        if path in places or len(places) <= 1:
            return path if path in places else (places[0] if places else None)
        summary = self.files[path]
        imported = summary.imports.get(class_name)
        origin = self._module_file(path, imported[0], imported[1]) if imported else self._nearest(path, places)
        if origin is None and not imported:  # `from common.policies import *` naming one of the copies
            starred = {self._module_file(path, level, module) for level, module in summary.star_imports} & set(places)
            origin = next(iter(starred)) if len(starred) == 1 else None
        return origin if origin in places else None  # several classes of that name elsewhere: do not guess

    def _overrides(self, class_name: str, method: str) -> list[tuple[str, str]]:
        """`self.pick_action(state)` in a base class: the subclasses' definitions (a template method:
        `Base_Agent.step` calls what `DQN` or `PPO` provides, whether or not the base defines a default)."""
        key = (class_name, method)
        if key not in self._override_cache:
            self._override_cache[key] = self._find_overrides(class_name, method)
        return self._override_cache[key]

    def _find_overrides(self, class_name: str, method: str) -> list[tuple[str, str]]:
        return [(path, f"{name}.{method}") for path, name in self._subclasses(class_name)
                if f"{name}.{method}" in self.files[path].functions]

    def _subclasses(self, class_name: str) -> list[tuple[str, str]]:
        """(path, class) of the program's classes that inherit from `class_name` (one `NNetWrapper(NeuralNet)` per
        game folder: each counts), found once per class."""
        found = self._subclass_cache.get(class_name)
        if found is None:
            found = self._subclass_cache[class_name] = [
                (path, name) for name, places in self._classes.items() if name != class_name
                for path, _ in places if self._inherits(path, name, class_name)]
        return found

    def _inherits(self, path: str, class_name: str, ancestor: str, depth: int = 0) -> bool:
        bases = self.files[path].classes.get(class_name, [])
        if ancestor in bases:
            return True
        for base in bases:
            places = self._classes.get(base, [])
            if depth < 6 and len(places) == 1 and self._inherits(places[0][0], base, ancestor, depth + 1):
                return True
        return False

    def _returned_functions(self, path: str, fn: FunctionSummary, name: str) -> list[tuple[str, str]]:
        """The nested functions that the calls whose result `name` holds define and return."""
        found = []
        for target, index in fn.results[name]:
            if index is not None:
                continue
            for callee_path, callee_key in self.resolve(path, fn, target):
                returned = self.files[callee_path].functions[callee_key].returns_function
                nested = f"{callee_key}.{returned}"
                if returned is not None and nested in self.files[callee_path].functions:
                    found.append((callee_path, nested))
        return found

    def resolve(self, path: str, fn: FunctionSummary, target: tuple[str, ...]) -> list[tuple[str, str]]:
        """The definitions a call site may run (empty when unknown or ambiguous)."""
        key = (path, fn.key, target)
        if key not in self._resolved:
            self._resolved[key] = []  # while it resolves: `x = x.step()` leads back here
            self._resolved[key] = self._resolve(path, fn, target)
        return self._resolved[key]

    def _resolve(self, path: str, fn: FunctionSummary, target: tuple[str, ...]) -> list[tuple[str, str]]:
        summary = self.files[path]
        kind = target[0]
        if kind == "name":
            name = target[1]
            scope = fn.key.split(".")
            while scope:  # a nested helper, of this function or of one enclosing it
                local = ".".join((*scope, name))
                if local in summary.functions and local != fn.key:
                    return [(path, local)]
                scope.pop()
            found = self._function_in(path, name)
            if not found and (name in summary.classes or name[:1].isupper() and name in self._classes):
                return self._method(path, name, "__init__")  # constructing a program class runs its __init__
            if not found and name in summary.instances:  # `model = GPT(cfg)` then `model(x)`: its forward runs
                found = [m for built in summary.instances[name] if _plain_class(built) in self._classes
                         for m in self._called_method(path, built)]
            if not found and name in fn.params:  # a function passed in: `def search(eval_fn): eval_fn(obs)`
                return self._passed_in.get((path, fn.key, name), [])
            if not found and name in fn.results:  # `train = make_train_fn(G, D)`, then `train(x, y)`
                found = self._returned_functions(path, fn, name)
            return found
        if kind == "self":
            if fn.class_name is None:
                return []
            # the class's own definition (or an inherited one) and, as the object may be a subclass, its overrides:
            # `BaseActor.step` calling `self._transition()` runs `DQNActor._transition` for a DQN actor
            found = self._method(path, fn.class_name, target[1])
            if not found:  # `self._policy(state)` after `self._policy = policy_fn` in `__init__(self, policy_fn)`
                found = self._held_function(path, fn.class_name, target[1])
            if not found:  # `self.model(x)` after `self.model = LlamaModel(config)`: the submodule's forward runs
                found = [m for built in summary.instances.get(f"self.{target[1]}", ())
                         if _plain_class(built) in self._classes for m in self._called_method(path, built)]
            return found + [o for o in self._overrides(fn.class_name, target[1]) if o not in found]
        receiver, method = target[1], target[2]
        if vocab.is_env_step(f"{receiver}.{method}"):
            return self._env_methods()
        if receiver == "super":  # `super().training_losses(...)`: the base classes' definition
            if fn.class_name is None:
                return []
            return [m for base in summary.classes.get(fn.class_name, []) for m in self._method(path, base, method)][:1]
        head = receiver.split(".")[0]
        if head in summary.imports:
            level, module, imported = summary.imports[head]
            base = module if imported is None else (f"{module}.{imported}" if module else imported)
            target_file = self._module_file(path, level, ".".join([base, *receiver.split(".")[1:]]))
            if target_file is not None:
                return self._function_in(target_file, method)
        # `if args.policy == "TD3": policy = TD3.TD3(...) elif ...: policy = DDPG.DDPG(...)`: any of them runs
        found = [m for built in summary.instances.get(receiver, ()) for m in self._method(path, built, method)]
        if not found and receiver.startswith("self.") and fn.class_name is not None:
            # `self.memory.sample(n)` in a subclass, `self.memory = ReplayMemory(...)` in the base class's file
            found = [m for where, built in self._inherited_instances(path, fn.class_name, receiver)
                     for m in self._method(where, built, method)]
        if found:
            return found
        found = self._factory_method(path, fn, receiver, method)
        if found:
            return found
        found = self._attribute_method(path, receiver, method)
        if found:
            return found
        if receiver in fn.params:  # `def run_steps(agent): agent.step()` with callers passing `DQNAgent(config)`
            found = [m for cls in self._objects_in.get((path, fn.key, receiver), ())
                     for m in self._method(path, cls, method)]
            if not found and receiver in fn.param_classes:  # `def evaluate(nn: NeuralNetwork): nn.predict(x)`
                found = self._method(path, fn.param_classes[receiver], method)
            if found:
                return found
        named = receiver.rsplit(".", 1)[-1]
        if named[:1].isupper() and named in self._classes:  # `MCTS(config).run(...)`: built on the spot
            found = self._method(path, named, method)
            if found:
                return found
        for cls in self._classes_named_like(named):  # `self.replay_buffer.sample()` of a `class ReplayBuffer`
            # (that class's own definition only: which subclass the object is, its name does not say)
            found = self._method(path, cls, method)
            if found:
                return found
        if method in _GENERIC_METHODS or method.startswith("__"):
            return []
        candidates = self._methods.get(method, [])
        if path not in self._tests:  # a test's mock (`class MockModel: def predict`) is not what the program runs
            candidates = [(p, k) for p, k in candidates if p not in self._tests]
        if len({(p, k.rsplit('.', 1)[0]) for p, k in candidates}) == 1:
            return candidates
        files = sorted({p for p, _ in candidates})
        # a script calling a method its own classes define means its own (`policy_net.get_action` in sac.py,
        # beside td3.py and ddpg.py that define theirs)
        nearest = path if path in files else self._nearest(path, files)
        beside = [(p, k) for p, k in candidates if p == nearest]
        # an interface method (`NeuralNet.predict`, or an abstract `initial_inference` that the file's networks
        # override): the call runs whichever subclass the object is
        for candidate in beside:
            overrides = self._overrides(candidate[1].rsplit(".", 1)[0], method)
            if all(other == candidate or other in overrides for other in beside):
                return [candidate, *(o for o in overrides if o != candidate)]
        if receiver.startswith("self.") and receiver.count(".") == 1 and fn.class_name is not None:
            # `self.trainer.train(batch)` with `self.trainer = trainer` from `__init__(self, trainer)`: the classes
            # of the objects the program's callers are seen to pass for it (last: some callers may not be seen)
            return [m for built in self._held_objects(path, fn.class_name, receiver[5:])
                    for m in self._method(path, built, method)]
        return []

    def _factory_method(self, path: str, fn: FunctionSummary, receiver: str, method: str) -> list[tuple[str, str]]:
        """`diffusion = create_diffusion(cfg)` then `diffusion.training_losses(...)`, where `create_diffusion` (here
        or in another file) returns `SpacedDiffusion(...)`: the method of the classes the factory builds."""
        found: list[tuple[str, str]] = []
        module = self.files[path].functions.get("<module>")
        for scope in (fn,) if module is None or module is fn else (fn, module):  # a local, else a global
            for target, index in scope.results.get(receiver, ()):
                if index is not None:
                    continue
                for factory_path, factory_key in self.resolve(path, scope, target):
                    factory = self.files[factory_path].functions.get(factory_key)
                    for cls in factory.builds if factory is not None else ():
                        found += [m for m in self._method(factory_path, cls, method) if m not in found]
            if found:
                break
        return found

    def _held_function(self, path: str, class_name: str, attribute: str) -> list[tuple[str, str]]:
        """The functions callers hand the class's constructor for the parameter it keeps in `self.<attribute>`."""
        init = self.files[path].functions.get(f"{class_name}.__init__")
        if init is None:
            return []
        return [found for source in init.copies.get(f"self.{attribute}", ()) if source in init.params
                for found in self._passed_in.get((path, init.key, source), [])]

    def _attribute_method(self, path: str, receiver: str, method: str) -> list[tuple[str, str]]:
        """`trainer.policy_net.get_action(s)` with `trainer = Trainer(...)` and `self.policy_net = Policy(...)` in
        the file that defines `Trainer`: the method of what the owner's attribute holds."""
        head, _, attribute = receiver.partition(".")
        if not attribute or "." in attribute:
            return []
        for owner in self.files[path].instances.get(head, ()):
            owner_file = self._class_file(path, owner)
            for held in self.files[owner_file].instances.get(f"self.{attribute}", ()) if owner_file else ():
                found = self._method(owner_file, held, method)
                if found:
                    return found
        return []

    def _loop_reads(self, path: str, fn: FunctionSummary) -> list[tuple[int, tuple[str, ...]]]:
        """What the function's loops iterate, also through a program generator that re-yields an argument's items
        (`for it, x in enumerate(metric_logger.log_every(data_loader, 10))` iterates `data_loader`)."""
        key = (path, fn.key)
        if key not in self._reads_cache:
            reads = list(fn.loop_reads)
            for loop, target, arguments in fn.call_loops:
                for position in self._yielded_positions(path, fn, target):
                    if position < len(arguments):
                        reads.extend((loop, source) for source in arguments[position])
            self._reads_cache[key] = reads
        return self._reads_cache[key]

    def _yielded_positions(self, path: str, fn: FunctionSummary, target: tuple[str, ...]) -> list[int]:
        """Positions of the call's arguments whose items the called generator re-yields (`self` not counted)."""
        positions = []
        for callee_path, callee_key in self.resolve(path, fn, target):
            callee = self.files[callee_path].functions[callee_key]
            params = self._arguments_of(callee, target)
            if callee.yields_parameter in params:
                positions.append(params.index(callee.yields_parameter))
        return positions

    def _functions_passed_in(self) -> dict[tuple[str, str, str], list[tuple[str, str]]]:
        """(callee path, callee key, parameter) -> the program functions callers pass for it by name:
        `mcts.search(root, eval_fn=evaluate)` makes `eval_fn(obs)` inside `search` a call of `evaluate`."""
        def functions(path: str, summary: FileSummary, fn: FunctionSummary, site: CallSite):
            named = [(slot, found) for slot, name in site.passed for found in self._resolve(path, fn, ("name", name))]
            # a bound method handed on (`MCTSPlayer(self.net.policy_value_fn)`): only names the program defines
            return named + [(slot, found) for slot, dotted in site.references
                            if dotted.rsplit(".", 1)[-1] in self._methods
                            for found in self._resolve(path, fn, _call_target(dotted))]
        found = self._bound_parameters(functions)
        # `MCTSPlayer.__init__(self, fn)` hands its parameter on to `MCTS(fn)`: follow such hops to a fixed point,
        # resolving only the calls that pass on a parameter known to hold a function
        holders = {(path, key) for path, key, _ in found}
        for _ in range(MAX_DEPTH):
            grown = False
            for path, key in list(holders):
                fn = self.files[path].functions[key]
                for site in fn.sites:
                    for slot, name in site.passed:
                        functions_held = found.get((path, key, name), [])
                        if not functions_held:
                            continue
                        for callee in self._resolve(path, fn, site.target):
                            param = self._slot_parameter(callee, site, slot)
                            values = found.setdefault((*callee, param), []) if param is not None else functions_held
                            for function in functions_held:
                                if function not in values:
                                    values.append(function)
                                    holders.add(callee)
                                    grown = True
            if not grown:
                break
        return found

    def _device_parameters(self) -> set[tuple[str, str, str]]:
        """(path, key, parameter) of parameters that every call of their function seen in the program passes a GPU
        tensor for (`log_step(writer, loss, acc, step)` after `loss.backward()`): proven by how the callers made
        the value, so a helper's `writer.add_scalar("loss", loss)` is known to read a GPU value back."""
        calls: dict[tuple[str, str], int] = {}
        # (callee path, key, parameter) -> what each call passes for it: True (a GPU tensor), False (anything else
        # or unknown), or the caller's own parameter handed on (`self.build_targets(p, targets)` in `__call__`)
        passed: dict[tuple[str, str, str], list[bool | tuple[str, str, str]]] = {}
        for path, summary in self.files.items():
            for fn in summary.functions.values():
                for site in fn.sites:
                    handed = dict(site.handed)
                    for callee in self.resolve(path, fn, site.target):
                        calls[callee] = calls.get(callee, 0) + 1
                        for slot in site.slots or ():
                            parameter = self._slot_parameter(callee, site, slot)
                            if parameter is None:
                                continue
                            passed.setdefault((*callee, parameter), []).append(
                                True if slot in site.device_slots
                                else (path, fn.key, handed[slot]) if slot in handed else False)
        complete = {held: values for held, values in passed.items() if len(values) == calls[held[:2]]}
        found = {held for held, values in complete.items() if all(value is True for value in values)}
        for _ in range(MAX_DEPTH):  # parameters handed on, to a fixed point
            grown = {held for held, values in complete.items() if held not in found
                     and all(value is True or value in found for value in values)}
            if not grown:
                break
            found |= grown
        return found

    def _index_parameters(self) -> set[tuple[str, str, str]]:
        """(path, key, parameter) of parameters some call passes a name that says index for (`train_iter(model,
        idx_train)` for `mask_train`): integer indexes, whatever the parameter is called."""
        return {(*callee, parameter) for path, summary in self.files.items() for fn in summary.functions.values()
                for site in fn.sites for slot, name in site.passed if vocab.INDEX_NAME.search(name)
                for callee in self.resolve(path, fn, site.target)
                if (parameter := self._slot_parameter(callee, site, slot)) is not None}

    def _slot_parameter(self, callee: tuple[str, str], site: CallSite, slot: str | int) -> str | None:
        params = self._arguments_of(self.files[callee[0]].functions[callee[1]], site.target)
        param = params[slot] if isinstance(slot, int) and slot < len(params) else slot
        return param if isinstance(param, str) else None

    def _objects_passed_in(self) -> dict[tuple[str, str, str], list[str]]:
        """(callee path, callee key, parameter) -> the program classes whose instances callers pass for it, built
        in the argument (`run_steps(DQNAgent(config))`), bound to the name passed (`agent = A2CAgent(cfg)`, also by
        a factory function: `buffer = utils.ReplayBuffer(...)` returning `StandardBuffer(...)`), or received as a
        parameter and handed on (`def train_bcq(buffer): policy.train(buffer)`), to a fixed point."""
        known: dict[tuple[str, str, str], list[str]] = {}

        def objects(path: str, summary: FileSummary, fn: FunctionSummary, site: CallSite):
            built = [*site.built, *((slot, cls) for slot, name in (*site.passed, *site.references)
                                    for cls in summary.instances.get(name, ()))]  # `play(self.player)` too
            # named as the caller sees it: `MCTSPlayer` of the module the caller imports, not a namesake beside the
            # callee (`mcts_pure.MCTSPlayer` and `mcts_alphaZero.MCTSPlayer`)
            located = [(slot, located) for slot, cls in built for located in self._located_classes(path, cls)]
            return located + [(slot, cls) for slot, name in site.passed if name in fn.params
                              for cls in known.get((path, fn.key, name), ())]
        for _ in range(MAX_DEPTH):
            grown = self._bound_parameters(objects)
            if grown == known:
                break
            known = grown
        return known

    def _located_classes(self, path: str, built: str) -> list[str]:
        """`<file>::<Class>` of what `built(...)` makes as `path` sees it: the class, or those a factory function of
        that name returns."""
        where = self._class_file(path, built)
        if where is not None:
            return [f"{where}::{_plain_class(built)}"]
        module = self.files[path].functions.get("<module>")
        if module is None or "::" in built:
            return []
        found = []
        for factory_path, factory_key in self.resolve(path, module, _call_target(built)):
            for cls in self.files[factory_path].functions[factory_key].builds:
                where = self._class_file(factory_path, cls)
                if where is not None:
                    found.append(f"{where}::{_plain_class(cls)}")
        return found

    def _bound_parameters(self, arguments: Callable[[str, FileSummary, FunctionSummary, CallSite], list[tuple[str | int, T]]]
                          ) -> dict[tuple[str, str, str], list[T]]:
        """(callee path, callee key, parameter) -> what call sites pass for that parameter: `arguments` names, per
        site, the values of interest with their keyword or position."""
        bound: dict[tuple[str, str, str], list[T]] = {}
        for path, summary in self.files.items():
            in_test = path in self._tests
            for fn in summary.functions.values():
                for site in fn.sites:
                    passed = arguments(path, summary, fn, site)
                    if not passed:
                        continue
                    for callee_path, callee_key in self.resolve(path, fn, site.target):
                        if in_test and callee_path not in self._tests:
                            continue  # what a test passes (a mock) says nothing of what the program passes
                        params = self._arguments_of(self.files[callee_path].functions[callee_key], site.target)
                        for slot, value in passed:
                            param = params[slot] if isinstance(slot, int) and slot < len(params) else slot
                            if isinstance(param, str):
                                values = bound.setdefault((callee_path, callee_key, param), [])
                                if value not in values:
                                    values.append(value)
        return bound

    @staticmethod
    def _arguments_of(callee: FunctionSummary, target: tuple[str, ...]) -> tuple[str, ...]:
        """The callee's parameters that positional arguments fill, as a call naming it `target` makes it: a method
        called on an object, a class constructed (`Agent(config)` runs `__init__(self, config)`) or an instance called
        (`compute_loss(pred, targets)` runs `__call__(self, p, targets)`) does not pass `self` itself."""
        bound = callee.class_name is not None and not callee.static and (
            target[0] != "name" or callee.name in ("__init__", "__call__", "forward"))  # `loss_fn(p, t)` of an instance
        return callee.params[1:] if bound else callee.params

    def _env_methods(self) -> list[tuple[str, str]]:
        """The step methods of the program's environment classes and wrappers (what `env.step(a)` runs)."""
        return self._env_steps

    # -- propagation -----------------------------------------------------------------------------

    def _propagate(self) -> None:
        step_functions = self._step_functions = {(path, key) for path, summary in self.files.items()
                                                 for key, fn in summary.functions.items() if fn.steps_at_top}
        rollout_functions = self._rollout_functions = self._wrapping({
            (path, key) for path, summary in self.files.items() for key, fn in summary.functions.items()
            if fn.env_at_top or (fn.network_at_top and fn.seed is Frequency.ONCE)}, step_functions)
        self._trainer_set = self._trainers(step_functions)
        # `if t % train_every == 0: agent.learn(replay)` in a loop: each call is still one training step
        repeated_steps = self._steps_called_in_loops(step_functions)
        handed_on = self._steps_handed_on(step_functions)
        self._rare = self._rarely_called() - repeated_steps - handed_on
        self._rare_rollout: set[tuple[str, str]] = set()
        self._heavy = self._runs_loops_of_its_own()
        # a loader's `collate_fn` runs once per batch
        frontier: list[tuple[str, str, Frequency, int]] = [(*collate, Frequency.PER_STEP, 0)
                                                            for collate in self._collate_functions()]
        # a step method no code of the program calls is called by a framework's learner (`policy._forward_learn(data)`)
        # once per training step: what it calls runs per step
        called = {callee for path, summary in self.files.items() for fn in summary.functions.values()
                  for site in fn.sites for callee in self.resolve(path, fn, site.target)}
        frontier.extend((path, key, Frequency.PER_STEP, 0) for path, key in step_functions - called
                        if self.files[path].functions[key].class_name is not None)
        for path, summary in self.files.items():
            for key, fn in summary.functions.items():
                if fn.seed > Frequency.ONCE:
                    frontier.append((path, key, fn.seed, 0))
                if (path, key) in handed_on:  # called again and again by what it was handed to
                    frontier.append((path, key, Frequency.PER_STEP, 0))
                if (path, key) in repeated_steps:  # one training step per call: what it calls runs per step
                    frontier.extend((*callee, Frequency.PER_STEP, 1) for site in fn.sites if not site.throttled
                                    for callee in self.resolve(path, fn, site.target) if callee != (path, key))
                for site in fn.sites:
                    if site.throttled:
                        continue
                    frequency = site.frequency
                    if frequency is Frequency.ONCE:
                        continue
                    for callee in self.resolve(path, fn, site.target):
                        frontier.append((*callee, self._site_frequency(path, fn, site, step_functions,
                                                                      rollout_functions), 1))
                        if (path, key) in self._rare and self._loop_site_frequency(
                                path, fn, site, step_functions, rollout_functions) >= Frequency.PER_ROLLOUT_STEP:
                            self._rare_rollout.add(callee)  # per step of an evaluation rollout
        while frontier:
            path, key, frequency, depth = frontier.pop()
            fn = self.files[path].functions[key]
            if vocab.OUTPUT_FUNCTION.match(fn.name):
                continue
            current = self.frequency.get((path, key), Frequency.ONCE)
            if frequency <= current:
                continue
            self.frequency[(path, key)] = frequency
            if depth >= MAX_DEPTH:
                continue
            for site in fn.sites:
                if site.throttled:
                    continue
                for callee in self.resolve(path, fn, site.target):
                    if callee != (path, key):
                        frontier.append((*callee, max(frequency, site.frequency), depth + 1))

    def _runs_loops_of_its_own(self) -> set[tuple[str, str]]:
        """Functions that loop over network evaluations or environment steps, themselves or in what they call
        (`sampler.sample(...)` runs fifty denoising steps, `mcts.run(...)` a few hundred simulations): a loop
        calling one is an outer loop (per image, per game), not a rollout loop itself."""
        every = [(path, key, fn) for path, summary in self.files.items() for key, fn in summary.functions.items()]
        acts = {(path, key) for path, key, fn in every if fn.network_at_top or fn.env_at_top}
        heavy = {(path, key) for path, key, fn in every if fn.busy_loops}
        for _ in range(MAX_DEPTH):
            grown = False
            for path, key, fn in every:
                for site in fn.sites:
                    # one environment step is one rollout step, whatever the wrapper does inside (frame skipping)
                    if site.throttled or site.target[0] == "attr" and vocab.is_env_step(".".join(site.target[1:])):
                        continue
                    callees = set(self.resolve(path, fn, site.target))
                    if (path, key) not in acts and not site.loops and callees & acts:
                        acts.add((path, key))  # evaluates a network through a helper
                        grown = True
                    if (path, key) not in heavy and (callees & heavy or site.loops and callees & acts):
                        heavy.add((path, key))
                        grown = True
            if not grown:
                break
        return heavy

    def _steps_called_in_loops(self, step_functions: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Step functions some loop calls, also every few iterations (`if t % 4 == 0: learn()`)."""
        return {callee for path, summary in self.files.items() for fn in summary.functions.values()
                for site in fn.sites if site.loops and site.frequency > Frequency.ONCE
                for callee in self.resolve(path, fn, site.target) if callee in step_functions}

    def _steps_handed_on(self, step_functions: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Step functions handed to another function to call (`fmin_l_bfgs_b(value_loss_and_grad, x0)`: an
        optimizer calls its closure once per iteration)."""
        return {callee for path, summary in self.files.items() for fn in summary.functions.values()
                for site in fn.sites for _, name in site.passed
                for callee in self.resolve(path, fn, ("name", name)) if callee in step_functions}

    def _rarely_called(self) -> set[tuple[str, str]]:
        """Functions the program calls only now and then: every call site it has is throttled (`if step %
        eval_interval == 0: test()`), in an evaluation function, or in another such function. Their loops (a
        pass over validation states, a sampling loop) run many times per call, but the calls are rare."""
        callers: dict[tuple[str, str], list[tuple[tuple[str, str], bool]]] = {}
        for path, summary in self.files.items():
            for key, fn in summary.functions.items():
                for site in fn.sites:
                    for callee in self.resolve(path, fn, site.target):
                        if callee != (path, key):
                            callers.setdefault(callee, []).append(((path, key), site.throttled))
        rare: set[tuple[str, str]] = set()
        changed = True
        while changed:
            changed = False
            for callee, sites in callers.items():
                if callee in rare:
                    continue
                if all(throttled or caller in rare or vocab.EVAL_FUNCTION.match(caller[1].rsplit(".", 1)[-1])
                       for caller, throttled in sites):
                    rare.add(callee)
                    changed = True
        return rare

    def _trainers(self, step_functions: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Functions that train when called: a step, a step loop, or a call of such a function (fixed point)."""
        trainers = set(step_functions) | {(path, key) for path, summary in self.files.items()
                                          for key, fn in summary.functions.items() if fn.has_step_loop}
        changed = True
        while changed:
            changed = False
            for path, summary in self.files.items():
                for key, fn in summary.functions.items():
                    if (path, key) in trainers or key == "<module>":
                        continue
                    if any(not site.throttled and set(self.resolve(path, fn, site.target)) & trainers
                           for site in fn.sites):
                        trainers.add((path, key))
                        changed = True
        return trainers

    def _site_frequency(self, path: str, fn: FunctionSummary, site: CallSite, step_functions: set,
                        rollout_functions: set) -> Frequency:
        """A loop that calls a step function is a step loop; one that calls a rollout step, a rollout loop; a loop
        nested in an update loop (one whose iteration trains: `for update in ...: collect; agent.update()`) runs
        many times per update."""
        if (path, fn.key) in self._rare and site.frequency is not Frequency.PER_STEP:
            return min(site.frequency, Frequency.PER_ITERATION)  # a rare call's loops are not rollouts
        return self._loop_site_frequency(path, fn, site, step_functions, rollout_functions)

    def _loop_site_frequency(self, path: str, fn: FunctionSummary, site: CallSite, step_functions: set,
                             rollout_functions: set) -> Frequency:
        loops = self._loop_calls(path, fn, step_functions, rollout_functions)
        if site.frequency in (Frequency.PER_ITERATION, Frequency.PER_ROLLOUT_STEP) \
                and site.loop not in self.files[path].env_loops \
                and set(self.resolve(path, fn, site.target)) & self._single_steps:
            return Frequency.PER_STEP  # `for _ in range(n): muzero_model.train(batch)`: one training step per call
        if site.frequency is Frequency.PER_ROLLOUT_STEP and site.loop not in self.files[path].env_loops \
                and loops.get(site.loop, _NOTHING)[3]:
            return Frequency.PER_ITERATION  # a network call per image or game, around a sampler or a search
        if site.frequency is not Frequency.PER_ITERATION:
            return site.frequency
        if any(loops.get(outer, _NOTHING)[0] for outer in site.loops[:-1]):
            return Frequency.PER_ROLLOUT_STEP
        _, calls_step, calls_rollout, calls_heavy = loops.get(site.loop, _NOTHING)
        if calls_step:
            return Frequency.PER_STEP
        if calls_rollout and not calls_heavy and site.loop in self.files[path].repeating_loops \
                and site.loop not in fn.around_hot and not vocab.EVAL_FUNCTION.match(fn.name):
            return Frequency.PER_ROLLOUT_STEP  # (a loop around the rollout loop runs once per iteration)
        return Frequency.PER_ITERATION

    def _wrapping(self, evaluations: set[tuple[str, str]], step_functions: set[tuple[str, str]]
                  ) -> set[tuple[str, str]]:
        """`evaluations` (functions that step an environment or evaluate a network once per call) and the helpers
        that call one of them and have no loops of their own (`def expand_leaf(self, node): return
        self.model.dynamics_inference(node.state)`): each call of such a helper is one evaluation too. Not a
        function that trains, loops (a sampler running many steps per call), nor a network's own forward; building
        an object (its `__init__`) is no evaluation."""
        return self._callers_closure(
            evaluations,
            lambda path, fn: (path, fn.key) not in step_functions and fn.seed is Frequency.ONCE
            and not fn.backward_names and not fn.loops and fn.name != "__init__",
            lambda callee: not callee[1].endswith(".__init__"))

    @cached_property
    def _single_steps(self) -> set[tuple[str, str]]:
        """Functions each call of which is one training step: a step function (backward and optimizer step outside
        any loop), or one that calls such a function outside its loops (`def train(self, batch): X = prepare(batch);
        self.backpropagation(self.forward(X))`), to a fixed point."""
        return self._callers_closure(self._step_functions, lambda path, fn: True, lambda callee: True)

    def _callers_closure(self, seeds: set[tuple[str, str]], admits, counts) -> set[tuple[str, str]]:
        """`seeds` and, to a fixed point (MAX_DEPTH rounds), every function `admits(path, fn)` accepts that calls one
        of them (a callee `counts` accepts) outside its loops and unthrottled: what one call of it does once."""
        found = set(seeds)
        for _ in range(MAX_DEPTH):
            grown = {(path, fn.key) for path, summary in self.files.items() for fn in summary.functions.values()
                     if (path, fn.key) not in found and admits(path, fn) and any(
                         not site.loops and not site.throttled and any(
                             callee in found and counts(callee) for callee in self.resolve(path, fn, site.target))
                         for site in fn.sites)}
            if not grown:
                break
            found |= grown
        return found

    def _loop_calls(self, path: str, fn: FunctionSummary, step_functions: set,
                    rollout_functions: set) -> dict[int, tuple[bool, bool, bool, bool]]:
        """loop id -> (calls a trainer, a step function, a rollout function, a function with loops of its own),
        for unthrottled sites directly in each loop of `fn`: one pass over its sites, kept (the sets do not
        change)."""
        key = (path, fn.key)
        found = self._loop_verdicts.get(key)
        if found is None:
            found = {}
            for other in fn.sites:
                if other.throttled or not other.loops:
                    continue
                callees = set(self.resolve(path, fn, other.target))
                trainer, step, rollout, heavy = found.get(other.loop, _NOTHING)
                found[other.loop] = (trainer or bool(callees & self._trainer_set), step or bool(callees & step_functions),
                                     rollout or bool(callees & rollout_functions), heavy or bool(callees & self._heavy))
            self._loop_verdicts[key] = found
        return found

    # -- where a data loader's batches are consumed ------------------------------------------------

    def _is_training_loop(self, path: str, fn: FunctionSummary, loop: int) -> bool:
        if loop in self.files[path].step_loops:
            return True
        trainer, step, _, _ = self._loop_calls(path, fn, self._step_functions, self._rollout_functions).get(
            loop, _NOTHING)
        return trainer or step

    def _parameter(self, callee: tuple[str, str], slot: str | int) -> str | None:
        """The parameter of `callee` that an argument in `slot` (position or keyword) binds to."""
        params = self.files[callee[0]].functions[callee[1]].params
        if isinstance(slot, str):
            return slot if slot in params else None
        if self.files[callee[0]].functions[callee[1]].class_name is not None and params[:1] in (("self",), ("cls",)):
            params = params[1:]
        return params[slot] if slot < len(params) else None

    @cached_property
    def _feeding_training(self) -> set[tuple[str, str, str]]:
        return self._names_feeding_training()

    def _names_feeding_training(self) -> set[tuple[str, str, str]]:
        """(path, function key, name) of the names whose value a training-step loop iterates: directly
        (`for x, y in train_loader:`), through a parameter of a function that does (`train(model, loader)`, in
        any file), or through an attribute that another method of the class iterates (`self.loader = loader`)."""
        seeds = {(path, fn.key, source[1]) for path, summary in self.files.items()
                 for fn in summary.functions.values() for loop, source in self._loop_reads(path, fn)
                 if source[0] == "value" and self._is_training_loop(path, fn, loop)}
        return self._through_calls(seeds)[0]

    def _batch_parameters(self) -> set[tuple[str, str, str]]:
        """(path, function key, parameter) of the parameters that receive part of a batch a loop takes from a
        data loader or from the data a training loop iterates (`for x, y in loader: loss = calc_loss(x, y)`),
        in any file, also through helpers that hand their parameter on. Not from loops of files a loader whose
        `collate_fn` moves its batches to a device may reach (a batch there may already be on the GPU)."""
        device_fed = self._fed_device_batches()
        feeding = self._feeding_training
        # an item of a batch (`step(data[0])`) counts where no loader of the program may deliver device batches
        items_count = not any(summary.device_loaders for summary in self.files.values())
        found: set[tuple[str, str, str]] = set()
        for _ in range(MAX_DEPTH):
            grown = set()
            for path, summary in self.files.items():
                for fn in summary.functions.values():
                    batch_loops = set() if path in device_fed else {
                        loop for loop, source in self._loop_reads(path, fn)
                        if loop in summary.loader_loops or source[0] == "value"
                        and self._feeds(path, summary, fn, source[1], feeding)}
                    for site in fn.sites:
                        items = {name for loop in site.loops if loop in batch_loops
                                 for name in fn.loop_targets.get(loop, ())}
                        for slot, name in (*site.passed, *(site.parts if items_count else ())):
                            if name not in items and (path, fn.key, name) not in found:
                                continue
                            for callee in self.resolve(path, fn, site.target):
                                parameter = self._parameter(callee, slot)
                                if parameter is not None and (*callee, parameter) not in found:
                                    grown.add((*callee, parameter))
            if not grown:
                break
            found |= grown
        return found

    def _results_read_back(self) -> set[tuple[str, str]]:
        """Functions every caller of which only reads the result back to the host (`a = self.actor.get_action(s);
        return a.detach().cpu().numpy()`): what they return never feeds a backward."""
        verdicts: dict[tuple[str, str], bool] = {}
        for path, summary in self.files.items():
            for fn in summary.functions.values():
                for site in fn.sites:
                    for callee in self.resolve(path, fn, site.target):
                        verdicts[callee] = verdicts.get(callee, True) and site.read_back
        return {callee for callee, read_back in verdicts.items() if read_back}

    def _tensor_helpers(self) -> set[tuple[str, str]]:
        """The tensor helpers whose plain-name calls are all tensor helpers too, or `len`/`max`-like builtins
        (`evaluate_model` calling a looping `calc_loss_loader` is not one), to a fixed point."""
        helpers = {(path, key) for path, summary in self.files.items()
                   for key, fn in summary.functions.items() if fn.tensor_helper}
        while True:
            dropped = {(path, key) for path, key in helpers if not all(
                name in _PLAIN_BUILTINS or (resolved := self.resolve(path, self.files[path].functions[key],
                                                                     ("name", name)))
                and all(callee in helpers for callee in resolved)
                for name in self.files[path].functions[key].plain_calls)}
            if not dropped:
                return helpers
            helpers -= dropped

    def _collate_functions(self) -> set[tuple[str, str]]:
        """The program functions given to a DataLoader as `collate_fn` (directly or through `partial`)."""
        found = set()
        for path, summary in self.files.items():
            module = summary.functions["<module>"]
            for name in summary.collate_functions:
                function = summary.partials.get(name, (name, False))[0]
                scope = summary.functions.get(summary.collate_scopes.get(name, "<module>"), module)
                if function:
                    found.update(self.resolve(path, scope, ("name", function)))
        return found

    def _fed_device_batches(self) -> set[str]:
        """Files whose loaders may deliver batches on a device: those building a DataLoader whose `collate_fn`
        moves its batch (`partial(collate, device=d)`, a collate function calling `.to(...)`), and the files they
        import (whose training loops they hand such a loader)."""
        moving = {fn.name for summary in self.files.values() for fn in summary.functions.values() if fn.moves_to_device}
        found = set()
        for path, summary in self.files.items():
            partials = [summary.partials[name] for name in summary.collate_functions if name in summary.partials]
            if summary.device_collate or any(device or function in moving for function, device in partials) \
                    or summary.collate_functions & moving:
                found.add(path)
                found.update(filter(None, (self._module_file(path, level, module)
                                           for level, module, _ in summary.imports.values())))
        return found

    def _names_trained_on(self) -> set[tuple[str, str, str]]:
        """(path, function key, name) of the names backpropagated: directly, as an operand of a backpropagated sum
        (`loss = pi_loss + v_loss`), or through a parameter of a function that backpropagates it
        (`take_optimisation_step(optimizer, net, loss)`)."""
        trained = set()
        for path, summary in self.files.items():
            for fn in summary.functions.values():
                names = set(fn.backward_names)
                for name in list(names):
                    names |= fn.operands.get(name, set())
                trained |= {(path, fn.key, name) for name in names}
        return self._through_calls(trained)[0]

    def _names_iterated_repeatedly(self) -> set[tuple[str, str, str]]:
        """(path, function key, name) of the names whose one value is iterated again and again (once per epoch):
        by a loop nested in another loop, by a function called in a loop with the same object (`for epoch in
        ...: evaluate(model, val_loader)`), or, for a module-level loader, by a function the program repeats
        (`def train(epoch): for b in train_loader`). A loader built anew on each pass is not."""
        once = {(path, fn.key, source[1]) for path, summary in self.files.items()
                for fn in summary.functions.values() for loop, source in self._loop_reads(path, fn) if source[0] == "value"}
        repeated = {(path, fn.key, source[1]) for path, summary in self.files.items()
                    for fn in summary.functions.values() for loop, source in self._loop_reads(path, fn)
                    if source[0] == "value" and loop in summary.nested_loops and source[1] not in fn.rebound_in_loops}
        # an attribute iterated by a method the program repeats (`self.loader` in `train_epoch`) persists
        repeated |= {(path, fn.key, source[1]) for path, summary in self.files.items()
                     for fn in summary.functions.values() for loop, source in self._loop_reads(path, fn)
                     if source[0] == "value" and source[1].startswith("self.") and source[1] not in fn.results
                     and self.frequency.get((path, fn.key), Frequency.ONCE) >= Frequency.PER_ITERATION}
        once, repeated = self._through_calls(once, repeated)
        for path, summary in self.files.items():
            module = summary.functions["<module>"]
            for name in module.results.keys() | module.copies.keys():
                if any((path, fn.key, name) in once and self.frequency.get((path, fn.key), Frequency.ONCE)
                       >= Frequency.PER_ITERATION for fn in summary.functions.values()
                       if name not in fn.params and name not in fn.results and name not in fn.copies):
                    repeated.add((path, "<module>", name))
        return repeated

    def _through_calls(self, feeding: set[tuple[str, str, str]], repeated: set[tuple[str, str, str]] | None = None
                       ) -> tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]:
        """Grow `feeding` to the callers' names passed to its parameters and to the names copied into it, to a
        fixed point; with `repeated`, also grow that set: a name passed from inside a loop (and not rebuilt
        there) to a parameter in `feeding`, or passed to one in `repeated`."""
        feeding, repeated = set(feeding), set(repeated or ())
        every = [(path, summary, fn) for path, summary in self.files.items() for fn in summary.functions.values()]
        for _ in range(MAX_DEPTH):
            grown, grown_repeated = set(), set()
            for path, summary, fn in every:
                for site in fn.sites:
                    for slot, name in site.passed:
                        callees = [(*callee, self._parameter(callee, slot))
                                   for callee in self.resolve(path, fn, site.target)]
                        if (path, fn.key, name) not in feeding and any(c in feeding for c in callees):
                            grown.add((path, fn.key, name))
                        if (path, fn.key, name) not in repeated and any(
                                c in repeated or c in feeding and site.loops and name not in fn.rebound_in_loops
                                for c in callees):
                            grown_repeated.add((path, fn.key, name))
                for target, sources in fn.copies.items():
                    if self._feeds(path, summary, fn, target, feeding):
                        grown |= {(path, fn.key, source) for source in sources} - feeding
                    if self._feeds(path, summary, fn, target, repeated):
                        grown_repeated |= {(path, fn.key, source) for source in sources} - repeated
            if not grown and not grown_repeated:
                break
            feeding |= grown
            repeated |= grown_repeated
        return feeding, repeated

    @staticmethod
    def _feeds(path: str, summary: FileSummary, fn: FunctionSummary, name: str,
               feeding: set[tuple[str, str, str]]) -> bool:
        if (path, fn.key, name) in feeding:
            return True
        if fn.key == "<module>":  # a global that a function of the file reads (`def train(epoch): for b in loader`)
            return any((path, other.key, name) in feeding for other in summary.functions.values()
                       if name not in other.params and name not in other.results and name not in other.copies)
        return name.startswith("self.") and fn.class_name is not None and any(
            (path, other.key, name) in feeding for other in summary.functions.values()
            if other.class_name == fn.class_name)

    def _loader_markers(self) -> dict[str, set[str]]:
        """path -> `<key>#returns-trained` for functions whose result a caller backpropagates, and markers for the
        per-file loader flow: `<key>#returns-training-data` (or `...-data<n>` for
        element n of a returned tuple) when what the function returns is iterated by a training loop somewhere
        in the program (`#returns-epoch-data...` when that loop runs once per epoch), and
        `<key>#passes-training-data:<callee>:<slot>` (`#passes-epoch-data:...`) when the function passes a value
        to a parameter that is; `<key>#passes-iterated-data:<callee>:<slot>` when a loop of the function passes a
        value to a parameter the callee iterates."""
        markers: dict[str, set[str]] = {}
        trained = self._names_trained_on()
        iterated = {(path, fn.key, source[1]) for path, summary in self.files.items()
                    for fn in summary.functions.values() for _, source in self._loop_reads(path, fn) if source[0] == "value"}
        for path, summary in self.files.items():  # `loss = self.compute_loss(...)`, then backpropagated
            for fn in summary.functions.values():
                for name, calls in fn.results.items():
                    if (path, fn.key, name) in trained:
                        for target, _ in calls:
                            for callee_path, callee_key in self.resolve(path, fn, target):
                                markers.setdefault(callee_path, set()).add(f"{callee_key}#returns-trained")
        for kind, feeding in (("training", self._feeding_training),
                              ("epoch", self._names_iterated_repeatedly())):
            for path, summary in self.files.items():
                for fn in summary.functions.values():
                    # (a loader built again on every pass, `for b in make_loader(ds)` or rebound in the loop, is not
                    # the same loader re-iterated: no epoch marker)
                    returned = [calls for name, calls in fn.results.items()
                                if self._feeds(path, summary, fn, name, feeding)
                                and not (kind == "epoch" and name in fn.rebound_in_loops)]
                    if kind == "training":
                        returned.append([(source[1:], None) for loop, source in self._loop_reads(path, fn)
                                         if source[0] == "call" and self._is_training_loop(path, fn, loop)])
                    for target, index in (pair for calls in returned for pair in calls):
                        for callee_path, callee_key in self.resolve(path, fn, target):
                            markers.setdefault(callee_path, set()).add(
                                f"{callee_key}#returns-{kind}-data{'' if index is None else index}")
                    for site in fn.sites:
                        for slot, name in site.passed:
                            callees = self.resolve(path, fn, site.target)
                            if any((*callee, self._parameter(callee, slot)) in feeding for callee in callees):
                                markers.setdefault(path, set()).add(
                                    f"{fn.key}#passes-{kind}-data:{site.target[-1]}:{slot}")
                            elif kind == "epoch" and site.loops and name not in fn.rebound_in_loops and any(
                                    (*callee, self._parameter(callee, slot)) in iterated for callee in callees):
                                # `for epoch in ...: train_one_epoch(model, train_loader)`: the loop here hands the
                                # loader, pass after pass, to a function that iterates it (the per-file flow checks
                                # that its own call is in a loop)
                                markers.setdefault(path, set()).add(
                                    f"{fn.key}#passes-iterated-data:{site.target[-1]}:{slot}")
        return markers

    def by_file(self) -> dict[str, dict[str, Frequency]]:
        """path -> {function key -> frequency} for the functions that run more than once (from their callers),
        and {loop key -> frequency} for loops that are step or rollout loops by what their calls resolve to
        (`for _ in range(sims): prior, value = evaluate(state)` with `evaluate` a network evaluation passed in).
        A loop key is `<function key>#loop<n>`, n counting the function's loops in source order; a function the
        program calls only now and then gets `<function key>#rare`, one called per step of such a function's
        rollout (an evaluation episode) `<function key>#rare-rollout`, a loader's `collate_fn` that moves nothing to
        a device `<function key>#collate`, a generator re-yielding a parameter's items
        `<function key>#yields-parameter:<parameter>`, and one that trains when called (itself or
        through what it calls, in any file) `<function key>#trains` (`<module>#trains`: the script's top level).
        A function that calls a helper uploading its argument to a device gets `<function key>#uploads:<name>`, one
        that calls a helper reading its argument back to the host `<function key>#downloads:<name>`, one that calls
        a method writing every argument into NumPy arrays (`buffer.store(obs, val)`)
        `<function key>#stores-to-host:<name>`, one that calls a sampler returning tensors built on the host `<function key>#host-batch:<name>`, one that calls a
        function returning a torch factory's new CPU tensor `<function key>#host-factory:<name>`, one that calls a helper
        returning its tensor argument moved to a device `<function key>#moves-argument:<name>`, one that calls a function
        returning a value it backpropagated `<function key>#loss-result:<name>:<tuple position, or nothing>`, one
        that calls a tensor helper (its result lives where its arguments do) `<function key>#same-device:<name>`, one whose
        parameter receives part of a loader's batch `<function key>#batch-parameter:<parameter>`, one whose
        parameter defaulting to the CPU its callers pass a value for `<function key>#device-passed:<parameter>`,
        one whose parameter its callers pass what an environment returned `<function key>#env-parameter:<parameter>`,
        one that hands a helper an argument the helper reads back to the host (`logger.log("loss", loss)` with
        `value.item()` inside) `<function key>#reads-argument:<name>:<position or keyword>`, one whose parameter
        its callers pass a flag set every N steps (`vis_result = step % k == 0`) `<function key>#throttle-flag:<name>`,
        one every call of which passes only Python numbers `<function key>#numbers-only`,
        a class whose `__init__` keeps in `self.<attr>` an instance its callers pass of a program class
        `<class>#holds:<attr>:<that class>`,
        one looping over a program generator that re-yields an argument's items `<function key>#yields-argument:
        <callee name>:<position>`, one whose result every caller only reads back to the host
        `<function key>#returns-read-back` (and, in its
        callers, `<caller key>#evaluates-read-back:<name>`: the callee is judged where it runs the network)."""
        found: dict[str, dict[str, Frequency]] = {}
        for (path, key), frequency in self.frequency.items():
            found.setdefault(path, {})[key] = frequency
        step_functions, rollout_functions = self._step_functions, self._rollout_functions
        for path, summary in self.files.items():
            for fn in summary.functions.values():
                by_loop: dict[int, list[CallSite]] = {}
                for site in fn.sites:
                    if site.loops and not site.throttled and site.frequency in (Frequency.PER_ITERATION,
                                                                                Frequency.PER_ROLLOUT_STEP):
                        by_loop.setdefault(site.loop, []).append(site)
                verdicts = self._loop_calls(path, fn, step_functions, rollout_functions) if by_loop else {}
                for index, loop in enumerate(fn.loops):
                    frequency = max((self._site_frequency(path, fn, site, step_functions, rollout_functions)
                                     for site in by_loop.get(loop, ())), default=Frequency.ONCE)
                    if frequency >= Frequency.PER_ROLLOUT_STEP:
                        found.setdefault(path, {})[f"{fn.key}#loop{index}"] = frequency
                    elif verdicts.get(loop, _NOTHING)[3]:
                        found.setdefault(path, {})[f"{fn.key}#loop{index}#outer"] = Frequency.ONCE
        for path, key in self._trainer_set:
            found.setdefault(path, {})[f"{key}#trains"] = Frequency.PER_STEP
        for path, summary in self.files.items():  # generators re-yielding a parameter's items (`infiniteloop(dl)`)
            for fn in summary.functions.values():
                if fn.yields_parameter is not None:
                    found.setdefault(path, {})[f"{fn.key}#yields-parameter:{fn.yields_parameter}"] = Frequency.ONCE
        for path, key in self._collate_functions():  # batches assembled on the host (in the loader's workers)
            if not self.files[path].functions[key].moves_to_device:
                found.setdefault(path, {})[f"{key}#collate"] = Frequency.ONCE
        for path, summary in self.files.items():  # a script whose top level starts the (imported) training
            module = summary.functions["<module>"]
            if any(not site.throttled and set(self.resolve(path, module, site.target)) & self._trainer_set
                   for site in module.sites):
                found.setdefault(path, {})["<module>#trains"] = Frequency.PER_STEP
        for path, markers in self._loader_markers().items():
            found.setdefault(path, {}).update(dict.fromkeys(markers, Frequency.PER_STEP))
        read_back = self._results_read_back()
        for path, key in read_back:
            found.setdefault(path, {})[f"{key}#returns-read-back"] = Frequency.ONCE
        for path, summary in self.files.items():  # the callers of such functions, by the name they call
            for fn in summary.functions.values():
                for site in fn.sites:
                    callees = self.resolve(path, fn, site.target)
                    # (only where the callee is judged itself: run per rollout step, not a network's forward)
                    if callees and all(callee in read_back and not callee[1].endswith((".forward", ".__call__"))
                                       and self.frequency.get(callee, Frequency.ONCE) >= Frequency.PER_ROLLOUT_STEP
                                       for callee in callees):
                        found.setdefault(path, {})[f"{fn.key}#evaluates-read-back:{site.target[-1]}"] = Frequency.ONCE
        for (path, key, parameter), classes in self._objects_in.items():  # `self.policy = policy` in `__init__`
            init = self.files[path].functions.get(key)
            if init is None or init.class_name is None or init.name != "__init__":
                continue
            for target, sources in init.copies.items():
                if target.startswith("self.") and target.count(".") == 1 and parameter in sources:
                    for built in classes:
                        found.setdefault(path, {})[f"{init.class_name}#holds:{target[5:]}:{built}"] = Frequency.ONCE
        for path, key, parameter in self._batch_parameters():
            found.setdefault(path, {})[f"{key}#batch-parameter:{parameter}"] = Frequency.ONCE
        for path, key, parameter in self._device_parameters():
            found.setdefault(path, {})[f"{key}#device-parameter:{parameter}"] = Frequency.ONCE
        for path, key, parameter in self._index_parameters():
            found.setdefault(path, {})[f"{key}#index-parameter:{parameter}"] = Frequency.ONCE
        passed = {pair for summary in self.files.values() for pair in summary.arguments_passed}
        for path, summary in self.files.items():  # `def collate(batch, device="cpu")` given a device by its callers
            for fn in summary.functions.values():
                bound = 1 if fn.class_name is not None and fn.params[:1] in (("self",), ("cls",)) else 0
                for position, parameter in fn.cpu_defaults:
                    if (fn.name, parameter) in passed or position >= bound and (fn.name, position - bound) in passed:
                        found.setdefault(path, {})[f"{fn.key}#device-passed:{parameter}"] = Frequency.ONCE
        tensor_helpers = self._tensor_helpers()
        given_numbers: dict[tuple[str, str], bool] = {}  # callee -> every call of it passes only Python numbers
        for path, summary in self.files.items():  # `tensor(batch.state)`, `to_np(q)`: uploading / reading helpers
            for fn in summary.functions.values():
                for site in fn.sites:
                    resolved = self.resolve(path, fn, site.target)
                    callees = [self.files[p].functions[k] for p, k in resolved]
                    if any(callee.uploads for callee in callees):
                        found.setdefault(path, {})[f"{fn.key}#uploads:{site.target[-1]}"] = Frequency.ONCE
                    if any(callee.downloads for callee in callees):
                        found.setdefault(path, {})[f"{fn.key}#downloads:{site.target[-1]}"] = Frequency.ONCE
                    if callees and all(callee.stored_into and callee.stored_into <= self.files[p].numpy_arrays.get(
                            callee.class_name or "", set()) for (p, _), callee in zip(resolved, callees)):
                        found.setdefault(path, {})[f"{fn.key}#stores-to-host:{site.target[-1]}"] = Frequency.ONCE
                    if callees and all(callee.returns_host for callee in callees):
                        found.setdefault(path, {})[f"{fn.key}#host-batch:{site.target[-1]}"] = Frequency.ONCE
                    if callees and all(callee.returns_factory for callee in callees):
                        found.setdefault(path, {})[f"{fn.key}#host-factory:{site.target[-1]}"] = Frequency.ONCE
                    if callees and all(callee.moves_parameter for callee in callees):
                        found.setdefault(path, {})[f"{fn.key}#moves-argument:{site.target[-1]}"] = Frequency.ONCE
                    for callee in resolved:
                        given_numbers[callee] = given_numbers.get(callee, True) and site.numbers_only
                    for position in set.intersection(*(set(c.returns_losses) for c in callees)) if callees else ():
                        found.setdefault(path, {})[
                            f"{fn.key}#loss-result:{site.target[-1]}:{'' if position is None else position}"] = \
                            Frequency.ONCE
                    if callees and all(callee.reads_params for callee in callees):
                        for slot, _ in site.passed:
                            if all(self._slot_parameter(key, site, slot) in callee.reads_params
                                   for key, callee in zip(resolved, callees)):
                                found.setdefault(path, {})[f"{fn.key}#reads-argument:{site.target[-1]}:{slot}"] = \
                                    Frequency.ONCE
                    for slot in site.observed:  # `agent.act(obs)` with `obs` from `env.step(...)`
                        for callee_path, callee_key in resolved:
                            parameter = self._slot_parameter((callee_path, callee_key), site, slot)
                            if parameter is not None:
                                found.setdefault(callee_path, {})[f"{callee_key}#env-parameter:{parameter}"] = \
                                    Frequency.ONCE
                    for slot, name in site.passed:  # `update(batch, vis_result)` with `vis_result = step % k == 0`
                        if name in fn.throttle_flags:
                            for (callee_path, callee_key), callee in zip(resolved, callees):
                                parameter = self._slot_parameter((callee_path, callee_key), site, slot)
                                if parameter is not None:
                                    found.setdefault(callee_path, {})[
                                        f"{callee_key}#throttle-flag:{parameter}"] = Frequency.ONCE
                    # (a network's forward is no tensor helper: its outputs live where its weights are)
                    helpers = [key in tensor_helpers and not callee.returns_host and callee.name != "forward"
                               for key, callee in zip(resolved, callees)]
                    if any(helpers) and all(helper or callee.abstract for helper, callee in zip(helpers, callees)):
                        found.setdefault(path, {})[f"{fn.key}#same-device:{site.target[-1]}"] = Frequency.ONCE
        for (path, key), numbers in given_numbers.items():  # `metric_logger.update(loss=loss_value)` everywhere
            if numbers:
                found.setdefault(path, {})[f"{key}#numbers-only"] = Frequency.ONCE
        for path, summary in self.files.items():  # `for b in logger.log_every(loader, 10)`: re-yields `loader`'s items
            for fn in summary.functions.values():
                for _, target, _ in fn.call_loops:
                    for position in self._yielded_positions(path, fn, target):
                        found.setdefault(path, {})[f"{fn.key}#yields-argument:{target[-1]}:{position}"] = \
                            Frequency.ONCE
        for path, key in self._rare:
            found.setdefault(path, {})[f"{key}#rare"] = Frequency.ONCE
        for path, key in self._rare_rollout:
            if self.frequency.get((path, key), Frequency.ONCE) >= Frequency.PER_ROLLOUT_STEP:
                continue
            found.setdefault(path, {})[f"{key}#rare-rollout"] = Frequency.PER_ROLLOUT_STEP
        return found

    def step_names(self) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
        """Names of functions doing one training step per call, of those doing one rollout step per call, and
        of those that train when called."""
        steps, rollouts = set(), set()
        trainers = {self.files[path].functions[key].name for path, key in self._trainer_set}
        for summary in self.files.values():
            for fn in summary.functions.values():
                if fn.name in _AMBIGUOUS_STEP_NAMES or fn.name.startswith("__"):
                    continue
                if fn.steps_at_top:
                    steps.add(fn.name)
                elif fn.env_at_top or (fn.network_at_top and fn.seed is Frequency.ONCE):
                    rollouts.add(fn.name)
        return frozenset(steps), frozenset(rollouts), frozenset(trainers - _AMBIGUOUS_STEP_NAMES)


def call_graph_state(sources: dict[str, str], module_classes: frozenset[str]) -> tuple:
    """What a run keeps of the program's call graph (small, picklable): the frequencies by file and the step
    names. Needs no libcst: the runner builds it in a child forked before libcst is imported."""
    graph = CallGraph(sources, module_classes)
    return graph.by_file(), graph.step_names()
