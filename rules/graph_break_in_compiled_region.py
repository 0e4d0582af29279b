from __future__ import annotations

import re
from functools import lru_cache

import libcst as cst

from gpulint import Confidence, Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import BindingKind, child_nodes, method_name
from gpulint.program import mentions
from gpulint.semantic.program_text import program_texts

_DISABLE = {"torch.compiler.disable", "torch._dynamo.disable", "torch.compiler.disable_dynamo"}
_DYNAMIC_SHAPE_FUNCTIONS = {"torch.nonzero", "torch.unique", "torch.unique_consecutive", "torch.masked_select",
                            "torch.argwhere"}
_DYNAMIC_SHAPE_METHODS = {"nonzero", "unique", "unique_consecutive", "masked_select", "argwhere"}
_SCALAR_CAPTURE = re.compile(r"capture_scalar_outputs\s*=\s*True")
_DYNAMIC_CAPTURE = re.compile(r"capture_dynamic_output_shape_ops\s*=\s*True")
# `model = torch.compile(model)`, `torch.compile(GPT(config))`, `model.compile()`
_COMPILE_NAME = re.compile(r"\btorch\.compile\(\s*(?:self\.)?(\w+)\s*[,)]|\b(?:self\.)?(\w+)\.compile\(\s*[)\w]")
_COMPILE_INSTANCE = re.compile(r"\btorch\.compile\(\s*([A-Z]\w*)\(")
_CLASS_BLOCK = re.compile(r"^class[ \t]+(\w+)[^\n]*:[ \t]*\n((?:[ \t]+[^\n]*\n|[ \t]*\n)*)", re.M)
_CONSTRUCTED = re.compile(r"\b([A-Z]\w*)\(")

_SYNC = "`{}` in a torch.compile'd region: graph break and host sync"
_PRINT = "`print` of a computed tensor in a torch.compile'd region: graph break"
_BRANCH = "Python branch on a tensor value in a torch.compile'd region: graph break (data-dependent control flow)"
_DYNAMIC = "Data-dependent output shape (`{}`) in a torch.compile'd region: graph break"


