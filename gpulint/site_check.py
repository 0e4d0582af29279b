"""Per-site verification: run the user's own original and rewritten statement on synthetic tensors.

A site is checked only when it is safe to run: every call goes to torch (minus I/O, process and global-state
APIs), to `math`, to a short list of pure builtins, or is a method of a value the snippet computed; no imports,
definitions, loops, lambdas or private/dunder attributes; every free name can be bound to a synthetic tensor, a
mask, a device string, a dtype or a small int. The namespace holds only those bindings, torch and `math`, with a
restricted `__builtins__`, so no user function can be reached. Sites that are not safe, or that fail with every
binding tried, fall back to the rule's own micro-check. This module imports torch; only the verifier loads it.
"""

from __future__ import annotations

import ast
import builtins
import math
import textwrap
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Iterable

SAFE_BUILTINS = ("abs", "all", "any", "bool", "dict", "enumerate", "float", "int", "isinstance", "len", "list",
                 "max", "min", "range", "reversed", "round", "slice", "sorted", "sum", "tuple", "zip", "True",
                 "False", "None", "Ellipsis", "ValueError", "TypeError", "RuntimeError", "IndexError")
# torch namespaces that touch files, processes, global state or compilation caches are never called.
DENIED_TORCH = ("torch.save", "torch.load", "torch.hub", "torch.distributed", "torch.multiprocessing",
                "torch.utils", "torch.onnx", "torch.jit", "torch.compile", "torch.backends", "torch.library",
                "torch.ops", "torch._", "torch.export", "torch.package", "torch.cuda", "torch.mps", "torch.xpu",
                "torch.profiler", "torch.autograd", "torch.set_", "torch.manual_seed", "torch.seed",
                "torch.use_deterministic_algorithms", "torch.random", "torch.serialization", "torch.accelerator",
                "torch.fx", "torch.testing", "torch.nn.Module", "torch.optim")
# A loop or a definition could run unboundedly or hide a call; none of the rewrites needs one.
DISALLOWED_NODES = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
                    ast.Global, ast.Nonlocal, ast.Await, ast.Yield, ast.YieldFrom, ast.While, ast.For,
                    ast.AsyncFor, ast.AsyncWith, ast.Raise, ast.Assert, ast.Try, ast.NamedExpr)
SHAPES = ((4, 8), (5, 5), (2, 4, 8, 8), (16,), (3, 5, 7))  # (5, 5): a row mask also fits columns
MAX_PLANS = 5  # bindings (shape, mask shape) the original runs on that are compared, at most
SEEDS = (11, 12)
MAX_LITERAL = 1 << 20  # user code runs for real: `torch.zeros(10**9)` must not allocate 4 GB here
_SHAPE_METHODS = {"view", "reshape", "size", "expand", "repeat", "transpose", "permute", "split", "chunk",
                  "narrow", "unsqueeze", "squeeze", "flatten", "sum", "mean", "softmax", "log_softmax", "argmax",
                  "max", "min", "cumsum", "topk", "movedim", "amax", "amin", "std", "var", "norm"}
_FACTORIES = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "eye", "linspace",
              "logspace", "tril_indices", "triu_indices", "randperm"}
_INT_KEYWORDS = {"dim", "axis", "dims", "start_dim", "end_dim", "k", "diagonal"}


@dataclass
class SiteResult:
    status: str  # "equal", "differs" or "fallback"
    reason: str = ""

    def to_json(self) -> dict:
        return asdict(self)


class _Unsafe(Exception):
    """The snippet cannot be run safely; the rule's micro-check stands in for it."""


def _parse(text: str, column: int) -> ast.Module:
    """A statement span lost its first line's indentation; an expression span is parsed as it stands."""
    for candidate in (textwrap.dedent(" " * (column - 1) + text), text.strip()):
        try:
            return ast.parse(candidate)
        except SyntaxError:
            continue
    raise _Unsafe("the replaced text is not a statement or expression on its own")


