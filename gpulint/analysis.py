"""Shared analyses every rule may ask for (catalog §0.3), computed once per file in one pre-pass.

- import/alias resolution to qualified names,
- bindings per scope (what each local name was assigned, in source order),
- nn.Module subclasses, hot regions (forward, compiled functions, training-step loops, step functions),
- CUDA-target / CPU-source / tensor evidence, bool-mask expressions, scalar literals.

Everything here is syntactic and flow-insensitive except where noted; rules must stay on the safe side
of "unknown".
"""

from __future__ import annotations

import enum
import inspect
import typing
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Sequence, TypeVar

import libcst as cst

from gpulint.semantic import vocab
from gpulint.semantic.callgraph import Frequency, ProgramCalls

# ---------------------------------------------------------------------------------------------
# small syntax helpers


def dotted_name(node: cst.BaseExpression | None) -> str | None:
    """`a.b.c` for Name/Attribute chains, else None."""
    parts: list[str] = []
    while type(node) is cst.Attribute:
        parts.append(node.attr.value)  # type: ignore[union-attr]
        node = node.value  # type: ignore[union-attr]
    if type(node) is cst.Name:
        parts.append(node.value)  # type: ignore[union-attr]
        return ".".join(reversed(parts))
    return None


def string_value(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:  # noqa: BLE001 - odd prefixes; treat as unknown
            return None
        return value if isinstance(value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        left, right = string_value(node.left), string_value(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, cst.FormattedString) and all(isinstance(p, cst.FormattedStringText) for p in node.parts):
        return "".join(p.value for p in node.parts)  # `f"b h i d, b h j d -> b h i j"`: no placeholder
    return None


def string_key(node: cst.BaseExpression) -> str | None:
    """`"loss_mask"` of `samples["loss_mask"]`: the one string a subscript indexes with."""
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        return string_value(node.slice[0].slice.value)
    return None


def is_numeric_literal(node: cst.BaseExpression) -> bool:
    """Numbers, `True`/`False`, and (nested, possibly empty) lists/tuples of them: data written in the source."""
    while isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        node = node.expression
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.Name):
        return node.value in ("True", "False")
    if isinstance(node, (cst.List, cst.Tuple)):
        return all(not isinstance(e, cst.StarredElement) and is_numeric_literal(e.value) for e in node.elements)
    return False


def call_arg(call: cst.Call, keyword: str, position: int | None = None) -> cst.Arg | None:
    """The argument bound to `keyword`, or the positional one at `position`."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
    if position is not None:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if len(positional) > position:
            return positional[position]
    return None


def has_star_args(call: cst.Call) -> bool:
    return any(arg.star for arg in call.args)


_DEVICE_VARIABLE = re.compile(r"_?(device|dev)")


def _is_cpu_device(value: cst.BaseExpression) -> bool:
    """`"cpu"` or `torch.device("cpu")`."""
    if isinstance(value, cst.Call) and dotted_name(value.func) in ("torch.device", "device") and value.args:
        value = value.args[0].value
    return string_value(value) == "cpu"


def method_name(call: cst.Call) -> str | None:
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def is_true(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


_VISITED_FIELD = re.compile(r'visit_\w+\(\s*self,\s*"(\w+)"')
# Whitespace, comments, brackets, punctuation and operator tokens: no rule or analysis visits them (operators are
# read through their parent's fields, e.g. `node.operator`), and they are a third of all nodes.
_TOKEN_TYPES = (cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline, cst.Comment,
                cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
                cst.RightCurlyBrace, cst.Comma, cst.Dot, cst.Colon, cst.Semicolon, cst.AssignEqual,
                cst.BaseBinaryOp, cst.BaseUnaryOp, cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseAugOp,
                cst.ImportStar, cst.Asynchronous)
_FIELD_ORDER: dict[type, tuple[str, ...]] = {}


def _holds_syntax(annotation: object) -> bool:
    """Whether a field annotated so can hold a node other than a token (`Sequence[Arg]`, `BaseExpression`)."""
    if isinstance(annotation, type):
        return issubclass(annotation, cst.CSTNode) and not issubclass(annotation, _TOKEN_TYPES)
    return any(_holds_syntax(arg) for arg in getattr(annotation, "__args__", ()))


def _field_order(cls: type) -> tuple[str, ...]:
    """The fields of a node class that can hold syntax, in the order libcst itself visits them (source order: a
    def's decorators before its name, an `a if c else b`'s body before its test), read once per class from
    libcst's own `_visit_and_replace_children`; dataclass order, all fields, where that cannot be read."""
    order = _FIELD_ORDER.get(cls)
    if order is None:
        fields = list(cls.__dataclass_fields__)
        try:
            visited = _VISITED_FIELD.findall(inspect.getsource(cls._visit_and_replace_children))
            hints = typing.get_type_hints(cls)
            fields = [f for f in dict.fromkeys([*visited, *fields]) if f in fields and _holds_syntax(hints.get(f))]
        except (OSError, TypeError, NameError):
            pass
        order = _FIELD_ORDER[cls] = tuple(fields)
    return order


def child_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Direct children in source order; reading dataclass fields is much cheaper than libcst's `.children`.
    Remembered for the tree being analysed, which analyses and rules walk several times (callers must not
    change the list)."""
    remembered = _CHILDREN.get(id(node))
    if remembered is not None and remembered[0] is node:
        return remembered[1]
    found: list[cst.CSTNode] = []
    for name in _field_order(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            found.extend(item for item in value if is_node_type(type(item)))
        elif is_node_type(kind):
            found.append(value)
    _CHILDREN[id(node)] = (node, found)
    return found


# id -> (node, children) for the tree being analysed: the node is kept with its children so that an id reused by
# a later object can never return another node's children. Emptied when the next tree is analysed.
_CHILDREN: dict[int, tuple[cst.CSTNode, list[cst.CSTNode]]] = {}
_NODE_TYPES: dict[type, bool] = {}


def is_node_type(kind: type) -> bool:
    """`issubclass(kind, CSTNode)`, remembered: CSTNode is an ABC, whose isinstance checks are slow."""
    known = _NODE_TYPES.get(kind)
    if known is None:
        known = _NODE_TYPES[kind] = issubclass(kind, cst.CSTNode)
    return known


def traverse(root: cst.CSTNode, on_visit: Callable[[cst.CSTNode], bool | None],
             on_leave: Callable[[cst.CSTNode], None]) -> None:
    """Visit `root`'s tree as libcst's `visit` does (on_visit returning False skips the children; on_leave runs
    after them), without rebuilding every node on the way up, which is what makes libcst's own walk slow.
    Iterative, so deeply nested expressions cannot hit the recursion limit. Tokens are not visited."""
    pending: list[tuple[cst.CSTNode, bool]] = [(root, False)]
    while pending:
        node, children_done = pending.pop()
        if children_done:
            on_leave(node)
            continue
        descend = on_visit(node)
        pending.append((node, True))
        if descend is not False:
            pending.extend((child, False) for child in reversed(child_nodes(node)))


# exact types (libcst's node classes are final): an isinstance check against them goes through ABCMeta, slowly
_NESTED_SCOPES = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})


def walk(node: cst.CSTNode, *, into_functions: bool = False) -> Iterator[cst.CSTNode]:
    """`node` and everything below it, not descending into nested defs/lambdas/classes unless asked."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if current is not node and not into_functions and type(current) in _NESTED_SCOPES:
            continue
        yield current
        stack.extend(reversed(child_nodes(current)))


def iter_calls(node: cst.CSTNode, *, into_functions: bool = False) -> Iterator[cst.Call]:
    return (n for n in walk(node, into_functions=into_functions) if type(n) is cst.Call)  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# bindings


def _unwrapped_iterable(node: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """`loader` in `enumerate(tqdm(iter(loader)))`."""
    while isinstance(node, cst.Call) and node.args and (dotted_name(node.func) or "").rsplit(".", 1)[-1] in (
            "enumerate", "tqdm", "iter"):
        node = node.args[0].value
    return node


# wrappers that return a loader whose batches arrive on the device (Lightning Fabric, Hugging Face Accelerate)
# the legacy typed constructors build CPU tensors (`torch.cuda.FloatTensor` is the CUDA family)
LEGACY_HOST_TENSOR = re.compile(r"torch\.(Float|Double|Half|BFloat16|Long|Int|Short|Char|Byte|Bool)?Tensor")


def legacy_sized_allocation(call: cst.Call, qualified: str) -> bool:
    """`torch.FloatTensor(n, d)`: a legacy CPU constructor given two or more sizes allocates an uninitialized tensor
    (given data, it takes one sequence)."""
    positional = [arg for arg in call.args if arg.keyword is None]
    return LEGACY_HOST_TENSOR.fullmatch(qualified) is not None and len(positional) >= 2 and not any(
        arg.star or isinstance(arg.value, (cst.List, cst.Tuple, cst.ListComp)) for arg in positional)


def _mapping_entry(value: cst.BaseExpression | None, keyword: str) -> cst.BaseExpression | None:
    """`v` of `dict(keyword=v)` or `{"keyword": v}`."""
    if isinstance(value, cst.Call) and dotted_name(value.func) == "dict":
        found = call_arg(value, keyword)
        return found.value if found is not None else None
    if isinstance(value, cst.Dict):
        return next((e.value for e in value.elements if isinstance(e, cst.DictElement)
                     and string_value(e.key) == keyword), None)
    return None


class BindingKind(str, enum.Enum):
    ASSIGN = "assign"  # name = value
    UNPACK = "unpack"  # a, b = value  (value is the whole right-hand side)
    FOR = "for"  # for name in value  (value is the iterable)
    PARAM = "param"
    AUGMENT = "augment"  # name += value  (value is the right-hand side)
    OTHER = "other"  # with-as, import, walrus, except-as, ...


@dataclass(frozen=True)
class Binding:
    kind: BindingKind
    value: cst.BaseExpression | None
    order: int  # pre-order index of the binding statement in the file
    # for FOR/UNPACK: index path of the name inside the target tuple, e.g. (1, 0) for `i, (x, y)` -> x
    path: tuple[int, ...] = ()


@dataclass
class Scope:
    node: cst.CSTNode  # Module or FunctionDef
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    globals_: set[str] = field(default_factory=set)

    def add(self, name: str, binding: Binding) -> None:
        self.bindings.setdefault(name, []).append(binding)


class HotKind(str, enum.Enum):
    FORWARD = "forward"  # nn.Module.forward
    COMPILED = "compiled"  # torch.compile'd function (C ⊂ H)
    STEP_LOOP = "step-loop"  # loop that reaches backward/optimizer.step
    STEP_FUNCTION = "step-function"  # function doing one training step, called per step
    ROLLOUT = "rollout"  # loop stepping an environment/game or evaluating a network per iteration, or its callees
    CALLEE = "called-per-step"  # a function the program calls from a training step (any file, any depth)


class Confidence(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Device(str, enum.Enum):
    CUDA = "cuda"
    MAYBE_CUDA = "maybe-cuda"
    CPU = "cpu"


# What the usual names mean when a file gets them from a star import (`from utils import *`, utils importing torch)
_CONVENTIONAL_ALIASES = {"torch": "torch", "nn": "torch.nn", "F": "torch.nn.functional", "optim": "torch.optim",
                         "np": "numpy"}
_MASK_NAME = re.compile(r"mask|valid|keep|done|alive|legal|nonempty|non_empty|^is_", re.I)
_OPTIMIZER_NAME = vocab.OPTIMIZER_NAME
_LOADER_NAME = re.compile(r"loader|^dl$|_dl$|^dl_", re.I)
_STEP_FUNCTION_NAME = re.compile(r"^(train_step|training_step|train_batch|train_on_batch|update|learn|optimize_model|step_fn)$")
_COMPARISON_OPS = (cst.Equal, cst.NotEqual, cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)
_MASK_FUNCTIONS = {"torch.isnan", "torch.isinf", "torch.isfinite", "torch.isin", "torch.logical_and",
                   "torch.logical_or", "torch.logical_xor", "torch.logical_not", "torch.isneginf", "torch.isposinf",
                   "torch.eq", "torch.ne", "torch.lt", "torch.le", "torch.gt", "torch.ge"}
_MASK_METHODS = {"bool", "logical_and", "logical_or", "logical_xor", "logical_not", "isnan", "isinf", "isfinite",
                 "eq", "ne", "lt", "le", "gt", "ge"}
# Methods that only tensors have (numpy arrays and lists do not), so a call to one is tensor evidence.
_TENSOR_ONLY_METHODS = {"to", "cuda", "detach", "contiguous", "view", "unsqueeze", "masked_fill", "masked_fill_",
                        "softmax", "log_softmax", "bfloat16", "half", "float", "long", "int", "bool", "permute",
                        "expand", "expand_as", "narrow", "new_zeros", "new_ones", "new_full", "new_empty", "sigmoid",
                        "relu", "clamp", "clamp_min", "clamp_max", "type_as", "view_as", "index_select", "gather",
                        "scatter", "scatter_add", "chunk", "split", "norm", "matmul", "exp", "log", "abs", "sqrt",
                        "pow", "neg", "mul", "add", "sub", "div", "sum", "mean", "amax", "amin", "logsumexp",
                        "clone", "pin_memory", "argmax", "argmin", "squeeze", "flatten", "reshape", "transpose"}
# Of those, the ones numpy arrays also have: not evidence by themselves.
_SHARED_WITH_NUMPY = {"sum", "mean", "clip", "reshape", "transpose", "squeeze", "flatten", "argmax", "argmin",
                      "astype", "max", "min", "all", "any", "copy", "view"}
_NON_TENSOR_CALLS = {"len", "range", "int", "float", "bool", "str", "list", "tuple", "dict", "set", "sorted",
                     "enumerate", "zip", "min", "max", "sum", "abs", "round"}
_NON_TENSOR_METHODS = {"item", "tolist", "numpy", "astype", "keys", "values", "items", "get", "format", "split",
                       "join", "strip", "append", "copy"}
_NUMPY_PREFIXES = ("numpy.", "np.")
TENSOR_FACTORIES = {"zeros", "ones", "full", "empty", "arange", "eye", "linspace", "logspace", "zeros_like",
                    "ones_like", "full_like", "empty_like", "tensor", "as_tensor", "from_numpy", "rand", "randn",
                    "randint", "randperm", "normal", "bernoulli", "rand_like", "randn_like", "randint_like", "stack",
                    "cat", "where", "tril", "triu"}
_STEP_MARKER_FUNCTIONS = {"torch.autograd.backward"}
_CUDA_AMP_PREFIX = "torch.cuda.amp."
# `torch.cuda.is_available()` as text evidence, except as GPU010's `pin_memory=torch.cuda.is_available()`:
# that fix must not turn a file into a CUDA program for the next run
IS_AVAILABLE_TEXT = r"(?<!pin_memory=)torch\.cuda\.is_available\("
# CUDA named in the text of a file (`"cuda:0"`, `'cuda:%d' % gpu`, `.cuda(`, `torch.cuda.is_available(`): rules add
# their own extras
CUDA_TEXT_PATTERN = r"""["']cuda(:(\d+|%[ds]|\{[^{}'"]*\}))?["']|\.cuda\(|""" + IS_AVAILABLE_TEXT
CUDA_OR_ACCELERATOR_TEXT = re.compile(CUDA_TEXT_PATTERN + r"|torch\.accelerator\.")
# CUDA named anywhere in a file of the program: also `f"cuda:{rank}"`, device selection and the NCCL backend; or a
# launcher that places the model on the GPU itself (Hugging Face Accelerate, a Lightning Trainer given GPUs)
PROGRAM_CUDA_TEXT = re.compile(CUDA_TEXT_PATTERN + r"""|f["']cuda|torch\.cuda\.(set_device|current_device|synchronize)\(|"""
                               r"""["']nccl["']|\bAccelerator\(|\bgpus\s*=\s*(?!0\b|None\b)\w|"""
                               r"""\baccelerator\s*=\s*["'](?:gpu|cuda)["']""")
_PLACING_LAUNCHERS = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
# literal text one of which every match of PROGRAM_CUDA_TEXT holds (a cheap test before the regex)
PROGRAM_CUDA_WORDS = ("cuda", "nccl", "Accelerator(", "gpu")
_BATCH_NORM = re.compile(r"^torch\.nn\.(BatchNorm\dd|SyncBatchNorm|LazyBatchNorm\dd|Dropout(\dd)?|AlphaDropout|FeatureAlphaDropout)$")
_MODULE_BASES = {"torch.nn.Module", "lightning.pytorch.LightningModule", "pytorch_lightning.LightningModule",
                 "lightning.LightningModule", "lightning.pytorch.core.LightningModule", "transformers.PreTrainedModel",
                 "transformers.modeling_utils.PreTrainedModel"}


# ---------------------------------------------------------------------------------------------
# the per-file pre-pass


@dataclass
class ClassInfo:
    node: cst.ClassDef
    base_names: list[str]  # qualified or dotted names of bases
    attrs: dict[str, list[Binding]] = field(default_factory=dict)  # self.<attr> = value
    is_module: bool = False


class FileAnalysis:
    """Facts about one module. Built by `analyze(module)`."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.aliases: dict[str, str] = {}  # local name -> qualified name ("t" -> "torch")
        self.star_imported = False  # `from module import *`: conventional names may come from there
        self.import_nodes: list[cst.CSTNode] = []  # top-level import statements, in order
        self.scopes: dict[int, Scope] = {}  # id(Module|FunctionDef) -> Scope
        self.classes: dict[str, ClassInfo] = {}
        self.function_class: dict[int, ClassInfo] = {}  # id(FunctionDef) -> enclosing class
        self.functions: dict[str, list[cst.FunctionDef]] = {}  # by name, any nesting
        self.order: dict[int, int] = {}  # id(statement) -> pre-order index
        self.hot: dict[int, HotKind] = {}  # id(FunctionDef | For | While) -> kind
        self.compiled_names: set[str] = set()  # functions passed to torch.compile(...)
        self.cuda_evidence = False  # a definite CUDA mention
        self.maybe_cuda_evidence = False  # torch.cuda.is_available() & co.
        # tensors sent to a device its caller or configuration chooses (`.to(device)`, `device=self.device`), in a
        # file that never binds such a name to the CPU: device-agnostic code, written to run on a GPU
        self.device_variable_use = False
        self.cpu_device_binding = False  # `device = "cpu"`, `def f(x, device="cpu")`, `self.device = torch.device("cpu")`
        self.main_guard: cst.If | None = None
        self.function_key: dict[int, str] = {}  # id(FunctionDef) -> "Class.method" / "outer.inner" (call graph key)
        # id(FunctionDef) -> how often its callers run it (program call graph; absent: once or unknown)
        self.call_frequency: dict[int, Frequency] = {}
        # Evidence.is_module of a name or `self.<attr>` by (innermost scope, kind, name, depth): the answer depends
        # on nothing else, and without it each use re-walked every binding of the name at every depth (n**4)
        self.module_answers: dict[tuple[int, str, str, int], Confidence | None] = {}
        # functions called per step of an evaluation rollout (rare, so not hot, but each call builds a graph)
        self.evaluation_rollout: set[int] = set()
        # rollout regions that act (step an environment or game, evaluate a network per move or simulation),
        # as opposed to loops that are hot only because they are nested in an update loop
        self.acting: set[int] = set()
        # what the program's call graph says of this file's functions and loops, by key (see CallGraph.by_file)
        self.program_keys: dict[str, Frequency] = {}
        self.program_networks: frozenset[str] = frozenset()  # the program's network classes, in any file
        self._integer_constants: dict[str, int] | None = None
        self._wraps_loaders: bool | None = None

    def integer_constants(self) -> dict[str, int]:
        """Integers the file fixes by name: module-level `log_interval = 1` (assigned once) and argparse
        defaults (`add_argument("--policy-delay", default=2)` as `policy_delay`). Computed on first use."""
        if self._integer_constants is None:
            found: dict[str, int] = {}
            assigned: set[str] = set()
            for line in self.module.body:  # (read from the tree itself: the prepass asks before scopes are done)
                for small in (line.body if isinstance(line, cst.SimpleStatementLine) else ()):
                    if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                            and isinstance(small.targets[0].target, cst.Name):
                        name = small.targets[0].target.value
                        if name in assigned:
                            found.pop(name, None)
                        elif isinstance(small.value, cst.Integer):
                            found[name] = int(small.value.evaluated_value)
                        assigned.add(name)
            for node in walk(self.module, into_functions=True):
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                        and node.func.attr.value == "add_argument" and node.args:
                    flag = string_value(node.args[0].value)
                    default = call_arg(node, "default")
                    if flag and flag.startswith("-") and default is not None and isinstance(default.value, cst.Integer):
                        found.setdefault(flag.lstrip("-").replace("-", "_"), int(default.value.evaluated_value))
            self._integer_constants = found
        return self._integer_constants

    def wraps_loaders_for_device(self) -> bool:
        """Does the file hand a loader to `fabric.setup_dataloaders` / `accelerator.prepare(...)`?"""
        if self._wraps_loaders is None:
            self._wraps_loaders = any(
                isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                and n.func.attr.value in vocab.DEVICE_LOADER_WRAPPERS for n in walk(self.module, into_functions=True))
        return self._wraps_loaders

    # -- names -------------------------------------------------------------------------------

    def qualname(self, node: cst.BaseExpression | None) -> str | None:
        """Alias-resolved dotted name: `t.nn.functional.softmax` -> `torch.nn.functional.softmax`."""
        dotted = dotted_name(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        target = self.aliases.get(head)
        if target is None and self.star_imported:  # `from utils import *` where utils imports torch
            target = _CONVENTIONAL_ALIASES.get(head)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target

    def call_qualname(self, call: cst.Call) -> str | None:
        return self.qualname(call.func)

    def key_of(self, function: cst.FunctionDef | None) -> str:
        """The call graph's key of a function of this file (`"<module>"` for top-level code): the prefix of the
        program markers about it (`train#trains`, `step#uploads:tensor`)."""
        return "<module>" if function is None else self.function_key.get(id(function), function.name.value)

    def local_name_for(self, qualified: str) -> str | None:
        """How this file spells `qualified` (e.g. `torch` -> `t`), if it is imported."""
        best: str | None = None
        for local, target in self.aliases.items():
            if qualified == target:
                return local
            if qualified.startswith(target + ".") and (best is None or len(target) > len(self.aliases[best.split(".")[0]])):
                best = local + qualified[len(target):]
        return best

    # -- bindings ----------------------------------------------------------------------------

    def scope_chain(self, ancestors: Sequence[cst.CSTNode]) -> list[Scope]:
        chain = [self.scopes[id(node)] for node in reversed(ancestors) if id(node) in self.scopes]
        if not chain or chain[-1].node is not self.module:
            chain.append(self.scopes[id(self.module)])
        return chain

    def bindings_of(self, name: str, ancestors: Sequence[cst.CSTNode]) -> list[Binding]:
        """Bindings of `name` in the innermost scope that binds it (module scope last)."""
        for scope in self.scope_chain(ancestors):
            if name in scope.globals_:
                continue
            if name in scope.bindings:
                return scope.bindings[name]
        return []

    def reaching_bindings(self, name: str, ancestors: Sequence[cst.CSTNode], before: int | None = None
                          ) -> list[Binding]:
        """The binding textually last before the current statement (or before the statement of order `before`), or
        all of them if none precedes it (loop-carried)."""
        bindings = self.bindings_of(name, ancestors)
        here = self.statement_order(ancestors) if before is None else before
        prior = [b for b in bindings if b.order < here]
        if before is None and len(prior) > 1:
            # in an `else:` (or `elif`), what the `if` branch bound does not reach
            for start, end in self._other_branches(ancestors):
                prior = [b for b in prior if not start <= b.order < end]
        return [prior[-1]] if prior else bindings

    def _other_branches(self, ancestors: Sequence[cst.CSTNode]) -> list[tuple[int, int]]:
        """Order ranges of the `if` bodies whose `else`/`elif` the current node is in."""
        ranges = []
        for index in range(len(ancestors) - 1):
            node = ancestors[index]
            if isinstance(node, cst.If) and ancestors[index + 1] is node.orelse and node.body.body:
                branch = node.orelse.body.body[0] if isinstance(node.orelse, cst.Else) and node.orelse.body.body \
                    else node.orelse
                start, end = self.order.get(id(node.body.body[0])), self.order.get(id(branch))
                if start is not None and end is not None:
                    ranges.append((start, end))
        return ranges

    def statement_order(self, ancestors: Sequence[cst.CSTNode]) -> int:
        for node in reversed(ancestors):
            if id(node) in self.order:
                return self.order[id(node)]
        return 1 << 30

    def enclosing_class(self, ancestors: Sequence[cst.CSTNode]) -> ClassInfo | None:
        for node in reversed(ancestors):
            if isinstance(node, cst.FunctionDef) and id(node) in self.function_class:
                return self.function_class[id(node)]
        return None

    # -- hot regions -------------------------------------------------------------------------

    def hot_kind(self, ancestors: Sequence[cst.CSTNode]) -> HotKind | None:
        """Kind of the innermost hot region around the current node, stopping at a non-hot function."""
        for index in range(len(ancestors) - 1, -1, -1):
            node = ancestors[index]
            kind = self.hot.get(id(node))
            if kind is not None:
                return kind
            if type(node) in _NESTED_SCOPES and not _applied_in_place(ancestors, index):
                return None
        return None

    def is_compiled(self, ancestors: Sequence[cst.CSTNode]) -> bool:
        return any(self.hot.get(id(node)) is HotKind.COMPILED for node in ancestors)

    def in_loop(self, ancestors: Sequence[cst.CSTNode]) -> bool:
        for node in reversed(ancestors):
            kind = type(node)
            if kind is cst.For or kind is cst.While:
                return True
            if kind in _NESTED_SCOPES:
                return False
        return False

    def under_main_guard(self, ancestors: Sequence[cst.CSTNode]) -> bool:
        return self.main_guard is not None and any(node is self.main_guard for node in ancestors)


# builtins that call the function they are given right away, once per element
_APPLYING_BUILTINS = frozenset({"map", "filter", "sorted", "max", "min"})


def _applied_in_place(ancestors: Sequence[cst.CSTNode], index: int) -> bool:
    """Is `ancestors[index]` a lambda handed straight to `map`/`filter`/`sorted`/`max`/`min` (it runs where it is
    written, as often as that code runs, rather than whenever something calls it later)?"""
    if type(ancestors[index]) is not cst.Lambda or index < 2 or type(ancestors[index - 1]) is not cst.Arg:
        return False
    call = ancestors[index - 2]
    return type(call) is cst.Call and type(call.func) is cst.Name and call.func.value in _APPLYING_BUILTINS


@dataclass
class _Region:
    """A function or loop seen by the pre-pass, with the training-step markers directly inside it
    (not inside a nested loop or def)."""

    node: cst.CSTNode
    backward: bool = False
    optimizer_step: bool = False
    stepped: bool = False  # an optimizer's own `.step()` call (not a helper guessed to step one)
    called: set[str] = field(default_factory=set)
    self_calls: set[str] = field(default_factory=set)  # `self.<name>(...)` anywhere in a function's body
    has_loop: bool = False
    env_step: bool = False  # `env.step(...)`, `game.play(...)` directly inside
    network_call: bool = False  # `model(x)`, `self.net(x)`, `net.predict(x)` directly inside
    function_name: str = ""  # the enclosing function's name ("" at module level)
    loop_key: str = ""  # "<function key>#loop<n>": the call graph's name for this loop
    throttled: bool = False  # under an `if step % N == 0:` / `if log_now:` inside the enclosing loop or function
    parent_loop: "_Region | None" = None  # the loop around this one in the same function

    @property
    def any_marker(self) -> bool:
        return self.backward or self.optimizer_step


# exact-type sets: isinstance() against libcst's abstract bases is slow on hot paths
_STATEMENT_TYPES = frozenset({cst.SimpleStatementLine, cst.If, cst.For, cst.While, cst.With, cst.Try, cst.TryStar,
                              cst.FunctionDef, cst.ClassDef, cst.Match})
_REGION_TYPES = frozenset({cst.FunctionDef, cst.For, cst.While})
_BARRIER_TYPES = frozenset({cst.ClassDef, cst.Lambda})


# node class -> _PrePass's visit_/leave_ method (or None), looked up once per class rather than once per node
_PREPASS_VISIT: dict[type, Any] = {}
_PREPASS_LEAVE: dict[type, Any] = {}
_UNSET = object()


class _PrePass(cst.CSTVisitor):
    def __init__(self, analysis: FileAnalysis) -> None:
        super().__init__()
        self.a = analysis
        # the program's network classes, as values are named after them
        self.network_names = vocab.network_class_names(analysis.program_networks)
        self.stack: list[cst.CSTNode] = []
        self.scope_stack: list[Scope] = []
        self.class_stack: list[ClassInfo] = []
        self.def_names: list[str] = []  # enclosing class and function names (the call graph's keys)
        self.counter = 0
        self.regions: list[_Region] = []
        self.region_stack: list[_Region | None] = []  # None: a class or lambda body, which ends a region
        self.loop_counts: dict[str, int] = {}  # function key -> loops seen in it so far

    # the stack of ancestors doubles as the order counter for statements
    def on_visit(self, node: cst.CSTNode) -> bool:
        self.counter += 1
        kind = type(node)
        if kind in _STATEMENT_TYPES:
            self.a.order[id(node)] = self.counter
        self.stack.append(node)
        if kind in _REGION_TYPES:
            if kind is not cst.FunctionDef:
                for region in reversed(self.region_stack):
                    if region is None or isinstance(region.node, cst.FunctionDef):
                        if region is not None:
                            region.has_loop = True
                        break
            region = _Region(node)
            if kind is cst.FunctionDef:
                region.function_name = node.name.value  # type: ignore[attr-defined]
            else:
                region.function_name = next((r.function_name for r in reversed(self.region_stack) if r is not None),
                                            "")
                enclosing = self.region_stack[-1] if self.region_stack else None
                if enclosing is not None and isinstance(enclosing.node, (cst.For, cst.While)):
                    region.parent_loop = enclosing
                region.throttled = self._under_throttle()
                function_key = ".".join(self.def_names) or "<module>"
                index = self.loop_counts.get(function_key, 0)
                self.loop_counts[function_key] = index + 1
                region.loop_key = f"{function_key}#loop{index}"
            self.regions.append(region)
            self.region_stack.append(region)
        elif kind in _BARRIER_TYPES:
            self.region_stack.append(None)
        handler = _PREPASS_VISIT.get(kind, _UNSET)
        if handler is _UNSET:
            handler = _PREPASS_VISIT[kind] = getattr(_PrePass, f"visit_{kind.__name__}", None)
        return handler is None or handler(self, node) is not False

    def _under_throttle(self) -> bool:
        """Is the node being visited inside a throttling `if` (every N steps, a log or eval flag, end of an
        episode) that lies within the innermost enclosing loop or function?"""
        for node in reversed(self.stack[:-1]):
            if type(node) in _REGION_TYPES or type(node) in _BARRIER_TYPES:
                return False
            if isinstance(node, cst.If) and _throttling_test(self.a, node.test):
                return True
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        kind = type(original_node)
        handler = _PREPASS_LEAVE.get(kind, _UNSET)
        if handler is _UNSET:
            handler = _PREPASS_LEAVE[kind] = getattr(_PrePass, f"leave_{kind.__name__}", None)
        if handler is not None:
            handler(self, original_node)
        if kind in _REGION_TYPES or kind in _BARRIER_TYPES:
            self.region_stack.pop()
        self.stack.pop()

    @property
    def scope(self) -> Scope:
        return self.scope_stack[-1]

    def current_order(self) -> int:
        for node in reversed(self.stack):
            if id(node) in self.a.order:
                return self.a.order[id(node)]
        return 0

    # -- module & imports --------------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        scope = Scope(node)
        self.a.scopes[id(node)] = scope
        self.scope_stack.append(scope)

    def visit_Import(self, node: cst.Import) -> None:
        if len(self.stack) <= 3:
            self.a.import_nodes.append(self.stack[-2])
        for alias in node.names:
            full = dotted_name(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
                self.a.aliases[local] = full
            else:
                local = full.split(".")[0]
                self.a.aliases.setdefault(local, local)
            self.scope.add(local, Binding(BindingKind.OTHER, None, self.current_order()))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if len(self.stack) <= 3:
            self.a.import_nodes.append(self.stack[-2])
        if isinstance(node.names, cst.ImportStar) and node.module is not None:
            self.a.star_imported = True
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        base = dotted_name(node.module) or ""
        for alias in node.names:
            name = dotted_name(alias.name) or ""
            local = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
            self.a.aliases[local] = f"{base}.{name}"
            self.scope.add(local, Binding(BindingKind.OTHER, None, self.current_order()))

    # -- classes & functions -----------------------------------------------------------------

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = [self.a.qualname(b.value) or dotted_name(b.value) or "" for b in node.bases]
        info = ClassInfo(node, bases)
        self.a.classes.setdefault(node.name.value, info)
        self.class_stack.append(info)
        self.def_names.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.class_stack.pop()
        self.def_names.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.a.functions.setdefault(node.name.value, []).append(node)
        self.def_names.append(node.name.value)
        self.a.function_key[id(node)] = ".".join(self.def_names)
        if self.class_stack and self.stack[-3:-2] and self.stack[-3] is self.class_stack[-1].node:
            self.a.function_class[id(node)] = self.class_stack[-1]
        self.scope.add(node.name.value, Binding(BindingKind.OTHER, None, self.current_order()))
        scope = Scope(node)
        self.a.scopes[id(node)] = scope
        params = node.params
        for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
            scope.add(param.name.value, Binding(BindingKind.PARAM, param.default, 0))
            if param.default is not None and _is_cpu_device(param.default) \
                    and _DEVICE_VARIABLE.fullmatch(param.name.value):
                self.a.cpu_device_binding = True
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                scope.add(star.name.value, Binding(BindingKind.PARAM, None, 0))
        self.scope_stack.append(scope)
        for decorator in node.decorators:
            target = decorator.decorator
            target = target.func if isinstance(target, cst.Call) else target
            if self.a.qualname(target) == "torch.compile":
                self.a.hot[id(node)] = HotKind.COMPILED

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scope_stack.pop()
        self.def_names.pop()

    def visit_Global(self, node: cst.Global) -> None:
        self.scope.globals_.update(item.name.value for item in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.scope.globals_.update(item.name.value for item in node.names)

    # -- bindings ----------------------------------------------------------------------------

    def _bind_target(self, target: cst.BaseExpression, value: cst.BaseExpression | None, kind: BindingKind,
                     path: tuple[int, ...] = ()) -> None:
        order = self.current_order()
        if value is not None and _is_cpu_device(value) and _DEVICE_VARIABLE.fullmatch(
                vocab.last_part(dotted_name(target))):
            self.a.cpu_device_binding = True
        if isinstance(target, cst.Name):
            self.scope.add(target.value, Binding(kind, value, order, path))
        elif isinstance(target, (cst.Tuple, cst.List)):
            unpack_kind = BindingKind.UNPACK if kind is BindingKind.ASSIGN else kind
            for index, element in enumerate(target.elements):
                inner = element.value
                if isinstance(element, cst.StarredElement):
                    self._bind_target(inner, None, BindingKind.OTHER)
                else:
                    self._bind_target(inner, value, unpack_kind, path + (index,))
        elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) \
                and target.value.value == "self" and self.class_stack:
            self.class_stack[-1].attrs.setdefault(target.attr.value, []).append(Binding(kind, value, order, path))

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind_target(target.target, node.value, BindingKind.ASSIGN)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind_target(node.target, node.value, BindingKind.ASSIGN)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind_target(node.target, node.value, BindingKind.AUGMENT)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind_target(node.target, node.value, BindingKind.ASSIGN)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind_target(node.asname.name, None, BindingKind.OTHER)

    def visit_For(self, node: cst.For) -> None:
        self._bind_target(node.target, node.iter, BindingKind.FOR)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind_target(node.target, node.iter, BindingKind.FOR)

    # -- evidence ----------------------------------------------------------------------------

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is not None and re.fullmatch(r"cuda(:(\d+|%[ds]|\{[^{}]*\}))?", value):  # also 'cuda:%d' % gpu
            self.a.cuda_evidence = True

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        if any(isinstance(part, cst.FormattedStringText) and part.value.startswith("cuda") for part in node.parts[:1]):
            self.a.cuda_evidence = True

    def _in_evaluation_branch(self) -> bool:
        """In the `else:` of `if self.training:` or the body of `if not self.training:` (inference-only code
        of a forward, such as post-processing), within the current function."""
        for index in range(len(self.stack) - 2, -1, -1):
            node = self.stack[index]
            if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if isinstance(node, cst.If):
                branch = self.stack[index + 1]
                negated = isinstance(node.test, cst.UnaryOperation) and isinstance(node.test.operator, cst.Not)
                test = node.test.expression if negated else node.test
                if dotted_name(test) == "self.training" and (branch is node.body) == negated:
                    return True
        return False

    def _pins_if_available(self, call: cst.Call) -> bool:
        """`pin_memory=torch.cuda.is_available()` (GPU010's fix) says nothing about where the program runs."""
        parent = self.stack[-2] if len(self.stack) > 1 else None
        return isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "pin_memory"

    def visit_Decorator(self, node: cst.Decorator) -> None:
        qual = self.a.qualname(node.decorator)  # `@torch.cuda.amp.custom_fwd` used bare
        if qual is not None and qual.startswith(_CUDA_AMP_PREFIX):
            self.a.cuda_evidence = True

    def visit_Call(self, node: cst.Call) -> None:
        name = method_name(node)
        if name == "cuda":
            self.a.cuda_evidence = True
        qual = self.a.call_qualname(node)
        if qual is not None and qual.startswith(_CUDA_AMP_PREFIX) or qual in _PLACING_LAUNCHERS:
            # the deprecated CUDA AMP API targets CUDA as plainly as its `torch.amp.*("cuda")` replacement; an
            # Accelerate launcher puts what it prepares on the GPU
            self.a.cuda_evidence = True
        if not self.a.device_variable_use:
            target = call_arg(node, "device", 0 if name == "to" else None) if name == "to" or qual and \
                qual.startswith("torch.") else None
            if target is not None and _DEVICE_VARIABLE.fullmatch(vocab.last_part(dotted_name(target.value))):
                self.a.device_variable_use = True
        if qual in ("torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.current_device",
                    "torch.cuda.set_device") and not self._pins_if_available(node):
            self.a.maybe_cuda_evidence = True
        if qual == "torch.compile" and node.args and isinstance(node.args[0].value, cst.Name):
            self.a.compiled_names.add(node.args[0].value.value)
        region = self.region_stack[-1] if self.region_stack else None
        if region is None:
            return
        dotted = dotted_name(node.func)
        if vocab.is_env_step(dotted):
            region.env_step = True
        elif vocab.is_network_call(dotted, self.network_names):
            region.network_call = True
        if name == "backward" or qual in _STEP_MARKER_FUNCTIONS:
            region.backward = True
        elif vocab.steps_with([dotted_name(a.value) for a in node.args if not a.star]):
            region.backward = region.optimizer_step = True  # `loss_scaler(loss, optimizer)`
        elif name == "step" and isinstance(node.func, cst.Attribute):
            last = (dotted_name(node.func.value) or "").rsplit(".", 1)[-1]
            if _OPTIMIZER_NAME.search(last) or "scaler" in last.lower():
                region.optimizer_step = region.stepped = True
        if isinstance(node.func, cst.Name):
            region.called.add(node.func.value)
        elif isinstance(node.func, cst.Attribute):
            region.called.add(node.func.attr.value)
            if isinstance(node.func.value, cst.Name) and node.func.value.value == "self" \
                    and not self._in_evaluation_branch():
                for enclosing in reversed(self.region_stack):  # record on the function, across its loops
                    if enclosing is None:
                        break
                    if isinstance(enclosing.node, cst.FunctionDef):
                        enclosing.self_calls.add(node.func.attr.value)
                        break

    def visit_If(self, node: cst.If) -> None:
        test = node.test
        if (len(self.stack) == 2 and isinstance(test, cst.Comparison) and dotted_name(test.left) == "__name__"
                and len(test.comparisons) == 1 and string_value(test.comparisons[0].comparator) == "__main__"):
            self.a.main_guard = node


def _moves_itself(value: cst.BaseExpression | None, attr: str) -> bool:
    """`self.<attr>.to(device)`, `self.<attr>.cuda().eval()`: the attribute's own value, moved or switched."""
    moved = False
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
            and value.func.attr.value in ("to", "cuda", "cpu", "train", "eval", "float", "half", "share_memory"):
        value, moved = value.func.value, True
    return moved and isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) \
        and value.value.value == "self" and value.attr.value == attr


def _mark_modules(a: FileAnalysis, known_module_classes: set[str]) -> None:
    changed = True
    while changed:
        changed = False
        for name, info in a.classes.items():
            if info.is_module:
                continue
            for base in info.base_names:
                last = base.rsplit(".", 1)[-1]
                if (base in _MODULE_BASES or base.startswith("torch.nn.")
                        or (base in a.classes and a.classes[base].is_module) or last in known_module_classes
                        or last.endswith("LightningModule")):
                    info.is_module = True
                    changed = True
                    break


def _mark_hot(a: FileAnalysis, regions: list[_Region], calls: ProgramCalls | None) -> None:
    step_functions: set[str] = set(calls.step_names) if calls else set()
    program_steps = frozenset(step_functions)  # as the call graph found them (steps outside the function's loops)
    loop_trainers = {r.loop_key.rsplit("#", 1)[0] for r in regions if r.any_marker and isinstance(r.node, (
        cst.For, cst.While))}  # keys of the functions with a loop that trains
    loop_steppers = {r.loop_key.rsplit("#", 1)[0] for r in regions if r.stepped and isinstance(r.node, (
        cst.For, cst.While))}  # keys of the functions with a loop that calls an optimizer's `.step()`
    rollout_functions: set[str] = set(calls.rollout_names) if calls else set()
    trainers: frozenset[str] = calls.trainer_names if calls else frozenset()
    called = calls.frequencies if calls else {}
    direct_steps: set[str] = set()  # functions that backpropagate and step an optimizer, outside any loop
    for region in regions:
        fn = region.node
        if not isinstance(fn, cst.FunctionDef):
            continue
        name = fn.name.value
        info = a.function_class.get(id(fn))
        if name == "forward" and info is not None and info.is_module and a.key_of(fn) not in loop_trainers:
            # (a `forward` whose loop trains is a trainer's whole run, `Trainer(nn.Module).forward()`: not per step)
            a.hot.setdefault(id(fn), HotKind.FORWARD)
        elif name == "training_step" and info is not None and info.is_module:
            a.hot.setdefault(id(fn), HotKind.STEP_FUNCTION)
        if name in a.compiled_names:
            a.hot[id(fn)] = HotKind.COMPILED
        # (loops of its own are fine when the call graph saw its backward and optimizer step outside them and none
        # of them trains: `update_critic` looping over agents to build one loss is still one step per call, while
        # an update that also fits a value function in a loop of steps runs once per many steps)
        key = a.function_key.get(id(fn), "")
        direct = region.backward and region.optimizer_step and (not region.has_loop or name in program_steps and (
            key not in loop_trainers))
        # gradient accumulation: its loops backpropagate, the optimizer steps once after them
        direct = direct or region.stepped and key in loop_trainers and key not in loop_steppers
        if direct:
            direct_steps.add(name)
        if direct or region.any_marker and _STEP_FUNCTION_NAME.match(name):
            a.hot.setdefault(id(fn), HotKind.STEP_FUNCTION)
            step_functions.add(name)
        frequency = called.get(key)
        if frequency is not None:
            a.call_frequency[id(fn)] = frequency
        if f"{a.function_key.get(id(fn), '')}#rare-rollout" in called:
            a.evaluation_rollout.add(id(fn))
    # a method without a loop of its own that runs the class's training steps (`def update(self, batch, step):
    # ...; self.update_critic(...); self.update_actor(...)`) runs once per training step too
    for region in regions:
        fn = region.node
        if isinstance(fn, cst.FunctionDef) and not region.has_loop and id(fn) not in a.hot \
                and region.self_calls & direct_steps:
            a.hot[id(fn)] = HotKind.STEP_FUNCTION
            step_functions.add(fn.name.value)
    # loops around a training-step loop run once per iteration (PPO's `for iteration` loop: collect, bootstrap
    # value, update, log), however many network calls sit directly in them; a loop around an environment loop
    # may still be hot (a tree search's simulation loop steps a game copy in its selection loop)
    around_hot: set[int] = set()
    for region in regions:
        if region.any_marker or region.called & step_functions:
            outer = region.parent_loop
            while outer is not None and id(outer.node) not in around_hot:
                around_hot.add(id(outer.node))
                outer = outer.parent_loop
    for region in regions:
        loop = region.node
        if not isinstance(loop, (cst.For, cst.While)) or _runs_once(loop):
            continue
        resolved = called.get(region.loop_key)  # what the loop's calls resolve to across the program
        if region.any_marker or region.called & step_functions or resolved is Frequency.PER_STEP:
            a.hot.setdefault(id(loop), HotKind.STEP_LOOP)
        elif region.throttled or f"{region.loop_key.rsplit('#', 1)[0]}#rare" in called:
            continue  # sampling or evaluating every N steps (here, or around every call of this function)
        elif region.env_step or (
                (region.network_call or region.called & rollout_functions or resolved is Frequency.PER_ROLLOUT_STEP)
                # (over a name, the call graph's verdict says whether it counts: `for i in indices` with `indices =
                # list(range(T))[::-1]`)
                and (_repeats(loop) or resolved is Frequency.PER_ROLLOUT_STEP and isinstance(loop, cst.For)
                     and isinstance(loop.iter, cst.Name))
                and not vocab.EVAL_FUNCTION.match(region.function_name)
                and f"{region.loop_key}#outer" not in called
                and id(loop) not in around_hot):
            a.hot.setdefault(id(loop), HotKind.ROLLOUT)
            a.acting.add(id(loop))
        elif _in_update_loop(region, trainers):
            a.hot.setdefault(id(loop), HotKind.ROLLOUT)  # many iterations per update: `for step in range(n_steps)`
    _mark_forward_helpers(a, regions)
    for region in regions:  # functions the program calls per step or per rollout step, from any file
        fn = region.node
        frequency = a.call_frequency.get(id(fn))
        if frequency is Frequency.PER_STEP:
            a.hot.setdefault(id(fn), HotKind.CALLEE)
        elif frequency is Frequency.PER_ROLLOUT_STEP:
            a.hot.setdefault(id(fn), HotKind.ROLLOUT)
            a.acting.add(id(fn))


def _throttling_test(a: FileAnalysis, test: cst.BaseExpression) -> bool:
    names = {n.value for n in walk(test) if isinstance(n, cst.Name)}
    names |= {n.attr.value for n in walk(test) if isinstance(n, cst.Attribute)}
    names -= _not_throttling_names(test)
    every, throttled = set(), False
    for key, value in _modulo_divisors(a, test):
        if vocab.every_step(value):
            every.add(key)
        else:
            throttled = True
    return vocab.throttles(names - every, throttled)


def _not_throttling_names(test: cst.BaseExpression) -> set[str]:
    """Names in the test that say nothing of how often its body runs: one compared with `None` (`if logger is not
    None:` asks whether a logger was given) and those under a `not` (`if not load_checkpoint:`, `if not done:` hold
    on the common path)."""
    found = set()
    for node in walk(test):
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and isinstance(
                node.comparisons[0].operator, (cst.Is, cst.IsNot)) and isinstance(
                node.comparisons[0].comparator, cst.Name) and node.comparisons[0].comparator.value == "None":
            found.add(vocab.last_part(dotted_name(node.left)))
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            found.update(n.value if isinstance(n, cst.Name) else n.attr.value for n in walk(node.expression)
                         if isinstance(n, (cst.Name, cst.Attribute)))
    return found


def every_n_steps(a: FileAnalysis, test: cst.BaseExpression) -> bool:
    """Does an `if` test run its body once every N steps (`step % N == 0`)? Not when N is known to be 1 or 2
    (`log_interval = 1` at module level, an argparse default): that body runs every step."""
    return any(not vocab.every_step(value) for _, value in _modulo_divisors(a, test))


def every_many_steps(a: FileAnalysis, test: cst.BaseExpression) -> bool:
    """`every_n_steps`, and plainly rare: the divisor is known to be at least `vocab.RARE_MODULUS`
    (`generator_iter % 1000 == 0`) or named for output (`step % log_interval == 0`). `(k + 1) % horizon == 0` in an
    unrolled step is not: it may hold every few iterations of the same step."""
    return any(value is not None and value >= vocab.RARE_MODULUS or value is None and name is not None
               and vocab.THROTTLE_NAME.search(name) is not None for name, value in _modulo_divisors(a, test))


def _modulo_divisors(a: FileAnalysis, test: cst.BaseExpression) -> list[tuple[str | None, int | None]]:
    """(name, value if known) of the divisor of each `x % divisor` in `test` (string formatting excluded)."""
    found = []
    for node in walk(test):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo) and not isinstance(
                node.left, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
            divisor = node.right
            key = divisor.value if isinstance(divisor, cst.Name) else divisor.attr.value if isinstance(
                divisor, cst.Attribute) else None
            if isinstance(divisor, cst.Integer):
                found.append((None, int(divisor.evaluated_value)))
            else:
                found.append((key, a.integer_constants().get(key) if key is not None else None))
    return found


def _in_update_loop(region: _Region, trainers: frozenset[str]) -> bool:
    """Is the loop nested in one whose iteration trains (`for update in range(n): ...; agent.update()`)?"""
    outer = region.parent_loop
    while outer is not None:
        if outer.any_marker or outer.called & trainers:
            return not _iterates_loader(region.node)  # type: ignore[arg-type]
        outer = outer.parent_loop
    return False


def _repeats(loop: cst.For | cst.While) -> bool:
    """`while not done:` / `for t in range(horizon):` (a rollout or a search), not a loop over inputs nor one that
    retries on failure (`while retries:`)."""
    header = loop.test if isinstance(loop, cst.While) else loop.target
    if any(isinstance(n, cst.Name) and vocab.RETRY_NAME.search(n.value) for n in walk(header)):
        return False
    if not isinstance(loop, cst.For):
        return True
    iterable = loop.iter
    while isinstance(iterable, cst.Call) and (dotted_name(iterable.func) or "").rsplit(".", 1)[-1] in \
            (*vocab.COUNT_KEEPING_WRAPPERS, "zip") and iterable.args:
        if dotted_name(iterable.func) == "reversed" and isinstance(iterable.args[0].value, cst.Name):
            return True  # `for i, j in zip(reversed(seq), reversed(seq_next))`: a sampler walking its schedule back
        iterable = iterable.args[0].value
    return isinstance(iterable, cst.Call) and (dotted_name(iterable.func) or "").rsplit(".", 1)[-1] in \
        vocab.COUNTING_ITERABLES and not _walks_chunks(loop, iterable)


def _walks_chunks(loop: cst.For, iterable: cst.Call) -> bool:
    """`for start in range(0, n, batch_size): x[start:start + batch_size]`: a pass over inputs in chunks (a batched
    inference or analysis pass), not a rollout's or a search's repetitions."""
    if dotted_name(iterable.func) != "range" or len(iterable.args) != 3 or not isinstance(loop.target, cst.Name):
        return False
    start = loop.target.value
    return any(isinstance(n, cst.Slice) and isinstance(n.lower, cst.Name) and n.lower.value == start
               for n in walk(loop.body))


def _iterates_loader(loop: cst.For | cst.While) -> bool:
    return isinstance(loop, cst.For) and any(
        isinstance(n, (cst.Name, cst.Attribute)) and vocab.LOADER_TEXT.search(dotted_name(n) or "")
        for n in walk(loop.iter))


def _runs_once(loop: cst.For | cst.While) -> bool:
    """A loop whose body ends in an unconditional `break`/`return`/`raise` (take one batch and stop)."""
    body = loop.body
    if not isinstance(body, cst.IndentedBlock) or not body.body:
        return False
    last = body.body[-1]
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Break, cst.Return, cst.Raise))


def _mark_forward_helpers(a: FileAnalysis, regions: list[_Region]) -> None:
    """Catalog §0.3 (d), one level: a method that `forward` (or compiled code) calls as `self.<name>(...)` runs
    on every forward too. Not extended to step loops, whose helpers are often called only every N steps."""
    for region in regions:
        fn = region.node
        kind = a.hot.get(id(fn))
        info = a.function_class.get(id(fn))
        if kind not in (HotKind.FORWARD, HotKind.COMPILED) or info is None:
            continue
        for name in region.self_calls:
            for method in a.functions.get(name, ()):
                if a.function_class.get(id(method)) is info and method is not fn:
                    a.hot.setdefault(id(method), kind)


def analyze(module: cst.Module, known_module_classes: set[str] | None = None,
            calls: ProgramCalls | None = None) -> FileAnalysis:
    """The file's shared facts; `calls` (from the program's call graph) says how often its functions run."""
    _CHILDREN.clear()
    analysis = FileAnalysis(module)
    analysis.program_networks = frozenset(known_module_classes or ())
    prepass = _PrePass(analysis)
    traverse(module, prepass.on_visit, prepass.on_leave)
    _drop_rebound_aliases(analysis)
    if analysis.device_variable_use and not analysis.cpu_device_binding and not analysis.cuda_evidence:
        analysis.maybe_cuda_evidence = True
    _mark_modules(analysis, known_module_classes or set())
    _mark_hot(analysis, prepass.regions, calls)
    if calls is not None:
        analysis.program_keys = calls.frequencies
    return analysis


def _drop_rebound_aliases(analysis: FileAnalysis) -> None:
    """`import model` then `model = model.RNNModel(...)` at the top level: from there on `model` is the network,
    not the module (a fallback such as `except ImportError: amp = None` keeps the import's meaning)."""
    scope = analysis.scopes.get(id(analysis.module))
    if scope is None:
        return
    for name in [n for n in analysis.aliases if "." not in n]:
        if any(b.kind is BindingKind.ASSIGN and isinstance(b.value, cst.Call) for b in scope.bindings.get(name, ())):
            del analysis.aliases[name]


_Facts = TypeVar("_Facts", bound="PerFileFacts")


class PerFileFacts:
    """Base of facts that rules derive from one file's analysis: `Facts.of(analysis)` builds them on first
    request and gives every later caller (other rules included) the same object while the analysis lives."""

    _built: ClassVar["weakref.WeakKeyDictionary[FileAnalysis, Any]"]  # each subclass keeps its own

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._built = weakref.WeakKeyDictionary()

    def __init__(self, analysis: FileAnalysis) -> None:
        self.a = analysis

    @classmethod
    def of(cls: type[_Facts], analysis: FileAnalysis) -> _Facts:
        facts = cls._built.get(analysis)
        if facts is None:
            facts = cls(analysis)
            cls._built[analysis] = facts
        return facts


_ITERATING = frozenset({cst.For, cst.While, cst.CompFor})


class FileStructure(PerFileFacts):
    """One walk of the file: each node's parent, and its calls, loops, assignments and returns in walk order.
    Shared by the analyses that climb from a node to its enclosing loops and functions (loader flow, gradient
    accumulation). Exact types are compared: libcst's classes are final, and isinstance through their ABC is
    slow on every node of a file."""

    def __init__(self, analysis: "FileAnalysis") -> None:
        super().__init__(analysis)
        self.parents: dict[int, cst.CSTNode] = {}
        self.loops: list[cst.CSTNode] = []  # for, while, comprehension for, and `yield from` (it iterates too)
        self.assigns: list[cst.CSTNode] = []
        self.calls: list[cst.Call] = []
        self.returns: list[cst.Return] = []
        stack: list[cst.CSTNode] = [analysis.module]
        while stack:
            node = stack.pop()
            kind = type(node)
            if kind is cst.Call:
                self.calls.append(node)  # type: ignore[arg-type]
            elif kind in _ITERATING or kind is cst.Yield and type(node.value) is cst.From:  # type: ignore[attr-defined]
                self.loops.append(node)
            elif kind is cst.Assign or kind is cst.AnnAssign:
                self.assigns.append(node)
            elif kind is cst.Return:
                self.returns.append(node)  # type: ignore[arg-type]
            children = child_nodes(node)
            self.parents.update(dict.fromkeys(map(id, children), node))
            stack.extend(children)


# ---------------------------------------------------------------------------------------------
# expression predicates (need the ancestors of the expression for scope lookups)


# `torch.nn` names that are tensors or containers of tensors, not modules
_NN_TENSOR_CLASSES = {"Parameter", "Buffer", "UninitializedParameter", "UninitializedBuffer", "PackedSequence"}
_NN_NOT_MODULES = ("torch.nn.functional", "torch.nn.parameter.", "torch.nn.utils.rnn.", "torch.nn.init.")
_REGISTERED: dict[int, tuple[cst.ClassDef, frozenset[str]]] = {}


def registered_tensors(info: ClassInfo) -> frozenset[str]:
    """Names a class registers as tensors: `self.register_buffer("name", ...)`, `self.register_parameter(...)`."""
    cached = _REGISTERED.get(id(info.node))
    if cached is not None and cached[0] is info.node:
        return cached[1]
    names = set()
    for call in iter_calls(info.node, into_functions=True):
        if method_name(call) in ("register_buffer", "register_parameter") and call.args:
            name = string_value(call.args[0].value)
            if name is not None:
                names.add(name)
    if len(_REGISTERED) > 256:
        _REGISTERED.clear()
    _REGISTERED[id(info.node)] = (info.node, frozenset(names))
    return _REGISTERED[id(info.node)][1]


_PARAMETER_METHODS = frozenset({"parameters", "named_parameters", "modules", "named_modules", "children",
                                "buffers", "named_buffers"})


def _parameter_owners(a: FileAnalysis) -> frozenset[str]:
    """Names and `self.` attributes whose parameters or submodules the file reads (`model.parameters()`):
    networks, by how they are used. Computed once per file."""
    cache = a.__dict__.get("_parameter_owners")
    if cache is None:
        cache = frozenset(dotted_name(call.func.value) or "" for call in iter_calls(a.module, into_functions=True)
                          if method_name(call) in _PARAMETER_METHODS and isinstance(call.func, cst.Attribute)
                          and not call.args) - {""}
        a.__dict__["_parameter_owners"] = cache
    return cache


class Evidence:
    """Expression predicates bound to one file and one traversal position."""

    def __init__(self, analysis: FileAnalysis, ancestors: Sequence[cst.CSTNode]) -> None:
        self.a = analysis
        self.ancestors = ancestors

    # scalar literal S
    def is_scalar_literal(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, (cst.Integer, cst.Float)):
            return True
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            return self.is_scalar_literal(node.expression)
        if isinstance(node, cst.Name) and node.value in ("True", "False"):
            return True
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "float" \
                and len(node.args) == 1:
            return (string_value(node.args[0].value) or "").strip().lower() in ("inf", "-inf", "+inf", "nan",
                                                                                 "infinity", "-infinity")
        qual = self.a.qualname(node)
        if qual in ("math.inf", "math.nan", "torch.inf", "torch.nan", "numpy.inf", "numpy.nan"):
            return True
        if isinstance(node, cst.Attribute) and node.attr.value in ("min", "max") and isinstance(node.value, cst.Call):
            return self.a.call_qualname(node.value) == "torch.finfo"
        return False

    def scalar_magnitude(self, node: cst.BaseExpression) -> float | None:
        """Numeric value of a literal scalar, ±inf for infinities, None when unknown (finfo, names)."""
        sign = 1.0
        while isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            sign = -sign if isinstance(node.operator, cst.Minus) else sign
            node = node.expression
        if isinstance(node, (cst.Integer, cst.Float)):
            try:
                return sign * float(node.evaluated_value)
            except (ValueError, OverflowError):
                return None
        if isinstance(node, cst.Name) and node.value in ("True", "False"):
            return float(node.value == "True")
        if self.is_scalar_literal(node) and not isinstance(node, cst.Attribute):
            return float("inf")
        return None

    # bool-mask M
    def mask_confidence(self, node: cst.BaseExpression, depth: int = 0) -> Confidence | None:
        if depth > 4:
            return None
        if isinstance(node, cst.Comparison):
            if all(isinstance(c.operator, _COMPARISON_OPS) for c in node.comparisons):
                return Confidence.HIGH
            return None
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            return self.mask_confidence(node.expression, depth + 1) or Confidence.LOW
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
            left = self.mask_confidence(node.left, depth + 1)
            right = self.mask_confidence(node.right, depth + 1)
            return max(filter(None, (left, right)), default=None)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
            # `(u > 0) * (l == u)`: a product of two boolean tensors is a boolean tensor (a logical and)
            left = self.mask_confidence(node.left, depth + 1)
            right = self.mask_confidence(node.right, depth + 1)
            return min(left, right) if left is not None and right is not None else None
        if isinstance(node, cst.Call):
            if self.a.call_qualname(node) in _MASK_FUNCTIONS:
                return Confidence.HIGH
            if method_name(node) in _MASK_METHODS:
                return Confidence.HIGH
            if method_name(node) == "to" and any(self.a.qualname(arg.value) == "torch.bool" for arg in node.args):
                return Confidence.HIGH
            return None
        if isinstance(node, cst.Name):
            bindings = self.a.reaching_bindings(node.value, self.ancestors)
            if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN and bindings[0].value is not None:
                found = self.mask_confidence(bindings[0].value, depth + 1)
                if found is not None:
                    return found
            return Confidence.LOW if _MASK_NAME.search(node.value) else None
        if isinstance(node, cst.Attribute):
            return Confidence.LOW if _MASK_NAME.search(node.attr.value) else None
        key = string_key(node)  # `samples["loss_mask"]`
        return Confidence.LOW if key is not None and _MASK_NAME.search(key) else None

    # tensor evidence: True (surely a tensor), False (surely not), None (unknown)
    def is_tensor(self, node: cst.BaseExpression, depth: int = 0) -> bool | None:
        if depth > 5:
            return None
        if isinstance(node, (cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp,
                             cst.SimpleString, cst.FormattedString, cst.ConcatenatedString, cst.Integer, cst.Float)):
            return False
        if isinstance(node, cst.Call):
            qual = self.a.call_qualname(node) or ""
            if qual.startswith(_NUMPY_PREFIXES) or qual in ("numpy.array", "numpy.asarray"):
                return False
            if isinstance(node.func, cst.Name) and node.func.value in _NON_TENSOR_CALLS and not qual:
                return False
            if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in TENSOR_FACTORIES | {
                    "matmul", "softmax", "log_softmax", "sigmoid", "exp", "log", "einsum", "bmm", "mm", "gather",
                    "masked_fill", "clamp", "topk", "sum", "mean", "logical_not", "logical_and", "logical_or"}:
                return True
            if qual.startswith("torch.nn.functional."):
                return True
            name = method_name(node)
            if name in _NON_TENSOR_METHODS:
                return False
            if name in _TENSOR_ONLY_METHODS and name not in _SHARED_WITH_NUMPY:
                return True
            if name in _SHARED_WITH_NUMPY and isinstance(node.func, cst.Attribute):
                return self.is_tensor(node.func.value, depth + 1)
            return None
        if isinstance(node, cst.Comparison):
            return self.is_tensor(node.left, depth + 1)
        if isinstance(node, cst.BinaryOperation):
            left, right = self.is_tensor(node.left, depth + 1), self.is_tensor(node.right, depth + 1)
            if left or right:
                return True
            if left is False and right is False:
                return False
            return None
        if isinstance(node, cst.UnaryOperation):
            return self.is_tensor(node.expression, depth + 1)
        if isinstance(node, cst.Subscript):
            return self.is_tensor(node.value, depth + 1)
        if isinstance(node, cst.Name):
            bindings = self.a.reaching_bindings(node.value, self.ancestors)
            verdicts = {self.is_tensor(b.value, depth + 1) if b.kind is BindingKind.ASSIGN and b.value is not None
                        else None for b in bindings}
            if verdicts == {True}:
                return True
            if verdicts == {False}:
                return False
            return None
        return None

    # CUDA-target evidence D
    def device_of(self, node: cst.BaseExpression | None, depth: int = 0) -> Device | None:
        if node is None or depth > 4:
            return None
        text = string_value(node)
        if text is not None:
            if re.fullmatch(r"cuda(:\d+)?", text):
                return Device.CUDA
            return Device.CPU if text == "cpu" else None
        if isinstance(node, cst.FormattedString):
            first = node.parts[0] if node.parts else None
            if isinstance(first, cst.FormattedStringText) and first.value.startswith("cuda"):
                return Device.CUDA
            return None
        if isinstance(node, cst.Integer):
            return Device.CUDA  # .to(0) / .cuda(0): a CUDA ordinal
        if isinstance(node, cst.IfExp):
            branches = {self.device_of(node.body, depth + 1), self.device_of(node.orelse, depth + 1)}
            if Device.CUDA in branches or Device.MAYBE_CUDA in branches:
                return Device.MAYBE_CUDA
            return Device.CPU if branches == {Device.CPU} else None
        if isinstance(node, cst.Call):
            qual = self.a.call_qualname(node)
            if qual == "torch.device" and node.args:
                return self.device_of(node.args[0].value, depth + 1)
            if qual in ("torch.cuda.current_device",):
                return Device.CUDA
            return None
        if isinstance(node, cst.Name):
            bindings = self.a.reaching_bindings(node.value, self.ancestors)
            found = {self.device_of(b.value, depth + 1) for b in bindings if b.kind is BindingKind.ASSIGN}
            if len(found) == 1:
                return found.pop()
            if found and Device.CPU not in found and None not in found:
                return Device.MAYBE_CUDA
            return None
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
            info = self.a.enclosing_class(self.ancestors)
            bindings = info.attrs.get(node.attr.value, []) if info else []
            found = {self.device_of(b.value, depth + 1) for b in bindings if b.kind is BindingKind.ASSIGN}
            return found.pop() if len(found) == 1 else None
        return None

    def mapped_argument(self, call: cst.Call, keyword: str) -> cst.BaseExpression | None:
        """The value a `**mapping` argument passes for `keyword`, where the mapping is a name or `self.` attribute
        bound only to `dict(keyword=...)` or `{"keyword": ...}` (`x.to(**self.tpdv)` with
        `self.tpdv = dict(dtype=torch.float32, device=device)`)."""
        for arg in call.args:
            if arg.star != "**":
                continue
            mapping = arg.value
            if isinstance(mapping, cst.Name):
                bindings = self.a.reaching_bindings(mapping.value, self.ancestors)
            elif isinstance(mapping, cst.Attribute) and isinstance(mapping.value, cst.Name) \
                    and mapping.value.value == "self" and (info := self.a.enclosing_class(self.ancestors)):
                bindings = info.attrs.get(mapping.attr.value, [])
            else:
                continue
            entries = [_mapping_entry(b.value, keyword) if b.kind is BindingKind.ASSIGN else None for b in bindings]
            if len(entries) == 1 and entries[0] is not None:
                return entries[0]
        return None

    # CPU-source evidence P
    def is_loader(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        if depth > 5:  # (`b = next(it)` <- `it = iter(train_loader)` <- `train_loader = DataLoader(...)`)
            return False
        if isinstance(node, cst.Call):
            qual = self.a.call_qualname(node) or ""
            if qual.endswith("DataLoader"):
                return True
            func = dotted_name(node.func) or ""
            if func.rsplit(".", 1)[-1] in ("enumerate", "tqdm", "iter", "islice", "zip", "trange") and node.args:
                return self.is_loader(node.args[0].value, depth + 1)
            return isinstance(node.func, cst.Name) and (self._returns_loader(node.func.value)
                                                        or self._yields_batches_of_loader(node, depth))
        if isinstance(node, cst.Subscript):  # `loaders[phase]` of `loaders = {"train": DataLoader(...), ...}`
            return self.is_loader(node.value, depth + 1)
        if isinstance(node, cst.IfExp):  # `tqdm(enumerate(loader)) if is_train else enumerate(loader)`
            return self.is_loader(node.body, depth + 1) and self.is_loader(node.orelse, depth + 1)
        if isinstance(node, cst.Dict):
            return bool(node.elements) and all(isinstance(e, cst.DictElement) and self.is_loader(e.value, depth + 1)
                                               for e in node.elements)
        dotted = dotted_name(node)
        if dotted is None:
            return False
        if _LOADER_NAME.search(dotted.rsplit(".", 1)[-1]):
            return True
        if isinstance(node, cst.Name):
            return any(b.kind is BindingKind.ASSIGN and b.value is not None and self.is_loader(b.value, depth + 1)
                       for b in self.a.bindings_of(node.value, self.ancestors))
        return False

    def _returns_loader(self, name: str) -> bool:
        """`def make_loader(ds): return DataLoader(ds, ...)`, defined once in this file."""
        definitions = self.a.functions.get(name, [])
        if len(definitions) != 1:
            return False
        returned = [n.value for n in walk(definitions[0].body) if isinstance(n, cst.Return) and n.value is not None]
        return bool(returned) and all(isinstance(value, cst.Call) and (
            self.a.call_qualname(value) or "").endswith("DataLoader") for value in returned)

    def _yields_batches_of_loader(self, call: cst.Call, depth: int) -> bool:
        """`infiniteloop(dataloader)` with `def infiniteloop(dataloader): while True: for x, y in dataloader: yield
        x`: a generator of this file re-yielding a parameter's items (the call graph's `#yields-parameter:`
        marker), called with a loader there."""
        assert isinstance(call.func, cst.Name)
        definitions = self.a.functions.get(call.func.value, [])
        if len(definitions) != 1:
            return False
        prefix = f"{self.a.key_of(definitions[0])}#yields-parameter:"
        parameters = [p.name.value for p in definitions[0].params.params]
        position = next((i for i, name in enumerate(parameters) if prefix + name in self.a.program_keys), None)
        if position is None:
            return False
        argument = call_arg(call, parameters[position], position)
        return argument is not None and self.is_loader(argument.value, depth + 1)

    def is_cpu_source(self, node: cst.BaseExpression, depth: int = 0, before: int | None = None) -> bool:
        """True when `node` is host data: a DataLoader batch (or part of one), from_numpy, a CPU factory.
        `before`: the names in `node` are read at the statement of that order (a binding's value), not here."""
        if depth > 5:
            return False
        if isinstance(node, cst.Call):
            qual = self.a.call_qualname(node) or ""
            if qual == "torch.from_numpy":
                return True
            if qual == "torch.autograd.Variable" and node.args:  # the legacy wrapper returns its tensor
                return self.is_cpu_source(node.args[0].value, depth + 1, before)
            if isinstance(node.func, cst.Attribute) and method_name(node) not in ("to", "cuda") \
                    and self.is_loader(node.func.value):
                return True  # `train_loader.next_batch()`: a batch a loader built on the host
            if isinstance(node.func, cst.Name) and node.func.value == "next" and node.args \
                    and self.is_loader(node.args[0].value, depth + 1):
                return True
            if qual == "ray.get" and node.args:  # what a Ray actor's method returned
                return self.is_cpu_source(node.args[0].value, depth + 1, before)
            if self.samples_host_batch(node):
                return True
            if qual in ("torch.tensor", "torch.as_tensor") and call_arg(node, "device") is None:
                data = call_arg(node, "data", 0)
                return data is not None and self._host_data(data.value, depth + 1)
            if LEGACY_HOST_TENSOR.fullmatch(qual) and node.args and not isinstance(
                    node.args[0].value, (cst.List, cst.Tuple)):  # `torch.FloatTensor(batch)` (a few Python numbers
                return not is_numeric_literal(node.args[0].value)  # are GPU013's business): a legacy CPU type
                # makes a CPU tensor of whatever it is given (a CUDA tensor raises)
            if method_name(node) in ("cpu", "pin_memory", "float", "long", "half", "int", "contiguous",
                                     "permute", "squeeze", "unsqueeze", "view", "reshape") \
                    and isinstance(node.func, cst.Attribute):
                return method_name(node) == "cpu" or self.is_cpu_source(node.func.value, depth + 1, before)
            if qual in ("torch.cat", "torch.stack") and node.args and node.args[0].keyword is None:
                # `torch.cat(views, dim=0)` of a batch's views (or a list of host pieces) stays on the host
                pieces = node.args[0].value
                if isinstance(pieces, (cst.List, cst.Tuple)) and pieces.elements:
                    return all(self.is_cpu_source(e.value, depth + 1, before) for e in pieces.elements)
                return self.is_cpu_source(pieces, depth + 1, before)
            return False
        if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) \
                and self._items_converted_on_host(node.value.value):
            return True
        if isinstance(node, cst.BinaryOperation) and (is_numeric_literal(node.left) or is_numeric_literal(node.right)):
            # `mask = 1 - batch["padded"].float()`: arithmetic with a number stays where the tensor is
            return self.is_cpu_source(node.right if is_numeric_literal(node.left) else node.left, depth + 1, before)
        if isinstance(node, (cst.Subscript, cst.Attribute)) and not (
                isinstance(node, cst.Attribute) and dotted_name(node) and dotted_name(node).startswith("self.")):
            return self.is_cpu_source(node.value, depth + 1, before)
        if isinstance(node, cst.Name):
            iterated = self._comprehension_iterable(node.value)
            if iterated is not None:  # `[t.to(device) for t in batch]`
                return self.is_cpu_source(iterated, depth + 1, before)
            # `x, y = x.float(), y.float()` rebinds a batch: its own `x` is the binding before it
            bindings = self.a.reaching_bindings(node.value, self.ancestors) if before is None else \
                [b for b in self.a.bindings_of(node.value, self.ancestors) if b.order < before][-1:]
            for binding in bindings:
                if binding.kind is BindingKind.PARAM:
                    if self._receives_batch(node.value):
                        return True
                elif binding.kind is BindingKind.FOR and binding.value is not None:
                    if self._for_target_is_batch(binding):
                        return True
                elif binding.kind is BindingKind.ASSIGN and binding.value is not None:
                    if self.is_cpu_source(binding.value, depth + 1, binding.order):
                        return True
                elif binding.kind is BindingKind.UNPACK and binding.value is not None:
                    value = binding.value
                    if isinstance(value, cst.Tuple) and binding.path and binding.path[0] < len(value.elements):
                        value = value.elements[binding.path[0]].value
                    if self.is_cpu_source(value, depth + 1, binding.order):
                        return True
        return False

    def receives_observation(self, parameter: str) -> bool:
        """A parameter of the enclosing function that its callers pass what a host-side environment returned
        (`#env-parameter:` marker of the program's call graph: `agent.act(time_step.observation)`): NumPy data."""
        return self._parameter_marked("env-parameter", parameter)

    def _receives_batch(self, parameter: str) -> bool:
        """A parameter of the enclosing function that its callers pass part of a loader's batch (`#batch-parameter:`
        marker of the program's call graph: `for x, y in loader: calc_loss(x, y, model)`)."""
        return self._parameter_marked("batch-parameter", parameter)

    def receives_device_tensor(self, parameter: str) -> bool:
        """A parameter of the enclosing function that every caller passes a GPU tensor for (`#device-parameter:`
        marker of the program's call graph: `log_step(writer, loss, acc, step)` in the training loop)."""
        return self._parameter_marked("device-parameter", parameter)

    def receives_index(self, parameter: str) -> bool:
        """A parameter some caller passes a value named as an index for (`train(..., idx_train)` for `mask_train`:
        the `#index-parameter:` marker of the program's call graph)."""
        return self._parameter_marked("index-parameter", parameter)

    def _parameter_marked(self, marker: str, parameter: str) -> bool:
        function = next((a for a in reversed(self.ancestors) if isinstance(a, cst.FunctionDef)), None)
        return function is not None and f"{self.a.key_of(function)}#{marker}:{parameter}" in self.a.program_keys

    def samples_host_batch(self, call: cst.Call) -> bool:
        """`memory.sample(batch_size)` (or `buffer.sample.remote(n)` through Ray) where the program's call graph
        resolved the callee to a function returning tensors it built on the host (`#host-batch:` marker)."""
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "remote":
            func = func.value
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) \
            else None
        if name is None or not self.a.program_keys:
            return False
        function = next((a for a in reversed(self.ancestors) if isinstance(a, cst.FunctionDef)), None)
        return f"{self.a.key_of(function)}#host-batch:{name}" in self.a.program_keys

    def _comprehension_iterable(self, name: str) -> cst.BaseExpression | None:
        """What a comprehension around the current node iterates to bind `name` (`batch` for `t` in `[t.to(d)
        for t in batch]`)."""
        found = self.comprehension_source(name)
        return found[0] if found is not None and not found[1] else None

    def comprehension_source(self, name: str) -> tuple[cst.BaseExpression, tuple[int, ...]] | None:
        """(iterable, index path of `name` in the target) of the comprehension around the current node that binds
        `name`: (`batch`, ()) for `t` in `[t.to(d) for t in batch]`, (`d.items()`, (1,)) for `v` in `{k: v.item()
        for k, v in d.items()}` (the path of a FOR binding)."""
        for ancestor in reversed(self.ancestors):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, (cst.ListComp, cst.GeneratorExp, cst.SetComp, cst.DictComp)):
                loop: cst.CompFor | None = ancestor.for_in
                while loop is not None:
                    target = loop.target
                    if isinstance(target, cst.Name) and target.value == name:
                        return loop.iter, ()
                    if isinstance(target, (cst.Tuple, cst.List)):
                        for index, element in enumerate(target.elements):
                            if isinstance(element.value, cst.Name) and element.value.value == name:
                                return loop.iter, (index,)
                    loop = loop.inner_for_in
        return None

    def _items_converted_on_host(self, name: str) -> bool:
        """`for key in batch: batch[key] = torch.tensor(batch[key], dtype=...)` in the current function: every item
        stored into `name[...]` there is one of its own items made a tensor on the host (no `device=`)."""
        function = next((n for n in reversed(self.ancestors) if isinstance(n, cst.FunctionDef)), None)
        if function is None:
            return False
        stored = [n.value for n in walk(function.body) if isinstance(n, cst.Assign) for t in n.targets
                  if isinstance(t.target, cst.Subscript) and isinstance(t.target.value, cst.Name)
                  and t.target.value.value == name]
        return bool(stored) and all(
            isinstance(value, cst.Call) and self.a.call_qualname(value) in ("torch.tensor", "torch.as_tensor")
            and call_arg(value, "device") is None and value.args and isinstance(value.args[0].value, cst.Subscript)
            and dotted_name(value.args[0].value.value) == name for value in stored)

    def _host_data(self, node: cst.BaseExpression, depth: int) -> bool:
        """Data a tensor is built from that is known to live on the host: Python lists, NumPy arrays, batch
        values. Literal constants are not batches, and an unknown name may already be a (CUDA) tensor."""
        if depth > 5 or is_numeric_literal(node):
            return False
        if isinstance(node, (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp)):
            return True
        if isinstance(node, cst.Call) and ((self.a.call_qualname(node) or "").startswith("numpy.")
                                           or method_name(node) in ("numpy", "tolist", "astype")):
            return True
        if isinstance(node, cst.Name):
            for binding in self.a.reaching_bindings(node.value, self.ancestors):
                if binding.kind is BindingKind.ASSIGN and binding.value is not None \
                        and self._host_data(binding.value, depth + 1):
                    return True
        return self.is_cpu_source(node, depth)

    def loader_on_device(self, node: cst.BaseExpression, depth: int = 0) -> bool:
        """A loader whose batches arrive on the device: passed through `fabric.setup_dataloaders(...)` or
        `accelerator.prepare(...)` (`for x, y in tqdm(train_loader)` after `train_loader = fabric.setup_...`)."""
        node = _unwrapped_iterable(node)
        if depth > 4:
            return False
        if isinstance(node, cst.Call):
            return method_name(node) in vocab.DEVICE_LOADER_WRAPPERS and isinstance(node.func, cst.Attribute)
        if isinstance(node, cst.Name):
            bindings = self.a.reaching_bindings(node.value, self.ancestors)
            return bool(bindings) and all(b.kind in (BindingKind.ASSIGN, BindingKind.UNPACK) and b.value is not None
                                          and self.loader_on_device(b.value, depth + 1) for b in bindings)
        return False

    def batch_placement_unknown(self, binding: Binding) -> bool:
        """A batch of a loader that arrives as a parameter, in a file that hands loaders to Fabric or Accelerate
        for the device: the caller's loader may deliver device batches (`train(fabric, model, loader)`)."""
        iterable = _unwrapped_iterable(binding.value)
        if not isinstance(iterable, cst.Name) or not self.a.wraps_loaders_for_device():
            return False
        return any(b.kind is BindingKind.PARAM for b in self.a.reaching_bindings(iterable.value, self.ancestors))

    def _for_target_is_batch(self, binding: Binding) -> bool:
        iterable = binding.value
        if not self.is_loader(iterable) or self.loader_on_device(iterable) or self.batch_placement_unknown(binding):
            return False
        # `for i, batch in enumerate(loader)`: index 0 is the counter, not data
        if isinstance(iterable, cst.Call) and (dotted_name(iterable.func) or "").endswith("enumerate"):
            return bool(binding.path) and binding.path[0] == 1
        return True

    # modules
    def is_module(self, node: cst.BaseExpression, depth: int = 0) -> Confidence | None:
        if depth > 4:
            return None
        if isinstance(node, cst.Call):
            qual = self.a.call_qualname(node) or ""
            func = dotted_name(node.func) or ""
            last = func.rsplit(".", 1)[-1]
            if qual.startswith("torch.nn.") and last[:1].isupper() and not qual.startswith(_NN_NOT_MODULES) \
                    and last not in _NN_TENSOR_CLASSES:
                return Confidence.HIGH
            if last in self.a.classes and self.a.classes[last].is_module:
                return Confidence.HIGH
            if last in self.a.program_networks and last not in self.a.classes and last[:1].isupper():
                return Confidence.HIGH  # a network class of another file of the program: `RNDModel(...)`
            if method_name(node) in ("to", "cuda", "cpu", "train", "eval", "float", "half") \
                    and isinstance(node.func, cst.Attribute):
                return self.is_module(node.func.value, depth + 1)
            return None
        if isinstance(node, cst.Name) and node.value == "self":
            info = self.a.enclosing_class(self.ancestors)  # `self(x)` in a method of an nn.Module subclass
            if info is not None and info.is_module:
                return Confidence.HIGH
        if isinstance(node, cst.Name):
            key = (id(self.a.scope_chain(self.ancestors)[0].node), "name", node.value, depth)
            if key not in self.a.module_answers:
                self.a.module_answers[key] = self._name_is_module(node.value, depth)
            return self.a.module_answers[key]
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
            key = (id(self.a.scope_chain(self.ancestors)[0].node), "self", node.attr.value, depth)
            if key not in self.a.module_answers:
                self.a.module_answers[key] = self._self_attribute_is_module(node.attr.value, depth)
            return self.a.module_answers[key]
        return None

    def _name_is_module(self, name: str, depth: int) -> Confidence | None:
        found = []
        for binding in self.a.bindings_of(name, self.ancestors):
            if binding.kind is BindingKind.ASSIGN and binding.value is not None:
                answer = self.is_module(binding.value, depth + 1)
                if answer is None:
                    return None  # one assignment that is not a module settles it
                found.append(answer)
        if found:
            return max(found)
        if name in _parameter_owners(self.a):
            return Confidence.LOW  # a parameter or a global whose `.parameters()` are read: a network
        return None

    def _self_attribute_is_module(self, attr: str, depth: int) -> Confidence | None:
        info = self.a.enclosing_class(self.ancestors)
        if info is not None and attr in registered_tensors(info):
            return None  # `self.register_buffer("x", ...)` / `register_parameter`: a tensor, not a module
        found = []
        for binding in info.attrs.get(attr, []) if info else []:
            if binding.kind is BindingKind.ASSIGN and _moves_itself(binding.value, attr):
                continue  # `self.rnd = self.rnd.to(device)`: what it held before decides
            if binding.kind is BindingKind.ASSIGN:
                answer = self.is_module(binding.value, depth + 1)
                if answer is None:
                    break
                found.append(answer)
        else:
            if found:
                return max(found)
        if f"self.{attr}" in _parameter_owners(self.a):
            return Confidence.LOW  # `self.actor = actor`, `Adam(self.actor.parameters())`: proven by use
        return None

    def is_batch_coupled_module(self, class_info: ClassInfo) -> bool:
        """BatchNorm or dropout built anywhere in the class body (catalog §0.3, B)."""
        for call in iter_calls(class_info.node, into_functions=True):
            if _BATCH_NORM.match(self.a.call_qualname(call) or ""):
                return True
        return False
