"""Boolean masks: is an index a mask, is it aligned with what it indexes, is the assignment hot."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import libcst as cst

from gpulint import Confidence, HotKind
from gpulint.analysis import (
    _NON_TENSOR_CALLS,
    _NON_TENSOR_METHODS,
    _NUMPY_PREFIXES,
    _SHARED_WITH_NUMPY,
    _TENSOR_ONLY_METHODS,
    TENSOR_FACTORIES,
    BindingKind,
    dotted_name,
    iter_calls,
    method_name,
    string_key,
    walk,
)
from gpulint.rule import RuleContext
from gpulint.semantic import vocab
from gpulint.semantic.placement import HOST, Placement


@dataclass(frozen=True)
class MaskIndex:
    """`x[M]`, `x[:, :, M]`, `x[..., M]`, `x[M, :]`: one bool-mask index among full slices."""

    mask: cst.BaseExpression
    leading: int  # full slices `:` before the mask
    ellipsis: bool  # `...` before the mask (then the mask covers the trailing dims)
    trailing: int  # full slices `:` after the mask


def _is_full_slice(element: cst.SubscriptElement) -> bool:
    part = element.slice
    return isinstance(part, cst.Slice) and part.lower is None and part.upper is None and part.step is None


def _is_ellipsis(element: cst.SubscriptElement) -> bool:
    return isinstance(element.slice, cst.Index) and isinstance(element.slice.value, cst.Ellipsis)


def mask_index_layout(node: cst.Subscript) -> MaskIndex | None:
    """The single candidate mask expression of a subscript and where it sits; None for other forms
    (several indices, int and bool indices mixed, bounded slices, starred indices)."""
    elements = list(node.slice)
    candidates = [i for i, e in enumerate(elements)
                  if isinstance(e.slice, cst.Index) and not _is_ellipsis(e)]
    if len(candidates) != 1:
        return None
    at = candidates[0]
    index = elements[at].slice
    assert isinstance(index, cst.Index)
    if index.star is not None:
        return None
    before, after = elements[:at], elements[at + 1:]
    if not all(_is_full_slice(e) for e in after):
        return None
    ellipses = [e for e in before if _is_ellipsis(e)]
    if ellipses:
        # only `x[..., M]`: the mask covers the trailing dims
        if len(before) != 1 or after:
            return None
        return MaskIndex(index.value, 0, True, 0)
    if not all(_is_full_slice(e) for e in before):
        return None
    return MaskIndex(index.value, len(before), False, len(after))


# Calls whose result is an integer index (or a list of them), never a bool mask.
_INDEX_PRODUCERS = {"nonzero", "argwhere", "argsort", "topk", "sort", "randperm", "arange", "multinomial", "argmax",
                    "argmin", "nms", "batched_nms", "long", "int", "range", "list", "unique", "searchsorted",
                    "bucketize", "indices", "choice", "permutation", "flatnonzero", "tolist", "item", "len"}
_STRONG_MASK_NAME = re.compile(r"mask", re.I)


def mask_confidence(ctx: RuleContext, node: cst.BaseExpression) -> Confidence | None:
    """`ctx.evidence.mask_confidence`, minus names whose reaching assignment is an index producer
    (`keep = nms(...)`, `idx = mask.nonzero()`) and name-only masks that do not say `mask`
    (`keep`, `valid` are often index tensors or NumPy arrays; episode-end flags, `dones`, are masks as indexes)."""
    found = ctx.mask_confidence(node)
    if found is None or found is Confidence.HIGH:
        return found
    if isinstance(node, cst.UnaryOperation):  # `~mask`: judge the operand's name
        node = node.expression
    if isinstance(node, cst.BinaryOperation):
        return None  # `a & b` of name-only operands
    if isinstance(node, cst.Name):
        for binding in ctx.analysis.reaching_bindings(node.value, ctx.ancestors):
            value = binding.value
            if binding.kind is BindingKind.PARAM and ctx.evidence.receives_index(node.value):
                return None  # `mask_train` that the callers pass `idx_train` for
            if binding.kind not in (BindingKind.ASSIGN, BindingKind.UNPACK) or value is None:
                continue
            if _index_like(value):
                return None
        name = node.value
    elif isinstance(node, cst.Attribute):
        name = node.attr.value
    else:
        name = string_key(node) or ""  # `samples["loss_mask"]`
    return Confidence.LOW if _STRONG_MASK_NAME.search(name) or vocab.EPISODE_END_NAME.match(name) else None


def _index_like(value: cst.BaseExpression) -> bool:
    """An assigned value that is (or may be) an integer index: `nms(...)`, `x.nonzero()`, `data.train_idx`,
    `data.train_mask if ... else data.train_idx`."""
    if isinstance(value, cst.IfExp):
        return _index_like(value.body) or _index_like(value.orelse)
    if isinstance(value, cst.Call):
        last = (dotted_name(value.func) or "").rsplit(".", 1)[-1]
        return last in _INDEX_PRODUCERS or (last == "where" and len(value.args) == 1)
    while isinstance(value, cst.Subscript):
        value = value.value
    name = value.attr.value if isinstance(value, cst.Attribute) else value.value if isinstance(value, cst.Name) else ""
    return bool(vocab.INDEX_NAME.search(name))


# torch.<op>(...) results that are tensors (top level of the torch namespace).
_TORCH_TENSOR_OPS = {
    "any", "all", "isnan", "isinf", "isfinite", "isin", "isneginf", "isposinf", "where", "sum", "mean", "max", "min",
    "amax", "amin", "abs", "exp", "log", "log1p", "sqrt", "rsqrt", "sigmoid", "tanh", "relu", "softmax",
    "log_softmax", "matmul", "mm", "bmm", "einsum", "cat", "concat", "stack", "gather", "scatter", "masked_fill",
    "clamp", "clip", "topk", "sort", "argsort", "argmax", "argmin", "norm", "logical_and", "logical_or",
    "logical_not", "logical_xor", "eq", "ne", "gt", "ge", "lt", "le", "maximum", "minimum", "count_nonzero",
    "cumsum", "cumprod", "diff", "flatten", "reshape", "squeeze", "unsqueeze", "transpose", "permute", "outer",
    "dot", "lerp", "sign", "round", "floor", "ceil", "nonzero", "unique", "bincount", "addmm", "baddbmm",
    "index_select", "masked_select", "narrow", "chunk", "split", "roll", "flip", "diag", "tril", "triu", "trace",
    "logsumexp", "prod", "std", "var", "median", "mul", "add", "sub", "div", "pow", "neg", "square", "erf",
    "cosine_similarity", "cdist", "repeat_interleave", "broadcast_to", "expand_copy", "full", "zeros", "ones",
    "empty", "arange", "eye", "linspace", "logspace", "zeros_like", "ones_like", "full_like", "empty_like",
    "tensor", "as_tensor", "from_numpy", "rand", "randn", "randint", "randperm", "normal", "bernoulli",
    "rand_like", "randn_like", "randint_like", "multinomial", "nan_to_num", "real", "imag", "view_as_real",
}
# Attributes and methods of a tensor that are host-side metadata, never tensors.
STATIC_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "training", "is_leaf", "grad_fn",
                "layout", "is_sparse", "is_quantized", "is_meta", "names"}
STATIC_METHODS = {"size", "dim", "numel", "ndimension", "nelement", "element_size", "is_contiguous",
                  "is_floating_point", "is_complex", "data_ptr", "item", "tolist", "numpy", "get_device",
                  "stride", "storage_offset", "is_pinned", "has_names", "is_set_to", "is_shared", "__len__",
                  "keys", "values", "items", "startswith", "endswith", "isdigit", "lower", "upper"}
_ANNOTATION_TENSOR = re.compile(r"\bTensor\b")
_ANNOTATION_NOT_TENSOR = re.compile(r"\b(ndarray|np\.|numpy|list|List|int|float|bool|str|dict|Dict|Sequence)\b")


def tensor_verdict(ctx: RuleContext, node: cst.BaseExpression, depth: int = 0, at: int | None = None) -> bool | None:
    """True: surely a tensor; False: surely not (NumPy, Python data, tensor metadata); None: unknown.

    Like `ctx.evidence.is_tensor`, plus torch ops, nn.Module calls, `Tensor`-annotated parameters,
    `self.<buffer>` registered or built with a torch factory, and metadata (`.shape`, `.size()`, ...). Names
    resolve to the assignment reaching the statement being judged: `at` is that statement's order when the
    value of an earlier assignment is judged (so `h = h * 2` looks at the `h` before it)."""
    if depth > 8:
        return None
    if isinstance(node, (cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp,
                         cst.GeneratorExp, cst.SimpleString, cst.FormattedString, cst.ConcatenatedString,
                         cst.Integer, cst.Float, cst.Imaginary, cst.Lambda)):
        return False
    if isinstance(node, cst.Attribute) and node.attr.value in STATIC_ATTRS:
        return False
    if isinstance(node, cst.Call):
        return _call_verdict(ctx, node, depth, at)
    if isinstance(node, cst.Subscript):
        if isinstance(node.value, cst.Attribute) and node.value.attr.value in STATIC_ATTRS:
            return False
        container = tensor_verdict(ctx, node.value, depth + 1, at)
        if container is False and string_key(node) is not None:
            return None  # `samples["loss_mask"]` of a dict: an entry, which may be a tensor
        return container
    if isinstance(node, cst.UnaryOperation):
        if isinstance(node.operator, cst.Not):
            return False
        return tensor_verdict(ctx, node.expression, depth + 1, at)
    if isinstance(node, cst.BinaryOperation):
        left = tensor_verdict(ctx, node.left, depth + 1, at)
        right = tensor_verdict(ctx, node.right, depth + 1, at)
        if left or right:
            return True
        return False if left is False and right is False else None
    if isinstance(node, cst.Comparison):
        if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in node.comparisons):
            return False
        verdicts = [tensor_verdict(ctx, node.left, depth + 1, at)] + [
            tensor_verdict(ctx, c.comparator, depth + 1, at) for c in node.comparisons]
        if len(node.comparisons) > 1:
            return False if all(v is False for v in verdicts) else None  # chained: `a < t < b` is `and`
        if True in verdicts:
            return True
        return False if all(v is False for v in verdicts) else None
    if isinstance(node, cst.BooleanOperation):
        return False  # `a and b` is an operand, not a tensor result we can judge; operands are tested apart
    if isinstance(node, cst.IfExp):
        body, orelse = tensor_verdict(ctx, node.body, depth + 1, at), tensor_verdict(ctx, node.orelse, depth + 1, at)
        return body if body == orelse else None
    if isinstance(node, cst.Name):
        if node.value in ("True", "False", "None"):
            return False
        return _name_verdict(ctx, node, depth, at)
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return _self_attr_verdict(ctx, node.attr.value, depth)
    return None


def _call_verdict(ctx: RuleContext, node: cst.Call, depth: int, at: int | None) -> bool | None:
    name = method_name(node)
    if name == "get":
        return None  # `kwargs.get("mask")`: whatever the mapping holds
    if name in STATIC_METHODS or name in _NON_TENSOR_METHODS:
        return False
    qual = ctx.qualname(node.func) or ""
    if qual.startswith(_NUMPY_PREFIXES) or qual.startswith(("math.", "random.")):
        return False
    if isinstance(node.func, cst.Name) and node.func.value in _NON_TENSOR_CALLS and not qual:
        return False
    if qual.startswith(("torch.nn.functional.", "torch.linalg.", "torch.special.", "torch.fft.")):
        return True
    if qual.startswith("torch.") and qual.count(".") == 1 and qual[6:] in _TORCH_TENSOR_OPS | TENSOR_FACTORIES:
        return True
    if qual in ("torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Buffer"):
        return True
    if ctx.evidence.is_module(node.func) is not None:
        return True  # `self.encoder(x)`: a module's output (also one proven a network by its `.parameters()`)
    if name == "forward" and isinstance(node.func, cst.Attribute) and ctx.evidence.is_module(node.func.value):
        return True  # `self.q_next.forward(states)`
    if name is not None and isinstance(node.func, cst.Attribute):
        if name in _TENSOR_ONLY_METHODS and name not in _SHARED_WITH_NUMPY:
            return True
        if name in _SHARED_WITH_NUMPY or name in vocab.TENSOR_PRESERVING_METHODS:
            return tensor_verdict(ctx, node.func.value, depth + 1, at)
    return None


def _name_verdict(ctx: RuleContext, node: cst.Name, depth: int, at: int | None) -> bool | None:
    bindings = ctx.analysis.bindings_of(node.value, ctx.ancestors)
    here = at if at is not None else ctx.analysis.statement_order(ctx.ancestors)
    before = [b for b in bindings if b.order < here]
    bindings = [before[-1]] if before else bindings
    if not bindings:
        return None
    verdicts = set()
    for binding in bindings:
        if binding.kind is BindingKind.ASSIGN and binding.value is not None:
            verdicts.add(tensor_verdict(ctx, binding.value, depth + 1, binding.order))
        elif binding.kind is BindingKind.PARAM:  # annotated `Tensor`, or every caller passes a GPU tensor
            verdicts.add(_param_verdict(ctx, node.value) or ctx.evidence.receives_device_tensor(node.value) or None)
        elif binding.kind is BindingKind.UNPACK and isinstance(binding.value, (cst.Tuple, cst.List)) \
                and len(binding.path) == 1 and binding.path[0] < len(binding.value.elements) \
                and not any(isinstance(e, cst.StarredElement) for e in binding.value.elements):
            # `l, u = b.floor().long(), b.ceil().long()`: the element bound to this name
            verdicts.add(tensor_verdict(ctx, binding.value.elements[binding.path[0]].value, depth + 1, binding.order))
        elif binding.kind is BindingKind.UNPACK and isinstance(binding.value, cst.Call) and \
                ctx.evidence.is_module(binding.value.func) is Confidence.HIGH:
            verdicts.add(True)  # `out, hidden = self.rnn(x)`
        elif binding.kind is BindingKind.UNPACK and isinstance(binding.value, cst.Call) and \
                _call_verdict(ctx, binding.value, depth + 1, binding.order) is False:
            verdicts.add(False)  # `a, b = np.split(...)`, `n, d = x.shape`-like calls
        else:
            verdicts.add(None)
    if verdicts == {True}:
        return True
    if verdicts == {False}:
        return False
    return None


def _param_verdict(ctx: RuleContext, name: str) -> bool | None:
    for node in reversed(ctx.ancestors):
        if isinstance(node, cst.FunctionDef):
            params = node.params
            for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
                if param.name.value == name:
                    if param.annotation is None:
                        return None
                    text = ctx.code(param.annotation.annotation)
                    if _ANNOTATION_TENSOR.search(text):
                        return True
                    return False if _ANNOTATION_NOT_TENSOR.search(text) else None
            return None
    return None


def _self_attr_verdict(ctx: RuleContext, attr: str, depth: int) -> bool | None:
    info = ctx.analysis.enclosing_class(ctx.ancestors)
    if info is None:
        return None
    for call in _class_calls(info.node):
        if method_name(call) == "register_buffer" and call.args:
            first = call.args[0].value
            if isinstance(first, cst.SimpleString) and first.evaluated_value == attr:
                return True
    if any(b.kind is BindingKind.AUGMENT and b.value is not None and tensor_verdict(ctx, b.value, depth + 1) is True
           for b in info.attrs.get(attr, [])):
        return True  # `self.tokens += (y >= 0).sum()`: a tensor from the first update on
    bindings = [b for b in info.attrs.get(attr, []) if b.kind is BindingKind.ASSIGN and b.value is not None]
    if not bindings or not all(isinstance(b.value, cst.Call) for b in bindings):
        return None  # `self.k = k`: names in the value belong to another function's scope
    verdicts = {tensor_verdict(ctx, b.value, depth + 1) for b in bindings}
    if verdicts == {True}:
        return True
    return False if verdicts == {False} else None


def _class_calls(node: cst.ClassDef) -> list[cst.Call]:
    return list(iter_calls(node, into_functions=True))


def numpy_in_file(ctx: RuleContext) -> bool:
    return any(target == "numpy" or target.startswith("numpy.") for target in ctx.analysis.aliases.values())


def is_pure(node: cst.BaseExpression) -> bool:
    """A receiver we may evaluate twice: names, attributes, subscripts by ints/names/plain slices."""
    if isinstance(node, cst.Name):
        return True
    if isinstance(node, cst.Attribute):
        return is_pure(node.value)
    if isinstance(node, cst.Subscript):
        for element in node.slice:
            part = element.slice
            if isinstance(part, cst.Index):
                if not isinstance(part.value, (cst.Integer, cst.Name)) and not (
                        isinstance(part.value, cst.UnaryOperation) and isinstance(part.value.expression, cst.Integer)):
                    return False
            elif isinstance(part, cst.Slice):
                if any(p is not None and not isinstance(p, (cst.Integer, cst.Name, cst.UnaryOperation))
                       for p in (part.lower, part.upper, part.step)):
                    return False
        return is_pure(node.value)
    return False


def same_code(ctx: RuleContext, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return _squash(ctx.code(a)) == _squash(ctx.code(b))


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text).strip("()")


def mentions(ctx: RuleContext, expr: cst.BaseExpression, receiver: cst.BaseExpression) -> bool:
    """Is `receiver` (textually) an operand of the comparison / mask call `expr`?"""
    target = _squash(ctx.code(receiver))
    operands: list[cst.BaseExpression] = []
    if isinstance(expr, cst.Comparison):
        operands = [expr.left] + [c.comparator for c in expr.comparisons]
    elif isinstance(expr, cst.Call):
        if isinstance(expr.func, cst.Attribute) and method_name(expr) in ("isnan", "isinf", "isfinite", "bool"):
            operands = [expr.func.value]
        elif ctx.qualname(expr.func) in ("torch.isnan", "torch.isinf", "torch.isfinite") and expr.args:
            operands = [expr.args[0].value]
    elif isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.BitInvert):
        return mentions(ctx, expr.expression, receiver)
    return any(_squash(ctx.code(o)) == target for o in operands)


_LIKE = {"torch.zeros_like", "torch.ones_like", "torch.empty_like", "torch.full_like", "torch.rand_like",
         "torch.randn_like"}
_SAME_SHAPE_METHODS = {"clone", "detach", "contiguous", "float", "half", "bfloat16", "double", "to", "zero_",
                       "fill_", "abs", "neg", "exp", "log", "sigmoid", "tanh", "relu"}


def _same_shape_as(ctx: RuleContext, receiver: cst.BaseExpression, depth: int = 0) -> list[cst.BaseExpression]:
    """`receiver` and the expressions it provably has the shape of: `out = torch.zeros_like(x)` -> [out, x]."""
    found = [receiver]
    if depth > 3 or not isinstance(receiver, cst.Name):
        return found
    bindings = ctx.analysis.reaching_bindings(receiver.value, ctx.ancestors)
    if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN or not isinstance(bindings[0].value, cst.Call):
        return found
    value = bindings[0].value
    if ctx.qualname(value.func) in _LIKE and value.args and value.args[0].keyword is None:
        source = value.args[0].value
    elif method_name(value) in _SAME_SHAPE_METHODS and isinstance(value.func, cst.Attribute) and (
            method_name(value) != "to" or all(a.keyword is not None or not isinstance(a.value, (cst.Tuple, cst.List))
                                              for a in value.args)):
        source = value.func.value
    else:
        return found
    if isinstance(source, cst.Name) and source.value == receiver.value:
        return found
    return found + _same_shape_as(ctx, source, depth + 1)


def mask_matches_receiver(ctx: RuleContext, mask: cst.BaseExpression, receiver: cst.BaseExpression) -> bool:
    """The mask is provably shaped like the receiver: a comparison / isnan of the receiver itself (or of a
    tensor the receiver was made `*_like` / cloned from), directly or through a name assigned once from one
    (`neg = x < 0; x[neg] = 0`)."""
    shapes = _same_shape_as(ctx, receiver)
    masks = [mask]
    if isinstance(mask, cst.Name):
        bindings = ctx.analysis.reaching_bindings(mask.value, ctx.ancestors)
        if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN and bindings[0].value is not None:
            masks.append(bindings[0].value)
    return any(mentions(ctx, m, shape) for m in masks for shape in shapes)


def aligned_mask(ctx: RuleContext, layout: MaskIndex, receiver: cst.BaseExpression) -> str | None:
    """Source text of the mask broadcast-aligned to the receiver (catalog `_align`), or None when that would
    evaluate a compound mask expression more than once."""
    mask_text = ctx.code(layout.mask)
    if layout.ellipsis:
        return mask_text
    if layout.leading == 0 and mask_matches_receiver(ctx, layout.mask, receiver):
        return mask_text
    if not isinstance(layout.mask, (cst.Name, cst.Attribute)) or not is_pure(layout.mask):
        return None
    return _reshaped(ctx, layout, receiver, mask_text)


def _reshaped(ctx: RuleContext, layout: MaskIndex, receiver: cst.BaseExpression, mask_text: str) -> str:
    offset = f" - {layout.leading}" if layout.leading else ""
    return f"{mask_text}.reshape({mask_text}.shape + (1,) * ({ctx.code(receiver)}.dim(){offset} - {mask_text}.dim()))"


def statement_indent(ctx: RuleContext) -> tuple[str, str]:
    """(indentation of the statement being visited, one more level of the innermost block's indentation)."""
    default = ctx.module.default_indent
    blocks = [b for b in ctx.ancestors if isinstance(b, cst.IndentedBlock)]
    indent = "".join(b.indent if b.indent is not None else default for b in blocks)
    unit = blocks[-1].indent if blocks and blocks[-1].indent is not None else default
    return indent, unit


def _position_among(ancestors: list[cst.CSTNode], node: cst.CSTNode) -> int | None:
    """The last index of `node` in the ancestor chain, or None."""
    return max((i for i, a in enumerate(ancestors) if a is node), default=None)


def standalone_statement(ctx: RuleContext, node: cst.BaseSmallStatement) -> bool:
    """`node` is the only statement of its line, and that line sits in a block (not `if c: x[m] = v`)."""
    ancestors = ctx.ancestors
    at = _position_among(ancestors, node)
    if at is None:
        return False
    line = ancestors[at - 1] if at >= 1 else None
    block = ancestors[at - 2] if at >= 2 else None
    return isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(
        block, (cst.IndentedBlock, cst.Module))


def fresh_name(ctx: RuleContext, base: str) -> str:
    """`base`, or `base_1`, `base_2`, ...: a name used nowhere in the file."""
    used = _module_names(ctx.module) | set(ctx.analysis.aliases)  # anywhere in the file: locals and globals
    name, index = base, 0
    while name in used:
        index += 1
        name = f"{base}_{index}"
    return name


_MODULE_NAMES: list[tuple[cst.Module, set[str]]] = []  # the last module's names (asked once per site)


def _module_names(module: cst.Module) -> set[str]:
    if not _MODULE_NAMES or _MODULE_NAMES[0][0] is not module:
        _MODULE_NAMES[:] = [(module, {n.value for n in walk(module, into_functions=True) if isinstance(n, cst.Name)})]
    return _MODULE_NAMES[0][1]


def _mask_base_name(mask: cst.BaseExpression) -> str:
    if isinstance(mask, cst.UnaryOperation) and isinstance(mask.operator, cst.BitInvert) and isinstance(
            mask.expression, cst.Name):
        return f"not_{mask.expression.value}"
    return "mask"


# A dtype guard makes a rewrite exact for a mask known only by its name: the bool branch runs the rewrite,
# anything else (an integer index tensor) runs the original statement.
GUARD_NOTE = ("the mask is known only by its name: the rewrite runs under a dtype guard (`if m.dtype == torch.bool`), "
              "the original statement in the other branch")


def mask_rewrite(ctx: RuleContext, node: cst.Assign, site: "MaskAssignment", method: str,
                 build: Callable[[str], str]) -> tuple[str | None, str | None, tuple]:
    """Text replacing the assignment `node` (`x[M] = v`) by `build(aligned mask text)`, the note saying why
    it could not be rewritten, and the imports the text needs. A compound mask that would have to be reshaped is
    bound to a fresh name first; a mask known only by its name (`x[~legal] = v`) is rewritten under a dtype
    guard, with the original statement kept for non-bool masks. Masks that come from a comparison or a logical
    op need neither proof nor guard."""
    guarded = site.confidence is not Confidence.HIGH and _guardable(site.layout.mask)
    blocker = site.rewrite_blocker(method, guarded=guarded)
    if blocker is not None:
        return None, blocker, ()
    lines: list[str] = []
    aligned = aligned_mask(ctx, site.layout, site.receiver)
    if aligned is None:
        name = fresh_name(ctx, _mask_base_name(site.layout.mask))
        lines.append(f"{name} = {ctx.code(site.layout.mask)}")
        aligned = _reshaped(ctx, site.layout, site.receiver, name)
    lines.append(build(aligned))
    imports: tuple = ()
    if guarded:
        operand = site.layout.mask.expression if isinstance(site.layout.mask, cst.UnaryOperation) else site.layout.mask
        operand_text = ctx.code(operand)
        bool_text, imports = ctx.spell("torch.bool")
        tensor_text, more = ctx.spell("torch.Tensor")
        imports = tuple(dict.fromkeys(imports + more))
        guard = f"{operand_text}.dtype == {bool_text}"
        if tensor_verdict(ctx, operand) is not True and not (
                ctx.hot_kind() in (HotKind.FORWARD, HotKind.COMPILED) and not numpy_in_file(ctx)):
            guard = f"isinstance({operand_text}, {tensor_text}) and {guard}"
        if not standalone_statement(ctx, node):
            return None, COMPOUND_MASK_NOTE, ()
        indent, unit = statement_indent(ctx)
        body = "".join(f"{indent}{unit}{line}\n" for line in lines)
        original = ctx.code(node).strip()
        return f"if {guard}:\n{body}{indent}else:\n{indent}{unit}{original}", GUARD_NOTE, imports
    if len(lines) > 1:
        if not standalone_statement(ctx, node):
            return None, COMPOUND_MASK_NOTE, ()
        indent, _ = statement_indent(ctx)
        return f"\n{indent}".join(lines), None, ()
    return lines[0], None, ()


def _in_dtype_guard_else(ctx: RuleContext, mask: cst.BaseExpression) -> bool:
    """The `else:` branch of `if m.dtype == torch.bool:` (a guard this module wrote): `m` is not boolean there."""
    operand = mask.expression if isinstance(mask, cst.UnaryOperation) else mask
    if not isinstance(operand, cst.Name):
        return False
    ancestors = ctx.ancestors
    for index in range(len(ancestors) - 1, 0, -1):
        node, parent = ancestors[index], ancestors[index - 1]
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(node, cst.Else) and isinstance(parent, cst.If) and parent.orelse is node:
            for n in walk(parent.test):
                if isinstance(n, cst.Comparison) and isinstance(n.left, cst.Attribute) \
                        and n.left.attr.value == "dtype" and isinstance(n.left.value, cst.Name) \
                        and n.left.value.value == operand.value and ctx.qualname(n.comparisons[0].comparator) == "torch.bool":
                    return True
    return False


def _guardable(mask: cst.BaseExpression) -> bool:
    """A name, or its bitwise not: the names a dtype guard can test."""
    if isinstance(mask, cst.UnaryOperation) and isinstance(mask.operator, cst.BitInvert):
        mask = mask.expression
    return isinstance(mask, cst.Name)


def consumed_as_tensor(ctx: RuleContext, node: cst.CSTNode) -> bool:
    """The current expression `node` is an argument of a torch / torch.nn.functional call or an nn.Module call,
    or the receiver of a tensor-only method: then it is a tensor."""
    ancestors = ctx.ancestors
    at = _position_among(ancestors, node)
    if at is None:
        return False
    parent = ancestors[at - 1] if at >= 1 else None
    if isinstance(parent, cst.Attribute) and parent.value is node and at >= 2:
        call = ancestors[at - 2]
        if isinstance(call, cst.Call) and call.func is parent:
            return ctx.evidence.is_tensor(call) is True and parent.attr.value not in ("sum", "mean", "max", "min")
        return False
    if isinstance(parent, cst.Arg) and at >= 2 and isinstance(ancestors[at - 2], cst.Call):
        call = ancestors[at - 2]
        assert isinstance(call, cst.Call)
        qual = ctx.qualname(call.func) or ""
        if qual.startswith(("torch.nn.functional.", "torch.linalg.")):
            return True
        if qual.startswith("torch.") and qual.count(".") == 1 and qual[6:] in _TORCH_TENSOR_OPS:
            return True
        return ctx.evidence.is_module(call.func) is Confidence.HIGH
    return False


def mask_site_evidence(ctx: RuleContext, receiver: cst.BaseExpression, mask: cst.BaseExpression,
                       consumed_as_tensor: bool = False) -> bool | None:
    """Should a bool-mask site be reported? None: do not report. Otherwise: is the receiver tensor-evident?
    Sites need positive tensor evidence (of the receiver, the mask, or, for reads, of the selection being
    consumed by a torch op), except in forward / compiled code of a file that does not use NumPy."""
    receiver_is = tensor_verdict(ctx, receiver)
    mask_is = tensor_verdict(ctx, mask)
    if receiver_is is False or mask_is is False:
        return None
    receiver_is = receiver_is or consumed_as_tensor or None
    evident = bool(receiver_is or mask_is)
    kind = ctx.hot_kind()
    if evident:
        return bool(receiver_is)
    if kind in (HotKind.FORWARD, HotKind.COMPILED) and not numpy_in_file(ctx):
        return False  # forward / compiled code of a file without NumPy: operands are tensors in practice
    # training-step loops / functions, and files using NumPy: rollout buffers and Python lists live there
    return None


# Why `aligned_mask` gave no text.
COMPOUND_MASK_NOTE = "bind the mask to a name first: reshaping a compound mask would evaluate it twice"


@dataclass(frozen=True)
class MaskAssignment:
    """`x[mask] = value` in the training step, the forward pass or compiled code (GPU002, GPU003)."""

    receiver: cst.BaseExpression  # x
    layout: MaskIndex
    confidence: Confidence
    receiver_is_tensor: bool

    def rewrite_blocker(self, method: str, guarded: bool = False) -> str | None:
        """Why the mask or the receiver keep the assignment from being rewritten to `method`, or None
        (`guarded`: the rewrite will run under a dtype guard, so the mask need not be proven boolean)."""
        if self.confidence is not Confidence.HIGH and not guarded:
            return f"the mask is known only by its name; make sure it is a bool tensor, then use `{method}`"
        if not self.receiver_is_tensor:
            return "the receiver is not known to be a tensor"
        if not is_pure(self.receiver):
            return "the receiver expression would be evaluated twice"
        return None


def hot_mask_assignment(ctx: RuleContext, node: cst.Assign) -> MaskAssignment | None:
    """`node` as a bool-mask assignment worth reporting, or None."""
    if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Subscript):
        return None
    if not ctx.in_hot_region():
        return None
    target = node.targets[0].target
    layout = mask_index_layout(target)
    if layout is None or _in_dtype_guard_else(ctx, layout.mask):
        return None
    confidence = mask_confidence(ctx, layout.mask)
    if confidence is None and _inverted(layout.mask) and isinstance(layout.mask.expression, cst.Name):  # type: ignore[attr-defined]
        confidence = Confidence.LOW  # `x[~legal] = v`: bitwise not of a name, as an index, is a mask in practice
    if confidence is None:
        return None
    if confidence is not Confidence.HIGH and not _inverted(layout.mask) and not _episode_end_flags(layout.mask):
        return None  # `x[mask] = v` with a name-only mask: `mask` may hold integer indices (no sync, no fix)
    receiver_is_tensor = mask_site_evidence(ctx, target.value, layout.mask)
    if receiver_is_tensor is None:
        return None
    placement = Placement(ctx)
    if placement.built_on_host(target.value) or placement.built_on_host(layout.mask) \
            or placement.of(target.value) == HOST:
        return None  # a tensor or mask this code made on the CPU (or read back, `.cpu()`): the nonzero runs on the
        # host, no GPU sync
    return MaskAssignment(target.value, layout, confidence, receiver_is_tensor)


def _episode_end_flags(mask: cst.BaseExpression) -> bool:
    """`q_next[dones] = 0.0`: episode-end flags as an index can only be a bool mask (0/1 integers would pick rows 0
    and 1, floats raise)."""
    name = mask.attr.value if isinstance(mask, cst.Attribute) else mask.value if isinstance(mask, cst.Name) else ""
    return bool(vocab.EPISODE_END_NAME.match(name))


def _inverted(mask: cst.BaseExpression) -> bool:
    """`~mask`: bitwise-not of a name only makes sense as an index when the name holds booleans."""
    return isinstance(mask, cst.UnaryOperation) and isinstance(mask.operator, cst.BitInvert)