def torch_aliases(module_text: str, extra_imports: Iterable[str] = ()) -> dict[str, str]:
    """Names the file binds to torch or math modules and functions (`F` -> torch.nn.functional)."""
    aliases: dict[str, str] = {}
    sources = [module_text, *extra_imports]
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in ("torch", "math"):
                        if alias.asname:
                            aliases[alias.asname] = alias.name
                        else:
                            root = alias.name.split(".")[0]
                            aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if node.module.split(".")[0] in ("torch", "math"):
                    for alias in node.names:
                        if alias.name != "*":
                            aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _shape_names(node: ast.AST) -> list[str]:
    """Names that stand for sizes in a shape expression: `n`, `(n, m)`, `(n,) + (m,)`."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [name for element in node.elts for name in _shape_names(element)]
    if isinstance(node, ast.BinOp):
        return _shape_names(node.left) + _shape_names(node.right)
    return []


class _Inspection(ast.NodeVisitor):
    """Rejects unsafe snippets and records how each free name is used (to pick what to bind it to)."""

    def __init__(self, aliases: dict[str, str], module_names: set[str]) -> None:
        self.aliases = aliases
        self.module_names = module_names
        self.loaded: list[str] = []
        self.stored: list[str] = []
        self.usage: dict[str, str] = {}
        self.keys: dict[str, set[str]] = {}  # string keys read from mapping-like names

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, DISALLOWED_NODES):
            raise _Unsafe(f"contains {type(node).__name__.lower()}")
        super().generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, int) and abs(node.value) > MAX_LITERAL:
            raise _Unsafe(f"a literal size of {node.value} would allocate a real tensor that large")

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, (ast.Pow, ast.LShift, ast.Mult)) and isinstance(node.left, ast.Constant) \
                and isinstance(node.right, ast.Constant):
            if isinstance(node.op, (ast.Pow, ast.LShift)) and not (isinstance(node.right.value, (int, float))
                                                                  and node.right.value <= 64):
                raise _Unsafe("a large constant power")  # evaluating 9 ** 10**9 alone would hang
            try:
                value = eval(compile(ast.Expression(node), "<literal>", "eval"), {"__builtins__": {}})  # noqa: S307
            except Exception:  # noqa: BLE001 - e.g. 2 ** "x": the snippet fails anyway
                value = 0
            if isinstance(value, int) and abs(value) > MAX_LITERAL:
                raise _Unsafe(f"a computed size of {value} would allocate a real tensor that large")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            raise _Unsafe(f"reaches private attribute .{node.attr}")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id.startswith("__"):
            raise _Unsafe(f"uses {node.id}")
        (self.stored if isinstance(node.ctx, ast.Store) else self.loaded).append(node.id)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        index = node.slice
        if isinstance(node.value, ast.Name) and isinstance(index, ast.Constant) and isinstance(index.value, str):
            self.usage[node.value.id] = "mapping"  # batch["input_ids"]
            self.keys.setdefault(node.value.id, set()).add(index.value)
        for element in index.elts if isinstance(index, ast.Tuple) else [index]:
            if isinstance(element, ast.Name):
                self.usage.setdefault(element.id, "mask")
            elif isinstance(element, ast.UnaryOp) and isinstance(element.operand, ast.Name):
                self.usage.setdefault(element.operand.id, "mask")  # x[~mask]
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if isinstance(node.value, ast.Name):
            kind = {"device": "device", "dtype": "dtype"}.get(node.arg or "")
            if kind is None and node.arg in _INT_KEYWORDS:
                kind = "int"
            if kind:
                self.usage[node.value.id] = kind
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        dotted = _dotted(node.func)
        if dotted is not None and dotted[0] in self.aliases:
            qualname = ".".join([self.aliases[dotted[0]], *dotted[1:]])
            if any(qualname == d or qualname.startswith(d if d.endswith("_") else d + ".") or
                   (d.endswith("_") and qualname.startswith(d)) for d in DENIED_TORCH):
                raise _Unsafe(f"calls {qualname}")
            if qualname.startswith("math.") or qualname.rpartition(".")[2] in _FACTORIES:
                for arg in node.args:  # shape arguments: torch.zeros((steps, envs) + (dim,))
                    for name in _shape_names(arg):
                        self.usage[name] = "int"
        elif isinstance(node.func, ast.Name):
            if node.func.id in self.module_names or node.func.id not in SAFE_BUILTINS:
                raise _Unsafe(f"calls {node.func.id}()")
            if node.func.id == "range":
                for arg in node.args:
                    if isinstance(arg, ast.Name):
                        self.usage[arg.id] = "int"
        elif isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in ("to", "cuda") and node.args and isinstance(node.args[0], ast.Name):
                self.usage[node.args[0].id] = "device"
            elif method in _SHAPE_METHODS:
                for arg in node.args:
                    if isinstance(arg, ast.Name):
                        self.usage.setdefault(arg.id, "int")
            root = _dotted(node.func.value)
            if root is not None and root[0] in self.module_names:
                raise _Unsafe(f"calls a method of {root[0]}")
        self.generic_visit(node)


def _inspect(tree: ast.Module, aliases: dict[str, str], module_names: set[str]) -> _Inspection:
    inspection = _Inspection(aliases, module_names)
    inspection.visit(tree)
    return inspection


def _free_names(tree: ast.Module, aliases: dict[str, str]) -> list[str]:
    """Names read before the snippet itself binds them, in order of first use."""
    bound: set[str] = set()
    free: list[str] = []
    for statement in tree.body:
        reads = [n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        if isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
            reads.append(statement.target.id)
        for name in reads:
            if name not in bound and name not in aliases and name not in SAFE_BUILTINS and name not in free:
                free.append(name)
        bound.update(n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return free


def _plans() -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Tensor shape and mask shape: masks as large as the tensor, over its rows (x[m]) or its last dim (x[:, m])."""
    plans = []
    for shape in SHAPES:
        for mask_shape in dict.fromkeys((shape, shape[:1], shape[-1:])):
            plans.append((shape, mask_shape))
    return plans