class GraphBreakInCompiledRegion(Rule):
    """
    ## What it does
    Finds constructs that break the graph inside code that `torch.compile` traces: `.item()`, `.tolist()`,
    `float(t)` / `int(t)` / `bool(t)` of a tensor, `print` of a computed tensor, `if` / `while` / `x if c else y`
    on a tensor value,
    boolean-mask reads `x[mask]`, and ops with a data-dependent output shape (`nonzero`, `unique`,
    `masked_select`, one-argument `torch.where`). Compiled code is a function decorated with or passed to
    `torch.compile`, and the `forward` (and the `self.` methods it calls) of a module class whose instance is
    compiled anywhere in the program, including the submodules that class builds.

    ## Why is this slow
    Each break splits the compiled graph: Dynamo returns to Python, runs the construct eagerly, and starts a
    new graph, so the ops around it are not fused, and under `mode="reduce-overhead"` every break is a CUDA
    graph partition boundary. `.item()`-like reads also stall the host until the GPU catches up. torch docs
    ("Common Graph Breaks"): "torch.compile graph breaks on data-dependent operations such as data-dependent
    control flow ... and direct tensor data accesses (.item, .data_ptr)". On an H100, a
    gather-compute-scatter step had 1 break and 3 CUDA-graph partitions; the `torch.where` form had none.

    ## Example
    ```python
    @torch.compile
    def step(x, mask):
        if mask.any():
            x = x[mask] * 2
        return x.sum().item()
    ```

    ## Use instead
    ```python
    @torch.compile
    def step(x, mask):
        x = torch.where(mask, x * 2, x)
        return x.sum()  # read it outside the compiled region, as rarely as possible
    ```

    ## Fix safety
    Suggestion only: the replacement depends on the construct (`torch.where`, masked arithmetic,
    `torch.cond`, moving logging out of the compiled function). Not reported, because torch 2.13 does not break
    there: `assert` on a tensor (Dynamo turns it into `torch._assert`), `print` of constants, shapes or the
    function's own inputs, `x[mask] = scalar`. `.item()` is not reported when the program sets
    `torch._dynamo.config.capture_scalar_outputs = True`, nor dynamic-shape ops with
    `capture_dynamic_output_shape_ops = True`. Code under `torch.compiler.disable` is skipped.
    """

    code = "GPU042"
    name = "graph-break-in-compiled-region"
    message = "Graph break in a torch.compile'd region"
    severity = Severity.WARNING
    safety = Safety.SUGGEST
    priority = "P2"
    triggers = ("compile", "def forward")
    examples = [
        Valid(
            """
            import torch
            @torch.compile
            def step(x, mask):
                x = torch.where(mask, x * 2, x)
                if x.dim() == 2:
                    x = x.masked_fill(x > 10, 0.0)
                return x.sum()
            """
        ),
        Valid(  # not compiled
            """
            import torch
            def log(loss):
                print(loss.item())
            """
        ),
        Invalid(
            """
            import torch
            @torch.compile
            def step(x, mask):
                if (x > 0).any():
                    x = x[x > 0]
                return x.sum().item()
            """,
            count=3,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def forward(self, x):
                    print(x.shape)
                    print("mean", x.mean())
                    return x
            model = torch.compile(Net())
            """,
            count=1,
        ),
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._texts: list[str] | None = None
        self._compiled_classes: frozenset[str] | None = None
        self._verdicts: dict[int, bool] = {}

    # -- where ------------------------------------------------------------------------------------------------

    def _in_compiled_code(self) -> bool:
        function = None
        for node in reversed(self.ctx.ancestors):
            if isinstance(node, cst.FunctionDef):
                function = node
                break
        if function is None:
            return False
        key = id(function)
        if key not in self._verdicts:
            self._verdicts[key] = self._function_is_compiled(function)
        return self._verdicts[key]

    def _function_is_compiled(self, function: cst.FunctionDef) -> bool:
        for node in self.ctx.ancestors:
            if isinstance(node, cst.FunctionDef) and any(
                    self.ctx.qualname(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
                    in _DISABLE for d in node.decorators):
                return False
        if self.ctx.is_compiled():
            return True
        info = self.ctx.analysis.function_class.get(id(function))
        if info is None or not info.is_module or info.node.name.value not in self._classes():
            return False
        name = function.name.value
        return name == "forward" or name in _methods_called_from_forward(info.node)

    def _program(self) -> list[str]:
        if self._texts is None:
            self._texts = program_texts(self.ctx)
        return self._texts

    def _classes(self) -> frozenset[str]:
        if self._compiled_classes is None:
            self._compiled_classes = _compiled_classes(tuple(self._program()))
        return self._compiled_classes

    def _capture(self, pattern: re.Pattern[str]) -> bool:
        return any(mentions(pattern, text) for text in self._program())

    # -- what -------------------------------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        name = method_name(node)
        qual = self.ctx.qualname(node.func)
        if name in ("item", "tolist") and not node.args and qual is None:
            if self._in_compiled_code() and not (name == "item" and self._capture(_SCALAR_CAPTURE)):
                self.report(node, _SYNC.format(f".{name}()"))
            return
        if isinstance(node.func, cst.Name) and qual is None:
            builtin = node.func.value
            if builtin == "print" and any(_tensor_value(self.ctx, a.value) for a in node.args if a.keyword is None) \
                    and self._in_compiled_code():
                self.report(node, _PRINT)
            elif builtin in ("float", "int", "bool") and len(node.args) == 1 and not node.args[0].star \
                    and self.ctx.evidence.is_tensor(node.args[0].value) and self._in_compiled_code() \
                    and not self._capture(_SCALAR_CAPTURE):
                self.report(node, _SYNC.format(f"{builtin}(tensor)"))
            return
        dynamic = None
        if qual in _DYNAMIC_SHAPE_FUNCTIONS:
            dynamic = qual
        elif qual == "torch.where" and len(node.args) == 1 and not node.args[0].star:
            dynamic = "torch.where(condition)"
        elif qual is None and name in _DYNAMIC_SHAPE_METHODS and not any(a.keyword and a.keyword.value == "size"
                                                                         for a in node.args):
            dynamic = f".{name}()"
        if dynamic and self._in_compiled_code() and not self._capture(_DYNAMIC_CAPTURE):
            self.report(node, _DYNAMIC.format(dynamic))

    def visit_If(self, node: cst.If) -> None:
        self._branch(node.test)

    def visit_While(self, node: cst.While) -> None:
        self._branch(node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._branch(node.test)

    def _branch(self, test: cst.BaseExpression) -> None:
        if _tensor_test(self.ctx, test) and self._in_compiled_code():
            self.report(test, _BRANCH)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        parent = self.ctx.parent()
        if isinstance(parent, cst.AssignTarget) and parent.target is node:
            return  # `x[mask] = scalar` is a masked_fill under compile; a tensor value is read as `y[mask]`
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return
        index = node.slice[0].slice.value
        evidence = self.ctx.evidence
        if evidence.mask_confidence(index) is not Confidence.HIGH or evidence.is_tensor(node.value) is False:
            return
        if self._in_compiled_code() and not self._capture(_DYNAMIC_CAPTURE):
            self.report(node, _DYNAMIC.format("x[mask]"))


def _tensor_test(ctx, test: cst.BaseExpression) -> bool:
    """Is a branch condition a tensor (so Python must read its value)?"""
    if isinstance(test, cst.BooleanOperation):
        return _tensor_test(ctx, test.left) or _tensor_test(ctx, test.right)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _tensor_test(ctx, test.expression)
    if isinstance(test, cst.Comparison):
        if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in test.comparisons):
            return False
        return ctx.evidence.is_tensor(test) is True
    if isinstance(test, cst.Call) and method_name(test) in ("any", "all") and isinstance(test.func, cst.Attribute):
        return ctx.evidence.is_tensor(test.func.value) is not False
    if isinstance(test, cst.Call) and ctx.qualname(test.func) in ("torch.any", "torch.all", "torch.isnan",
                                                                  "torch.isinf", "torch.equal"):
        return ctx.qualname(test.func) != "torch.equal"  # torch.equal returns a Python bool
    return ctx.evidence.is_tensor(test) is True and not isinstance(test, (cst.Name, cst.Attribute))


_NOT_TENSOR_METHODS = {"size", "dim", "numel", "item", "tolist", "keys", "values", "items", "get", "join", "format",
                       "__len__", "element_size", "nelement", "stride", "is_contiguous", "data_ptr"}
_TENSOR_METHODS = {"sum", "mean", "max", "min", "std", "var", "norm", "abs", "argmax", "argmin", "float", "double",
                   "half", "detach", "clone", "exp", "log", "softmax", "sigmoid", "amax", "amin", "prod", "cpu",
                   "to", "round", "sqrt", "square", "pow", "count_nonzero", "all", "any", "logsumexp"}
_NOT_TENSOR_MODULES = ("torch.cuda.", "torch.distributed.", "torch.backends.", "torch.compiler.", "torch._dynamo.",
                       "torch.get_", "torch.is_")


def _tensor_value(ctx, node: cst.BaseExpression, depth: int = 0) -> bool:
    """Does printing `node` format a tensor computed inside the function? (Printing constants, shapes and the
    function's inputs does not break the graph in torch 2.13; printing an intermediate tensor does.)"""
    if depth > 4:
        return False
    if isinstance(node, cst.FormattedString):
        return any(_tensor_value(ctx, part.expression, depth + 1) for part in node.parts
                   if isinstance(part, cst.FormattedStringExpression))
    if isinstance(node, (cst.Tuple, cst.List)):
        return any(_tensor_value(ctx, e.value, depth + 1) for e in node.elements)
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, cst.Modulo) and isinstance(node.left, (cst.SimpleString, cst.ConcatenatedString)):
            return _tensor_value(ctx, node.right, depth + 1)
        return _tensor_value(ctx, node.left, depth + 1) or _tensor_value(ctx, node.right, depth + 1)
    if isinstance(node, cst.UnaryOperation):
        return _tensor_value(ctx, node.expression, depth + 1)
    if isinstance(node, cst.Call):
        name = method_name(node)
        if name == "format" and isinstance(node.func, cst.Attribute) \
                and isinstance(node.func.value, (cst.SimpleString, cst.ConcatenatedString)):
            return any(_tensor_value(ctx, a.value, depth + 1) for a in node.args)
        if name in _NOT_TENSOR_METHODS:
            return False
        qual = ctx.qualname(node.func) or ""
        if qual.startswith("torch."):
            return not qual.startswith(_NOT_TENSOR_MODULES)
        return name in _TENSOR_METHODS or ctx.evidence.is_tensor(node) is True
    if isinstance(node, cst.Subscript):
        value = node.value
        if isinstance(value, cst.Attribute) and value.attr.value == "shape":
            return False
        return _tensor_value(ctx, value, depth + 1)
    if isinstance(node, cst.Name):
        bindings = ctx.analysis.reaching_bindings(node.value, ctx.ancestors)
        return any(b.kind is BindingKind.ASSIGN and b.value is not None and _tensor_value(ctx, b.value, depth + 1)
                   for b in bindings)
    return False


@lru_cache(maxsize=4096)
def _class_bodies(text: str) -> tuple[tuple[str, str], ...]:
    """(name, indented body) of the top-level classes of one file; a file is shared by many programs."""
    return tuple((match.group(1), match.group(2)) for match in _CLASS_BLOCK.finditer(text))


@lru_cache(maxsize=64)
def _compiled_classes(texts: tuple[str, ...]) -> frozenset[str]:
    """Module classes whose instances are compiled in the program, with the classes they construct (their
    submodules are traced too). Remembered: the files of one program share it."""
    bodies: dict[str, str] = {}
    for text in texts:
        for name, body in _class_bodies(text):
            bodies.setdefault(name, body)
    roots: set[str] = set()
    for text in texts:
        roots.update(_COMPILE_INSTANCE.findall(text))
        for match in _COMPILE_NAME.finditer(text):
            name = match.group(1) or match.group(2)
            if name in ("torch", "re", "self") or not name:
                continue
            if name in bodies:
                roots.add(name)
            for bound in re.finditer(rf"\b(?:self\.)?{re.escape(name)}\s*=\s*([A-Z]\w*)\(", text):
                roots.add(bound.group(1))
    found = {r for r in roots if r in bodies}
    frontier = set(found)
    while frontier:
        nested = {c for r in frontier for c in _CONSTRUCTED.findall(bodies[r]) if c in bodies} - found
        found |= nested
        frontier = nested
    return frozenset(found)


def _methods_called_from_forward(cls: cst.ClassDef) -> set[str]:
    called: set[str] = set()
    for statement in cls.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == "forward":
            stack: list[cst.CSTNode] = [statement.body]
            while stack:
                current = stack.pop()
                if isinstance(current, cst.Call) and isinstance(current.func, cst.Attribute) \
                        and isinstance(current.func.value, cst.Name) and current.func.value.value == "self":
                    called.add(current.func.attr.value)
                stack.extend(child_nodes(current))
    return called