def _bind(usage: str, keys: set[str], shape: tuple[int, ...], mask_shape: tuple[int, ...], device: str, torch: Any,
          generator: Any) -> Any:
    if usage == "mapping":
        return {key: torch.randn(shape, generator=generator).to(device) for key in sorted(keys)}
    if usage == "mask":
        return torch.rand(mask_shape, generator=generator).to(device) > 0.5
    if usage == "device":
        return device
    if usage == "dtype":
        return torch.float32
    if usage == "int":
        return 1
    return torch.randn(shape, generator=generator).to(device)


def _namespace(torch: Any, aliases: dict[str, str]) -> dict[str, Any]:
    import importlib

    # torch's C++ bindings import modules lazily through __import__; the snippet itself cannot name it (names
    # starting with "__" are rejected by _Inspection).
    allowed = {n: getattr(builtins, n) for n in (*SAFE_BUILTINS, "__import__")}
    namespace: dict[str, Any] = {"__builtins__": allowed}
    for alias, qualname in aliases.items():
        module, _, attribute = qualname.rpartition(".")
        try:
            namespace[alias] = importlib.import_module(qualname)
        except ImportError:
            try:
                namespace[alias] = getattr(importlib.import_module(module), attribute)
            except (ImportError, AttributeError):
                continue
    namespace.setdefault("math", math)
    namespace.setdefault("torch", torch)
    return namespace


def _execute(code: Any, free: list[str], inspection: _Inspection, plan: tuple, seed: int, device: str,
             aliases: dict[str, str], torch: Any) -> dict[str, Any]:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    namespace = _namespace(torch, aliases)
    for name in free:
        namespace[name] = _bind(inspection.usage.get(name, "tensor"), inspection.keys.get(name, set()), *plan,
                                device, torch, generator)
    torch.manual_seed(seed)
    exec(code, namespace)  # noqa: S102 - only torch, math, safe builtins and synthetic tensors are reachable
    return namespace


def _as_program(tree: ast.Module) -> Any:
    """An expression statement keeps its value in `__value__` so that it can be compared."""
    body = list(tree.body)
    if len(body) == 1 and isinstance(body[0], ast.Expr):
        body = [ast.Assign(targets=[ast.Name("__value__", ast.Store())], value=body[0].value)]
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    return compile(module, "<site>", "exec")


def _comparable(value: Any, torch: Any) -> bool:
    """Tensors and plain values; a function or context manager object has no meaningful equality."""
    if isinstance(value, (tuple, list)):
        return all(_comparable(v, torch) for v in value)
    return value is None or isinstance(value, (torch.Tensor, bool, int, float, complex, str, torch.dtype))


def _same(a: Any, b: Any, rtol: float, atol: float, torch: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() and not torch.equal(torch.isnan(a), torch.isnan(b)):
            return False
        return bool(torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)) if a.dtype != torch.bool \
            else bool(torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y, rtol, atol, torch) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values are not equal
        return False


def check_site(original: str, rewritten: str, column: int, module_text: str, extra_imports: Iterable[str] = (),
               rtol: float = 0.0, atol: float = 0.0, device: str = "cpu") -> SiteResult:
    """Run `original` and `rewritten` (texts as they appear in the file) on a few synthetic bindings."""
    import torch

    # Real data differs from the rule's own check inputs: reductions may re-associate, so a rewrite that is exact
    # in the rule's check still gets float-rounding slack here. A wrong rewrite is off by far more.
    rtol, atol = max(rtol, 1e-5), max(atol, 1e-6)
    try:
        aliases = torch_aliases(module_text, extra_imports)
        module_names = _module_level_names(module_text) - set(aliases)
        before_tree, after_tree = _parse(original, column), _parse(rewritten, column)
        before, after = _inspect(before_tree, aliases, module_names), _inspect(after_tree, aliases, module_names)
    except _Unsafe as why:
        return SiteResult("fallback", str(why))
    free = _free_names(before_tree, aliases)
    if "self" in free or "cls" in free:
        return SiteResult("fallback", "reads attributes of self")
    unknown = [n for n in _free_names(after_tree, aliases) if n not in free]
    if unknown:
        return SiteResult("fallback", f"the rewrite reads {', '.join(unknown)}, which the original does not")
    compared = ([n for n in dict.fromkeys(before.stored) if n in set(after.stored)]
                + [n for n in free if before.usage.get(n, "tensor") in ("tensor", "mask")])
    before_code, after_code = _as_program(before_tree), _as_program(after_tree)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compared_plans = 0
        for plan in _plans():
            try:
                _execute(before_code, free, before, plan, SEEDS[0], device, aliases, torch)
            except Exception:  # noqa: BLE001 - this binding does not fit the code; try the next one
                continue
            for seed in SEEDS:
                first = _execute(before_code, free, before, plan, seed, device, aliases, torch)
                try:
                    second = _execute(after_code, free, before, plan, seed, device, aliases, torch)
                except Exception as error:  # noqa: BLE001 - the original ran on this input, the rewrite did not
                    return SiteResult("differs", f"the rewrite raised {type(error).__name__} on {_describe(plan)}")
                names = [n for n in [*compared, "__value__"] if n in first and _comparable(first[n], torch)]
                if not names:
                    return SiteResult("fallback", "the snippet produces no tensor or number to compare")
                for name in names:
                    if not _same(first.get(name), second.get(name), rtol, atol, torch):
                        return SiteResult("differs", f"`{name}` differs on {_describe(plan)}")
            compared_plans += 1
            if compared_plans == MAX_PLANS:
                break
        if compared_plans:
            return SiteResult("equal", f"equal on {compared_plans} input shapes x {len(SEEDS)} random draws")
    return SiteResult("fallback", "no synthetic binding runs the original")


def _describe(plan: tuple) -> str:
    shape, mask_shape = plan
    return f"tensors of shape {shape}" + (f", masks of shape {mask_shape}" if mask_shape != shape else "")


def _module_level_names(module_text: str) -> set[str]:
    """Names the file imports or defines: calling one of them could run user code, so such sites fall back."""
    try:
        tree = ast.parse(module_text)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names
