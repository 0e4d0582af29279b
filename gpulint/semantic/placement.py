"""Where a value lives (host / device / tensor of unknown place / not a tensor) with the evidence
that decided it, and how often a site runs within its loop (every N steps, after a first-iteration
guard, on an error path)."""

from __future__ import annotations

import re
from typing import Iterable

import libcst as cst

from gpulint import Device, HotKind
from gpulint.analysis import (BindingKind, call_arg, child_nodes, dotted_name, every_many_steps, every_n_steps, method_name,
                             registered_tensors, walk)
from gpulint.rule import RuleContext
from gpulint.semantic import vocab

NONTENSOR = "nontensor"  # Python numbers, strings, NumPy arrays, containers: never a GPU sync
HOST = "host"  # a torch tensor on the CPU
DEVICE = "device"  # a torch tensor with evidence of living on the accelerator
TENSOR = "tensor"  # a torch tensor whose placement is not known
_NON_TENSOR_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "is_leaf", "layout", "names",
                     "training", "is_sparse", "itemsize", "nbytes"}
# PackedSequence.batch_sizes is always a CPU tensor (torch keeps it on the host); the name is used for it
_PACKED_HOST_FIELDS = {"batch_sizes"}
_SAME_PLACE_ATTRS = {"grad", "data", "T", "mT", "H", "mH", "real", "imag"}
_NON_TENSOR_METHODS = {"size", "dim", "numel", "element_size", "stride", "data_ptr", "get_device", "nelement",
                       "is_contiguous", "is_floating_point", "item", "tolist", "numpy", "keys", "values", "items",
                       "format", "join", "split", "strip", "astype", "storage_offset", "dim_order"}
_HOST_METHODS = {"cpu", "pin_memory"}
# Methods of tensors whose result lives where the receiver (and tensor arguments) live.
_TENSOR_METHODS = {
    "detach", "clone", "contiguous", "float", "double", "half", "bfloat16", "long", "int", "short", "bool", "byte",
    "char", "type_as", "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze",
    "permute", "transpose", "t", "expand", "expand_as", "repeat", "narrow", "select", "index_select", "gather",
    "scatter", "scatter_add", "masked_fill", "masked_select", "chunk", "split", "unbind", "sum", "mean", "std",
    "var", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "norm", "abs", "exp", "log", "log1p", "sqrt",
    "rsqrt", "pow", "neg", "sign", "round", "floor", "ceil", "clamp", "clamp_min", "clamp_max", "clip", "sigmoid",
    "tanh", "relu", "softmax", "log_softmax", "logsumexp", "mul", "add", "sub", "div", "matmul", "mm", "bmm",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "any", "all", "isnan",
    "isinf", "isfinite", "topk", "sort", "cumsum", "cumprod", "diff", "square", "mean", "nansum", "nanmean",
    "count_nonzero", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "requires_grad_", "detach_",
    "add_", "mul_", "sub_", "div_", "copy_", "zero_", "fill_", "clamp_", "data_ptr_", "float_power", "median",
    "mode", "kthvalue", "quantile", "dot", "outer", "diag", "diagonal", "trace", "tril", "triu", "flip", "roll",
    "to_dense", "sum_to_size", "lerp", "exp_", "abs_", "masked_fill_", "argsort",
}
# In-place random fills: the result is the receiver, wherever it lives (`torch.empty(1).uniform_(a, b)`).
_FILL_METHODS = {"uniform_", "normal_", "bernoulli_", "random_", "exponential_", "geometric_", "cauchy_",
                 "log_normal_"}
# torch functions computed elementwise on their tensor arguments
_ELEMENTWISE = {"exp", "log", "log1p", "sqrt", "rsqrt", "abs", "neg", "sign", "round", "floor", "ceil", "clamp",
                "clip", "sigmoid", "tanh", "pow", "mul", "add", "sub", "div", "where", "minimum", "maximum", "lerp",
                "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "sin", "cos",
                "remainder", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"}
# Of those, the ones NumPy arrays share: not evidence that an unknown receiver is a tensor.
_NUMPY_SHARED = {"sum", "mean", "std", "var", "prod", "max", "min", "argmax", "argmin", "clip", "reshape",
                 "flatten", "squeeze", "transpose", "repeat", "round", "any", "all", "cumsum", "cumprod", "diagonal",
                 "trace", "dot", "sort", "view", "copy", "fill", "nonzero", "astype", "T", "mean"}
# Of those, the ones `nn.Module` shares (`model.half()`, `net.requires_grad_(False)`): not evidence either.
_MODULE_SHARED = {"float", "double", "half", "bfloat16", "requires_grad_"}
_VARIABLE = {"torch.autograd.Variable", "torch.autograd.variable.Variable"}
_DTYPES = {"float32", "float", "float64", "double", "float16", "half", "bfloat16", "int64", "long", "int32", "int",
           "int16", "short", "int8", "uint8", "bool", "complex64", "complex128"}
_TORCH_NON_TENSOR_FUNCS = {"is_tensor", "numel", "is_floating_point", "is_complex", "is_grad_enabled",
                           "get_default_dtype", "device", "Size", "finfo", "iinfo", "manual_seed", "save", "load",
                           "compile", "no_grad", "enable_grad", "inference_mode", "set_grad_enabled", "autocast",
                           "typename", "is_nonzero", "equal", "allclose", "is_storage", "get_rng_state",
                           "set_printoptions", "seed", "initial_seed", "use_deterministic_algorithms", "dtype",
                           "Generator", "set_default_dtype", "set_default_device", "get_num_threads",
                           "set_num_threads"}
_HOST_CONSTRUCTORS = {"Tensor", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor",
                      "IntTensor", "ShortTensor", "ByteTensor", "CharTensor", "BoolTensor", "from_numpy",
                      "frombuffer"}
_FACTORIES = {"zeros", "ones", "full", "empty", "arange", "eye", "linspace", "logspace", "rand", "randn",
              "randint", "randperm", "normal", "empty_strided", "tril_indices", "triu_indices", "range"}
_LIKE_FACTORIES = {"zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like",
                   "randint_like"}
# Integer index arrays made on the host (what `x[idx]` copies to the device when `x` lives there)
_INDEX_FACTORIES = {"randperm", "arange", "randint", "LongTensor", "IntTensor"}
_NUMPY_INDEX_ARRAYS = {"arange", "permutation", "argsort", "flatnonzero"}
# arrays only when a size is given: keyword or the positional argument at this position (`randint(low, high, size)`,
# `choice(a, size)`, `Generator.integers(low, high, size)`)
_NUMPY_SIZED_DRAWS = {"choice": 1, "randint": 2, "integers": 2}
_GENERATOR_DRAWS = {"permutation", "choice", "integers"}  # `numpy.random.Generator` methods
_RNG_NAME = re.compile(r"rng|random|generator|np_random", re.I)
_BUILTIN_NON_TENSOR = {"len", "range", "int", "float", "bool", "str", "list", "tuple", "dict", "set", "sorted",
                       "enumerate", "zip", "round", "repr", "isinstance", "hasattr", "getattr", "type", "id",
                       "format", "abs", "divmod", "hash", "ord", "chr"}
_CONTAINER_CALLS = {"list", "dict", "tuple", "set", "defaultdict", "OrderedDict", "deque", "collections.defaultdict",
                    "collections.OrderedDict", "collections.deque"}
_DEVICE_NAME = re.compile(r"device|^dev$|_dev$|^dvc$|_dvc$|cuda|gpu|rank", re.I)
_MODEL_NAME = re.compile(r"^(model|net|network|policy|actor|critic|agent|encoder|decoder|generator|discriminator|"
                         r"classifier|backbone|q_net|qnet|q_network|module|ddp_model|raw_model)$|model$|net$", re.I)
_CPU_NAME = re.compile(r"cpu|host", re.I)


def variable_content(ctx: RuleContext, node: cst.BaseExpression) -> cst.BaseExpression | None:
    """The tensor that a legacy `Variable(tensor)` wraps (the wrapper returns it unchanged); None for anything
    else, and for a wrapper given more than its tensor (`requires_grad=True` makes another leaf)."""
    if isinstance(node, cst.Call) and len(node.args) == 1 and node.args[0].keyword is None \
            and not node.args[0].star and (ctx.qualname(node.func) or "") in _VARIABLE:
        return node.args[0].value
    return None


def combine_operands(kinds: Iterable[str | None]) -> str | None:
    """Placement of an op's result from its operands' placements (CPU tensors only mix with 0-d values)."""
    kinds = list(kinds)
    if DEVICE in kinds:
        return DEVICE
    if HOST in kinds:
        return HOST
    if TENSOR in kinds:
        return TENSOR
    if kinds and all(k == NONTENSOR for k in kinds):
        return NONTENSOR
    return None


def combine_alternatives(kinds: Iterable[str | None]) -> str | None:
    """Placement of a name with several reaching definitions: only what all of them agree on."""
    found = set(kinds)
    if len(found) == 1:
        return found.pop()
    if found and found <= {DEVICE, TENSOR}:
        return TENSOR
    if found and found <= {HOST, NONTENSOR}:
        return HOST
    return None


class Placement:
    """Where values live, bound to one traversal position (ctx.ancestors). Flow-insensitive and syntactic;
    answers None whenever it does not know, and NONTENSOR/HOST only with positive evidence."""

    def __init__(self, ctx: RuleContext) -> None:
        self.ctx = ctx
        self.a = ctx.analysis
        self.ev = ctx.evidence
        self.default_device = _program_sets_default_device(ctx)

    # -- public ------------------------------------------------------------------------------

    def of(self, node: cst.BaseExpression | None, depth: int = 0, before: int | None = None) -> str | None:
        if node is None or depth > 8:
            return None
        if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.FormattedString,
                             cst.ConcatenatedString, cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp,
                             cst.DictComp, cst.SetComp, cst.GeneratorExp, cst.Lambda)):
            return NONTENSOR
        if isinstance(node, cst.Name):
            if node.value in ("True", "False", "None"):
                return NONTENSOR
            return self._name(node, depth, before)
        if isinstance(node, cst.Attribute):
            return self._attribute(node, depth, before)
        if isinstance(node, cst.Subscript):
            stores = subscript_stores(self.ctx.enclosing(cst.FunctionDef) or self.ctx.module)
            stored = stores.get(self.ctx.code(node)) if stores else None
            if stored:  # `images[0] = images[0].cuda()`: the element read is what was stored there
                return combine_alternatives([self.of(value, depth + 1, before) for value in stored])
            elements = self._comprehension_elements(node.value, before)
            if elements:  # `batch = {k: v.to(device) for k, v in batch.items()}; batch["input_ids"]`
                return combine_alternatives([self.of(element, depth + 1, before) for element in elements])
            if self._is_container(node.value):
                return None
            return self.of(node.value, depth + 1, before)
        if isinstance(node, cst.Call):
            return self._call(node, depth, before)
        if isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, cst.Modulo) and isinstance(node.left, (cst.SimpleString,
                                                                                 cst.ConcatenatedString)):
                return NONTENSOR
            return combine_operands([self.of(node.left, depth + 1, before), self.of(node.right, depth + 1, before)])
        if isinstance(node, cst.UnaryOperation):
            if isinstance(node.operator, cst.Not):
                return NONTENSOR
            return self.of(node.expression, depth + 1, before)
        if isinstance(node, cst.Comparison):
            if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in node.comparisons):
                return NONTENSOR
            return combine_operands([self.of(node.left, depth + 1, before)]
                                    + [self.of(c.comparator, depth + 1, before) for c in node.comparisons])
        if isinstance(node, cst.IfExp):
            return combine_alternatives([self.of(node.body, depth + 1, before), self.of(node.orelse, depth + 1, before)])
        return None

    def is_tensor(self, node: cst.BaseExpression | None) -> bool:
        return self.of(node) in (DEVICE, TENSOR, HOST)

    def host_only(self, node: cst.BaseExpression | None) -> bool:
        """Is every tensor in this expression a CPU tensor, with at least one (`torch.rand(1) < self.p`)?
        Stricter than `of(...) == HOST`: an operand that is a tensor of unknown placement (a 0-d CPU tensor
        mixes with a device tensor, and the result lives on the device) makes it False."""
        leaves: list[cst.BaseExpression] = []
        _leaf_operands(node, leaves)
        found_host = False
        for leaf in leaves:
            if self.built_on_host(leaf):
                found_host = True
                continue
            kind = self.of(leaf)
            if kind in (DEVICE, TENSOR, HOST):
                return False
            elif kind is None:
                verdict = self.ev.is_tensor(leaf)
                if verdict is True or verdict is None and not _is_plain_value(leaf):
                    return False
        return found_host

    def built_on_host(self, node: cst.BaseExpression | None, depth: int = 0, before: int | None = None) -> bool:
        """A tensor made on the CPU by this code: a torch factory without `device=` (`torch.rand(1)`,
        `torch.empty(1).uniform_(a, b)`, `torch.tensor(x)`), or a value computed only from such tensors and
        Python values by elementwise ops, casts, in-place fills or indexing. Narrower than `of(...) == HOST`
        (no DataLoader batches or module outputs, whose placement a model may change). `before`: the order of the
        statement being resolved (None: the current node), so that `m = torch.Tensor(m)` reads the earlier `m`."""
        if node is None or depth > 6 or self.default_device:
            return False
        if isinstance(node, cst.Subscript):
            return self.built_on_host(node.value, depth + 1, before)
        if isinstance(node, cst.UnaryOperation) and not isinstance(node.operator, cst.Not):
            return self.built_on_host(node.expression, depth + 1, before)
        if isinstance(node, cst.BinaryOperation):
            return self._host_operands([node.left, node.right], depth, before)
        if isinstance(node, cst.Comparison):
            return self._host_operands([node.left, *(c.comparator for c in node.comparisons)], depth, before)
        if isinstance(node, cst.Name):
            bindings = self.reaching(node.value, before)
            return bool(bindings) and all(
                b.kind is BindingKind.ASSIGN and self.built_on_host(b.value, depth + 1, b.order) for b in bindings)
        if not isinstance(node, cst.Call):
            return False
        qual = self.ctx.qualname(node.func) or ""
        if qual in _VARIABLE and node.args:
            return self.built_on_host(node.args[0].value, depth + 1, before)
        if qual.startswith("torch."):
            last = qual.rsplit(".", 1)[-1]
            if call_arg(node, "device") is not None or qual.count(".") != 1:
                return False
            if last in ("tensor", "as_tensor"):  # these keep the device of a tensor argument
                data = node.args[0].value if node.args else None
                return data is not None and (self.of(data, 0, before) == NONTENSOR or self.ev.is_tensor(data) is False
                                             or self.built_on_host(data, depth + 1, before))
            if last in _LIKE_FACTORIES:  # on the device of their tensor argument
                return bool(node.args) and self.built_on_host(node.args[0].value, depth + 1, before)
            if last in _FACTORIES or last in _HOST_CONSTRUCTORS:
                return all(self.of(arg.value, 0, before) in (NONTENSOR, None)
                           or self.built_on_host(arg.value, depth + 1, before)
                           for arg in node.args if arg.keyword is None or arg.keyword.value != "out")
            if last in _TENSOR_METHODS or last in _ELEMENTWISE:
                return self._host_operands([arg.value for arg in node.args if not arg.star], depth, before)
            return False
        name = method_name(node)
        if isinstance(node.func, cst.Attribute) and (name in _FILL_METHODS or name in _TENSOR_METHODS
                                                     and not name.startswith("new_") and name != "copy_"):
            return self._host_operands([node.func.value] + [arg.value for arg in node.args if not arg.star], depth,
                                      before)
        if name == "to" and node.args and all(  # `.to(torch.float32)`: a cast stays where it is
                (arg.keyword is None or arg.keyword.value == "dtype") and self._is_dtype(arg.value)
                for arg in node.args):
            return self.built_on_host(node.func.value, depth + 1, before)  # type: ignore[union-attr]
        return False

    def host_index(self, node: cst.BaseExpression | None, depth: int = 0,
                   before: int | None = None) -> tuple[str, cst.Call] | None:
        """Is this an integer index array made on the host -- a CPU tensor (`torch.randperm(n)`, a slice of
        one), a NumPy array (`np.random.permutation(n)`, `rng.choice(n, size)`) or a list of indices (a
        `BatchSampler`'s batches)? Returns what it is, in words, and the call that made it."""
        if node is None or depth > 6 or self.default_device:
            return None
        if isinstance(node, cst.Subscript):  # a slice of an index array is one (`perm[i:i + mb]`)
            if all(isinstance(e.slice, cst.Slice) for e in node.slice):
                return self.host_index(node.value, depth + 1, before)
            return None
        if isinstance(node, cst.Name):
            bindings = self.reaching(node.value, before)
            found = [self._bound_host_index(b, depth, before) for b in bindings]
            return found[0] if found and all(found) else None
        if not isinstance(node, cst.Call):
            return None
        qual = self.ctx.qualname(node.func) or ""
        last = qual.rsplit(".", 1)[-1]
        if qual.startswith("torch.") and qual.count(".") == 1 and call_arg(node, "device") is None:
            if last in _INDEX_FACTORIES:
                return "a CPU tensor", node
            if last in ("tensor", "as_tensor", "from_numpy", "LongTensor", "IntTensor") and node.args:
                inner = self.host_index(node.args[0].value, depth + 1, before)
                return ("a CPU tensor", node) if inner else None
            return None
        if qual.startswith(("numpy.", "np.")):
            if last in _NUMPY_INDEX_ARRAYS or last in _NUMPY_SIZED_DRAWS and _sized(node, _NUMPY_SIZED_DRAWS[last]):
                return "a NumPy array", node
            return None
        method = method_name(node)
        receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
        if method in ("long", "int") and receiver is not None:
            return self.host_index(receiver, depth + 1, before)
        if method in _GENERATOR_DRAWS and receiver is not None and _RNG_NAME.search(dotted_name(receiver) or "") \
                and (method not in _NUMPY_SIZED_DRAWS or _sized(node, _NUMPY_SIZED_DRAWS[method])):
            return "a NumPy array", node
        return None

    def _bound_host_index(self, binding, depth: int, before: int | None) -> tuple[str, cst.Call] | None:  # noqa: ANN001
        if binding.kind is BindingKind.ASSIGN:
            return self.host_index(binding.value, depth + 1, binding.order)
        if binding.kind is BindingKind.FOR and isinstance(binding.value, cst.Call) and not binding.path and (
                (dotted_name(binding.value.func) or "").endswith("BatchSampler")):
            return "a list of indices", binding.value
        return None

    def _is_dtype(self, node: cst.BaseExpression) -> bool:
        qual = self.ctx.qualname(node) or ""
        return qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _DTYPES

    def _host_operands(self, operands: list[cst.BaseExpression], depth: int, before: int | None = None) -> bool:
        """At least one operand built on the host, the others Python values (never a tensor of unknown place)."""
        found = False
        for operand in operands:
            if self.built_on_host(operand, depth + 1, before):
                found = True
            elif self.of(operand, 0, before) not in (NONTENSOR, None) or self.ev.is_tensor(operand) is True \
                    or self.of(operand, 0, before) is None and not _is_plain_value(operand) \
                    and not isinstance(operand, (cst.Integer, cst.Float)):
                return False
        return found

    def device_tensor(self, value: cst.BaseExpression) -> bool:
        """A tensor on the device: placed there, or an input of a network's `forward` in a CUDA program (the
        parameter itself, or an element of it bound to a name: `gt_boxes = input[1]`)."""
        if self.of(value) == DEVICE:
            return True
        function = self.ctx.enclosing(cst.FunctionDef)
        if function is None or function.name.value != "forward" or self.ctx.hot_kind() is not HotKind.FORWARD \
                or not self.ctx.targets_cuda():
            return False
        inputs = {p.name.value for p in function.params.params[1:]}
        if isinstance(value, cst.Name) and value.value not in inputs:
            bindings = self.reaching(value.value)
            bound = bindings[0].value if len(bindings) == 1 and bindings[0].kind in (
                BindingKind.ASSIGN, BindingKind.UNPACK) else None
            if bound is not None and bindings[0].kind is BindingKind.UNPACK and isinstance(bound, cst.Tuple) \
                    and bindings[0].path and bindings[0].path[0] < len(bound.elements):
                bound = bound.elements[bindings[0].path[0]].value  # `scores, gt_boxes = inputs[0], inputs[1]`
            while isinstance(bound, cst.Subscript):  # `scores = input[0][:, n:, :, :]`
                bound = value = bound.value
        return isinstance(value, cst.Name) and value.value in inputs

    def may_be_on_device(self, node: cst.BaseExpression | None) -> bool:
        """A torch tensor, not known to be on the CPU."""
        return self.of(node) in (DEVICE, TENSOR)

    def target_of_to(self, call: cst.Call) -> str | None:
        """For `.to(...)`: DEVICE / HOST for the target device, TENSOR for a dtype-only or unknown target."""
        target = call_arg(call, "device")
        if target is None:
            positional = [a for a in call.args if a.keyword is None and not a.star]
            if positional:
                target = positional[0]
        if target is None:
            mapped = self.ev.mapped_argument(call, "device")  # `.to(**self.tpdv)`
            if mapped is not None:
                return self.device_kind(mapped)
            if any(a.star == "**" for a in call.args):
                return None  # a mapping not read
            return TENSOR  # .to(dtype=...), .to(memory_format=...)
        return self.device_kind(target.value)

    def device_kind(self, node: cst.BaseExpression) -> str | None:
        """DEVICE, HOST, TENSOR (a dtype: no move) or None (another tensor / unknown) for a device-like argument."""
        qual = self.ctx.qualname(node) or ""
        if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] not in ("device",) and not qual.startswith(
                "torch.cuda"):
            return TENSOR  # torch.float16 & co.: a cast
        if isinstance(node, cst.Attribute) and node.attr.value == "dtype":
            return TENSOR
        if isinstance(node, cst.Name):
            bindings = self.a.bindings_of(node.value, self.ctx.ancestors)
            if bindings and all(b.kind is BindingKind.ASSIGN and b.value is not None
                                and self.device_kind(b.value) == TENSOR for b in bindings):
                return TENSOR  # `half = torch.bfloat16`
            # every assignment in scope, not only the textually last one: `if ...: d = accel else: d = cpu`
            # a parameter defaulting to the CPU (`device=torch.device("cpu")`) counts as the CPU
            found = {self.ev.device_of(b.value) if b.kind is BindingKind.ASSIGN or b.kind is BindingKind.PARAM
                     and not self._passed_by_callers(node.value) else None
                     for b in self.a.bindings_of(node.value, self.ctx.ancestors)}
            if found == {Device.CPU}:
                return HOST
            if found & {Device.CUDA, Device.MAYBE_CUDA}:
                return DEVICE
            if Device.CPU in found:
                return None
        device = self.ev.device_of(node)
        if device is Device.CPU:
            return HOST
        if device in (Device.CUDA, Device.MAYBE_CUDA):
            return DEVICE
        text = last_name(node)
        if text and _CPU_NAME.search(text):
            return HOST
        if text and _DEVICE_NAME.search(text):
            return DEVICE
        if isinstance(node, cst.Call) and self.ctx.qualname(node.func) == "torch.device":
            return DEVICE if node.args and self.ev.device_of(node.args[0].value) is not Device.CPU else None
        return None

    # -- pieces --------------------------------------------------------------------------------

    def _name(self, node: cst.Name, depth: int, before: int | None) -> str | None:
        if node.value in _PACKED_HOST_FIELDS:
            return HOST
        bindings = self.reaching(node.value, before)
        if not bindings:
            return None
        kinds = []
        for binding in bindings:
            if binding.kind is BindingKind.ASSIGN:
                kinds.append(self.of(binding.value, depth + 1, binding.order))
            elif binding.kind is BindingKind.UNPACK:
                value = binding.value
                if isinstance(value, (cst.Tuple, cst.List)) and binding.path and binding.path[0] < len(
                        value.elements) and not any(isinstance(e, cst.StarredElement) for e in value.elements):
                    kinds.append(self.of(value.elements[binding.path[0]].value, depth + 1, binding.order))
                elif isinstance(value, cst.Call):
                    kind = self.of(value, depth + 1, binding.order)
                    if kind is None and binding.path and self._call_marked(value, "loss-result", binding.path[0]):
                        kind = TENSOR  # `loss, acc = self.update(batch)`: a value the callee backpropagated
                    kinds.append(kind if kind in (DEVICE, TENSOR, HOST) else None)
                else:
                    kinds.append(None)
            elif binding.kind is BindingKind.FOR:
                kinds.append(self._for_target(binding))
            elif binding.kind is BindingKind.PARAM:
                kinds.append(DEVICE if self.ev.receives_device_tensor(node.value) else None)
            elif binding.kind is BindingKind.AUGMENT:  # `total += t.sum()` makes a tensor of a Python number
                kind = self.of(binding.value, depth + 1, binding.order)
                if kind is not DEVICE:
                    # `priority += 1e-5` stays where `priority` was; a device tensor stays on the device whatever
                    # is added (`total = torch.tensor(0.).cuda()`, then `total += loss.item() / n`)
                    earlier = self._name(node, depth + 1, binding.order)
                    if earlier is DEVICE or kind not in (TENSOR, HOST):
                        kind = earlier
                kinds.append(kind if kind in (DEVICE, TENSOR, HOST) else None)
            else:
                kinds.append(None)
        kind = combine_alternatives(kinds)
        if kind is None and (self._backward_called_on(node.value) and not self._module_like(bindings)
                             or self._tested_as_tensor(node.value)):
            return TENSOR
        return kind

    def _tested_as_tensor(self, name: str) -> bool:
        """Inside `if isinstance(name, torch.Tensor):` (or `torch.is_tensor(name)`): a tensor, proven by the test;
        unless every call of the function passes only Python numbers (the branch never runs)."""
        function = self.ctx.enclosing(cst.FunctionDef)
        if function is not None and f"{self.a.key_of(function)}#numbers-only" in self.a.program_keys:
            return False
        ancestors = self.ctx.ancestors
        for index, ancestor in enumerate(ancestors[:-1]):
            if isinstance(ancestor, cst.If) and ancestors[index + 1] is ancestor.body:
                test = ancestor.test
                if isinstance(test, cst.Call) and test.args and isinstance(test.args[0].value, cst.Name) \
                        and test.args[0].value.value == name and (
                            self.ctx.qualname(test.func) == "torch.is_tensor" or dotted_name(test.func) == "isinstance"
                            and len(test.args) == 2 and self.ctx.qualname(test.args[1].value) == "torch.Tensor"):
                    return True
        return False

    def reaching(self, name: str, before: int | None = None) -> list:
        """Bindings of `name` that reach a point: the last one textually before it, or all when none precede
        it (loop-carried). `before` is the order of the statement being resolved (None: the current node)."""
        return self.a.reaching_bindings(name, self.ctx.ancestors, before)

    def _for_target(self, binding) -> str | None:  # noqa: ANN001 - analysis.Binding
        iterable = binding.value
        if isinstance(iterable, cst.Call):
            func = dotted_name(iterable.func) or ""
            if func in ("range",):
                return NONTENSOR
            if func.endswith("enumerate") and binding.path[:1] == (0,):
                return NONTENSOR
            method = method_name(iterable)
            if method in ("parameters", "buffers") and not binding.path:
                return TENSOR  # a module's parameters: tensors wherever the module lives
            if method in ("named_parameters", "named_buffers") and binding.path[:1] == (1,):
                return TENSOR
        if self.ev._for_target_is_batch(binding):  # noqa: SLF001 - shared analysis helper
            return HOST
        if self.ev.batch_placement_unknown(binding) or self.ev.loader_on_device(binding.value):
            return TENSOR  # a batch, wherever Fabric or Accelerate put it
        return None

    def _attribute(self, node: cst.Attribute, depth: int, before: int | None) -> str | None:
        attr = node.attr.value
        if attr in _NON_TENSOR_ATTRS:
            return NONTENSOR
        if attr in _PACKED_HOST_FIELDS:
            return HOST
        if attr in _SAME_PLACE_ATTRS:
            return self.of(node.value, depth + 1, before)
        if isinstance(node.value, cst.Name) and node.value.value == "self":
            info = self.a.enclosing_class(self.ctx.ancestors)
            if info is not None and info.is_module and attr in registered_tensors(info):
                return TENSOR  # `self.register_buffer("params", ...)`: a tensor that lives where its module does
            bindings = info.attrs.get(attr, []) if info else []
            if any(not _is_none(b.value) for b in bindings):  # `self.returns = None` until first set: Optional
                bindings = [b for b in bindings if not _is_none(b.value)]
            # `self.tokens += (y >= 0).sum()` (a count kept on the device, from `self.tokens = 0`): a device tensor
            # from the first update on
            if any(b.kind is BindingKind.AUGMENT and self.of(b.value, depth + 1, b.order) == DEVICE for b in bindings):
                return DEVICE
            kinds = [self.of(b.value, depth + 1, b.order) if b.kind is BindingKind.ASSIGN else None for b in bindings]
            if not kinds or None in kinds:
                return None
            kind = combine_alternatives(kinds)
            # plain tensor attributes do not move with `module.to(...)`; parameters and buffers do
            return kind
        return None

    def _call(self, node: cst.Call, depth: int, before: int | None) -> str | None:
        qual = self.ctx.qualname(node.func) or ""
        name = method_name(node)
        if isinstance(node.func, cst.Name) and not qual:
            if node.func.value in _BUILTIN_NON_TENSOR and not self.a.bindings_of(node.func.value, self.ctx.ancestors):
                return NONTENSOR
        if qual.startswith(("numpy.", "np.", "math.", "random.")) or qual in ("numpy", "math"):
            return NONTENSOR
        if qual == "typing.cast" and len(node.args) == 2:
            return self.of(node.args[1].value, depth + 1, before)
        if qual in _VARIABLE and node.args:  # the legacy wrapper returns its tensor
            return self.of(node.args[0].value, depth + 1, before)
        if qual.startswith("torch."):
            return self._torch_call(node, qual, depth, before)
        if self._call_marked(node, "uploads"):
            return DEVICE  # `obs, reward = utils.to_torch(batch, device)`: a helper moving its argument to a device
        if self._call_marked(node, "loss-result", ""):
            return TENSOR  # `loss = self.update(batch)`: the callee backpropagated what it returns
        if self._calls_tensor_helper(node):
            if isinstance(node.func, cst.Attribute) and self.ev.is_module(node.func.value):
                return self._module_call(node, depth, before)  # `self.prediction(h)`: the network's own method
            kinds = [kind for arg in node.args if not arg.star
                     and (kind := self.of(arg.value, depth + 1, before)) not in (None, NONTENSOR)]
            return DEVICE if DEVICE in kinds else combine_operands(kinds) if kinds else None
        if name == "forward" and isinstance(node.func, cst.Attribute) and self.ev.is_module(node.func.value):
            return self._module_call(node, depth, before)  # `self.forward(x)`: the module called directly
        if name is not None and isinstance(node.func, cst.Attribute):
            return self._method(node, name, depth, before)
        # a call of a module instance: `model(x)`, `self.encoder(x)`, `criterion(out, y)`
        if self.ev.is_module(node.func):
            return self._module_call(node, depth, before)
        # an unknown callable named like a model: its outputs are tensors (proof by use), on the device when it is
        # called with a device tensor (`model(x_cuda)`)
        if _MODEL_NAME.search(last_name(node.func) or ""):
            kinds = [self.of(arg.value, depth + 1, before) for arg in node.args if not arg.star]
            if DEVICE in kinds:
                return DEVICE
            if kinds and all(kind in (TENSOR, DEVICE) or kind is None for kind in kinds) and self.ev.is_tensor(
                    node.args[0].value) is not False:
                return TENSOR
        return None

    def _passed_by_callers(self, parameter: str) -> bool:
        """A parameter defaulting to the CPU that the program's calls pass (`partial(collate, device=device)`): its
        default says nothing of where the tensors go (`#device-passed:` marker of the call graph)."""
        key = self.a.key_of(self.ctx.enclosing(cst.FunctionDef))
        return f"{key}#device-passed:{parameter}" in self.a.program_keys

    def _calls_tensor_helper(self, node: cst.Call) -> bool:
        """A program function that computes its result from its arguments with tensor ops (`#same-device:`
        marker of the call graph): `value = logits_to_expected_value(value, n)` keeps `value` where it was."""
        return self._call_marked(node, "same-device")

    def from_factory_helper(self, node: cst.BaseExpression) -> bool:
        """`diffusion.sample_timesteps(n)`: a call of a program function that returns a torch factory's new CPU
        tensor (`return torch.randint(1, T, (n,))`), as the call graph found across the program's files."""
        return isinstance(node, cst.Call) and self._call_marked(node, "host-factory")

    def moves_argument(self, node: cst.BaseExpression) -> bool:
        """`self.get_torch_variable(z)`: a call of a program helper that returns its tensor argument moved to a
        device (`return Variable(arg).cuda(self.cuda_index)`)."""
        return isinstance(node, cst.Call) and self._call_marked(node, "moves-argument")

    def _call_marked(self, node: cst.Call, marker: str, detail: int | str | None = None) -> bool:
        """The call graph marks this call's callee, as the enclosing function calls it (`<key>#<marker>:<name>`, with
        `:<detail>` when given)."""
        called = last_name(node.func)
        if not called or not self.a.program_keys:
            return False
        key = self.a.key_of(self.ctx.enclosing(cst.FunctionDef))
        suffix = "" if detail is None else f":{detail}"
        return f"{key}#{marker}:{called}{suffix}" in self.a.program_keys

    def _torch_call(self, node: cst.Call, qual: str, depth: int, before: int | None) -> str | None:
        last = qual.rsplit(".", 1)[-1]
        parts = qual.split(".")
        if qual == "torch.nn.Parameter" or qual == "torch.nn.parameter.Parameter":
            inner = self.of(node.args[0].value, depth + 1, before) if node.args else None
            return DEVICE if inner == DEVICE else TENSOR  # parameters move with their module
        if last in ("clip_grad_norm_", "clip_grad_norm") and qual.startswith("torch.nn.utils."):
            return self._gradient_norm(node, depth, before)
        if last in _TORCH_NON_TENSOR_FUNCS or parts[1] in ("cuda", "backends", "distributed", "utils", "nn") \
                and not qual.startswith("torch.nn.functional."):
            return None
        device_arg = call_arg(node, "device")
        if last in _HOST_CONSTRUCTORS:
            return HOST
        if last in ("tensor", "as_tensor", "asarray"):
            if device_arg is not None:
                return self.device_kind(device_arg.value) or TENSOR
            inner = self.of(node.args[0].value, depth + 1, before) if node.args else None
            if inner in (DEVICE, TENSOR):
                return inner
            return HOST if inner in (HOST, NONTENSOR) or last == "tensor" else TENSOR  # a tensor, wherever it was
        if last in _FACTORIES and len(parts) == 2:
            if device_arg is not None:
                return self.device_kind(device_arg.value) or TENSOR
            return TENSOR if self.default_device else HOST
        if last in _LIKE_FACTORIES:
            if device_arg is not None:
                return self.device_kind(device_arg.value) or TENSOR
            inner = self.of(node.args[0].value, depth + 1, before) if node.args else None
            return inner if inner in (DEVICE, HOST) else TENSOR
        if len(parts) == 2 and last[:1].islower() or qual.startswith(
                ("torch.nn.functional.", "torch.linalg.", "torch.special.", "torch.fft.")):
            if device_arg is not None:
                return self.device_kind(device_arg.value) or TENSOR
            kinds = [self.of(arg.value, depth + 1, before) for arg in node.args if not arg.star]
            kinds += [self.of(el.value, depth + 1, before) for arg in node.args if isinstance(arg.value, (cst.List, cst.Tuple))
                      for el in arg.value.elements if not isinstance(el, cst.StarredElement)]
            kind = combine_operands(k for k in kinds if k != NONTENSOR)
            return kind if kind in (DEVICE, HOST) else TENSOR
        return None

    def computed_on_host(self, value: cst.BaseExpression, depth: int = 0, before: int | None = None) -> bool:
        """Made on the CPU, or computed by a call from something that was (`out = model.initial_inference(obs)` with
        `obs = torch.tensor(frames)` made here: a GPU network would have raised), through a few bindings; looser
        than `built_on_host`, which also proves what it is made of. For a value whose placement is unknown."""
        while isinstance(value, (cst.Attribute, cst.Subscript)) or isinstance(value, cst.Call) and isinstance(
                value.func, cst.Attribute) and not value.args:
            value = value.func.value if isinstance(value, cst.Call) else value.value  # `d.sample().cpu()`: `d`
        if depth > 6:
            return False
        if self.built_on_host(value, before=before) or self._constructed_on_host(value):
            return True
        if isinstance(value, cst.Call):
            arguments = [a.value for a in value.args if not a.star and isinstance(a.value, cst.Name)]
            return any(self.computed_on_host(a, depth + 1, before) for a in arguments)
        if not isinstance(value, cst.Name):
            return False
        bindings = self.reaching(value.value, before)
        if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN or bindings[0].value is None:
            return False
        return self.computed_on_host(bindings[0].value, depth + 1, bindings[0].order)

    def _constructed_on_host(self, value: cst.BaseExpression) -> bool:
        """`torch.tensor(obs, dtype=torch.float32).unsqueeze(0)`: a tensor constructor without `device=` (whatever
        its data, host data in practice), through methods that keep the device."""
        while isinstance(value, cst.Call) and not self._host_constructor(value) \
                and isinstance(value.func, cst.Attribute) and method_name(value) not in ("to", "cuda", "type"):
            value = value.func.value
        return isinstance(value, cst.Call) and self._host_constructor(value) and call_arg(value, "device") is None

    def _host_constructor(self, call: cst.Call) -> bool:
        qual = self.ctx.qualname(call.func) or ""
        return qual.startswith("torch.") and qual.count(".") == 1 \
            and qual[len("torch."):] in _HOST_CONSTRUCTORS | {"tensor", "as_tensor"}

    def _gradient_norm(self, node: cst.Call, depth: int, before: int | None) -> str:
        """`clip_grad_norm_(model.parameters(), c)` returns the total norm, a 0-d tensor where the gradients are."""
        parameters = node.args[0].value if node.args and not node.args[0].star else None
        if isinstance(parameters, cst.Call) and method_name(parameters) == "parameters" \
                and isinstance(parameters.func, cst.Attribute):
            moves = self.module_moves(parameters.func.value)
            if len(moves) == 1:
                return next(iter(moves))
        kind = self.of(parameters, depth + 1, before) if parameters is not None else None
        return kind if kind in (DEVICE, HOST) else TENSOR

    def _method(self, node: cst.Call, name: str, depth: int, before: int | None) -> str | None:
        assert isinstance(node.func, cst.Attribute)
        receiver = node.func.value
        if name == "clip_grad_norm_":  # FSDP's (and Accelerate's) own: the total norm, where the gradients are
            moves = self.module_moves(receiver)
            return next(iter(moves)) if len(moves) == 1 else TENSOR
        if name in _DISTRIBUTION_OUTPUTS:
            built = self._distribution(receiver, before)
            if built is not None:  # `Categorical(logits=l).sample()`: a tensor where its parameters live
                kinds = [self.of(arg.value, depth + 1, before) for arg in built.args if not arg.star]
                return DEVICE if DEVICE in kinds else HOST if kinds and set(kinds) <= {HOST, NONTENSOR} else TENSOR
            if name in _DISTRIBUTION_ONLY:  # `dist = actor.get_dist(s)`, `dist.log_prob(a)`: a tensor by use
                return TENSOR
            produced = self._bound_call(receiver, before) if isinstance(receiver, cst.Name) else None
            if produced is not None and self.ev.is_module(produced.func):
                # `dist = self.actor(obs, std)`, `dist.entropy()`: a distribution a network returned
                return self._module_call(produced, depth + 1, before)
        if name in _NON_TENSOR_METHODS:
            if name == "numpy" or name in ("item", "tolist"):
                return NONTENSOR
            return NONTENSOR if self.of(receiver, depth + 1, before) in (DEVICE, TENSOR, HOST) else None
        if name in _HOST_METHODS:
            inner = self.of(receiver, depth + 1, before)
            if inner in (HOST, DEVICE, TENSOR):
                return HOST
            # whatever it was, `.cpu()` leaves a tensor on the host (unless it moved a module)
            return HOST if inner is None and name == "cpu" and not self.ev.is_module(receiver) else None
        if name == "cuda":
            return DEVICE if self.of(receiver, depth + 1, before) in (HOST, DEVICE, TENSOR) else None
        if name == "to":
            inner = self.of(receiver, depth + 1, before)
            if inner not in (HOST, DEVICE, TENSOR):
                return None  # modules and unknown objects have `.to` too
            target = self.target_of_to(node)
            if target == TENSOR:  # a cast
                return inner if inner in (DEVICE, HOST, TENSOR) else TENSOR
            if target in (DEVICE, HOST):
                return target
            return TENSOR if inner in (DEVICE, HOST, TENSOR) else None
        if name in _FILL_METHODS:
            inner = self.of(receiver, depth + 1, before)
            return inner if inner in (HOST, DEVICE, TENSOR) else None
        if name in _TENSOR_METHODS:
            inner = self.of(receiver, depth + 1, before)
            if inner == NONTENSOR:
                return NONTENSOR if name in _NUMPY_SHARED else None
            kinds = [inner] + [self.of(arg.value, depth + 1, before) for arg in node.args if not arg.star]
            kind = combine_operands(k for k in kinds if k != NONTENSOR)
            if kind is None and inner is None and (name in _NUMPY_SHARED or name in _MODULE_SHARED):
                return None
            return kind or TENSOR
        if self.ev.is_module(node.func):  # `self.q_net(state)`: a network held by an attribute
            return self._module_call(node, depth, before)
        if _MODEL_NAME.search(last_name(receiver) or "") and any(
                self.of(arg.value, depth + 1, before) == DEVICE for arg in node.args if not arg.star):
            return DEVICE  # `self.online_net.calculate_q(states=s)` on a device tensor: a network's method
        return None

    def _bound_call(self, name: cst.Name, before: int | None) -> cst.Call | None:
        """The one call `name` was assigned from (`self.actor(obs)` for `dist = self.actor(obs)`)."""
        bindings = self.reaching(name.value, before)
        if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN and isinstance(bindings[0].value, cst.Call):
            return bindings[0].value
        return None

    def _distribution(self, node: cst.BaseExpression, before: int | None) -> cst.Call | None:
        """The `torch.distributions.X(...)` call `node` is, or the one name `node` was bound to."""
        if isinstance(node, cst.Name):
            node = self._bound_call(node, before)
        if isinstance(node, cst.Call) and (self.ctx.qualname(node.func) or "").startswith("torch.distributions."):
            return node
        return None

    def _module_call(self, node: cst.Call, depth: int, before: int | None) -> str | None:
        kinds = [self.of(arg.value, depth + 1, before) for arg in node.args if not arg.star]
        kind = combine_operands(k for k in kinds if k != NONTENSOR)
        if kind in (DEVICE, HOST):
            return kind
        moved = self.module_moves(node.func)
        if moved == {HOST}:
            return HOST
        if DEVICE in moved:
            return DEVICE
        return TENSOR

    def module_moves(self, module: cst.BaseExpression) -> set[str]:
        """Targets of the moves of a module (`m.to(D)`, `m.cuda()`, `m.cpu()`, `m = X().to(D)`) in the file."""
        target = dotted_name(module)
        if target is None:
            return set()
        found: set[str] = set()
        for call in calls_of(self.a.module):
            name = method_name(call)
            if name not in ("to", "cuda", "cpu") or not isinstance(call.func, cst.Attribute):
                continue
            if _root_of_chain(call.func.value) != target:
                continue
            if name == "cuda":
                found.add(DEVICE)
            elif name == "cpu":
                found.add(HOST)
            else:
                kind = self.target_of_to(call)
                if kind in (DEVICE, HOST):
                    found.add(kind)
        # `model = Net().to(device)` style bindings
        if isinstance(module, cst.Name):
            for binding in self.a.bindings_of(module.value, self.ctx.ancestors):
                if binding.kind is BindingKind.ASSIGN and isinstance(binding.value, cst.Call):
                    call = binding.value
                    while isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
                        if method_name(call) == "cuda":
                            found.add(DEVICE)
                        elif method_name(call) == "cpu":
                            found.add(HOST)
                        elif method_name(call) == "to":
                            kind = self.target_of_to(call)
                            if kind in (DEVICE, HOST):
                                found.add(kind)
                        call = call.func.value
        return found

    def _comprehension_elements(self, node: cst.BaseExpression, before: int | None) -> list[cst.BaseExpression]:
        """The element expressions of the comprehensions a name is bound to (every binding that reaches it is one):
        what each item of the container is."""
        if not isinstance(node, cst.Name):
            return []
        bindings = self.reaching(node.value, before)
        elements = []
        for binding in bindings:
            value = binding.value
            if binding.kind is not BindingKind.ASSIGN or not isinstance(value, (cst.DictComp, cst.ListComp)):
                return []
            elements.append(value.value if isinstance(value, cst.DictComp) else value.elt)
        return elements

    def _is_container(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, (cst.List, cst.Dict, cst.Tuple, cst.ListComp, cst.DictComp)):
            return True
        if isinstance(node, cst.Name):
            for binding in self.a.bindings_of(node.value, self.ctx.ancestors):
                value = binding.value
                if binding.kind is BindingKind.ASSIGN and (
                        isinstance(value, (cst.List, cst.Dict, cst.Tuple, cst.ListComp, cst.DictComp))
                        or isinstance(value, cst.Call) and (dotted_name(value.func) or "") in _CONTAINER_CALLS):
                    return True
        return False

    def _module_like(self, bindings: list) -> bool:
        """Bound to a network (modules also have `.cpu()` / `.to()`): `copy.deepcopy(ema).eval()`, `Net()`."""
        for binding in bindings:
            value = binding.value
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                    and method_name(value) in ("eval", "train", "requires_grad_", "to", "cuda", "cpu", "float"):
                if method_name(value) in ("eval", "train", "requires_grad_"):
                    return True
                value = value.func.value
            if value is not None and self.ev.is_module(value):
                return True
        return False

    def _backward_called_on(self, name: str) -> bool:
        """Is `name` a tensor by how its function uses it? It is `.backward()`-ed, summed into a value that is
        (`total = p_loss + c * v_loss; total.backward()`), or receives a method only tensors have (`.detach()`,
        `.cpu()`, `.unsqueeze(...)`)."""
        function = next((n for n in reversed(self.ctx.ancestors) if isinstance(n, cst.FunctionDef)), self.a.module)
        return name in tensors_by_use(function)


_TENSORS_BY_USE: dict[int, tuple[cst.CSTNode, frozenset[str]]] = {}
# what a torch.distributions object returns: tensors
# methods only distributions have (`sample` is also a replay buffer's, `entropy` a tree's)
_DISTRIBUTION_ONLY = frozenset({"log_prob", "rsample"})
_DISTRIBUTION_OUTPUTS = frozenset({"sample", "rsample", "log_prob", "entropy", "cdf", "icdf", "sample_n",
                                   "enumerate_support"})
# methods numpy arrays, Python numbers and containers do not have
_TENSOR_ONLY_USES = frozenset({"backward", "detach", "cpu", "cuda", "to", "unsqueeze", "masked_fill", "masked_fill_",
                               "softmax", "log_softmax", "expand_as", "view_as", "type_as", "new_zeros", "new_ones",
                               "new_full", "new_empty", "pin_memory", "detach_", "requires_grad_", "register_hook",
                               "numel", "dim", "is_contiguous", "contiguous", "element_size", "data_ptr"})


def tensors_by_use(function: cst.CSTNode) -> frozenset[str]:
    """Names a function proves to be tensors by using them: a tensor-only method is called on them, or they are
    `.backward()`-ed, directly or through a value computed from them in the same function."""
    cached = _TENSORS_BY_USE.get(id(function))
    if cached is not None and cached[0] is function:
        return cached[1]
    proven: set[str] = set()
    backward: set[str] = set()
    assigned: dict[str, list[cst.BaseExpression]] = {}
    for node in walk(function):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value == "backward":
            # `loss.backward()`, `(v_loss * c + pg - ent * e).backward()`; `fabric.backward(loss / accum)`,
            # `accelerator.backward(loss)`: with a positional argument, the argument is the loss (or, for a
            # tensor's own `.backward(gradient)`, a tensor too) and the receiver may be a trainer object
            positional = [a for a in node.args if a.keyword is None and not a.star]
            loss = positional[0].value if positional else node.func.value
            if isinstance(loss, cst.Name):
                backward.add(loss.value)
            leaves: list[cst.BaseExpression] = []
            _leaf_operands(loss, leaves)
            proven.update(leaf.value for leaf in leaves if isinstance(leaf, cst.Name))
        elif isinstance(node, cst.Call) and vocab.steps_with(names := [dotted_name(a.value) for a in node.args]):
            # `loss_scaler(loss, optimizer)`: the loss handed over is backpropagated there
            losses = {n for n in names if n and "." not in n and vocab.is_loss_value(n)}
            backward |= losses
            proven |= losses
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and isinstance(node.func.value, cst.Name) and node.func.attr.value in _TENSOR_ONLY_USES:
            proven.add(node.func.value.value)
        elif isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            assigned.setdefault(node.targets[0].target.value, []).append(node.value)
    for name in backward:  # `total = p_loss + c * v_loss`: the operands of a loss are tensors too
        for value in assigned.get(name, ()):
            leaves: list[cst.BaseExpression] = []
            _leaf_operands(value, leaves)
            proven.update(leaf.value for leaf in leaves if isinstance(leaf, cst.Name))
    # further back, through reductions (`weighted = (w * loss).mean()`, `loss = pg + c * v_loss`): a name counts
    # when the function computes it (a coefficient read from a config is a number, not a tensor)
    frontier, seen = list(backward), set(backward)
    for _ in range(_LOSS_HOPS):
        following = []
        for name in frontier:
            for value in assigned.get(name, ()):
                leaves = []
                _loss_operands(value, leaves)
                for leaf in leaves:
                    values = assigned.get(leaf.value, ()) if isinstance(leaf, cst.Name) else ()
                    # `rewards = to_device(rewards)`: the name held something else before (host data): not proven;
                    # `loss = loss.mean()` keeps a tensor a tensor
                    if values and leaf.value not in seen and any(_computed(v) for v in values) and not any(
                            _converts(v, leaf.value) for v in values):
                        seen.add(leaf.value)
                        proven.add(leaf.value)
                        following.append(leaf.value)
        frontier = following
    if len(_TENSORS_BY_USE) > 4096:
        _TENSORS_BY_USE.clear()
    _TENSORS_BY_USE[id(function)] = (function, frozenset(proven))
    return frozenset(proven)


_LOSS_HOPS = 3  # assignments followed back from a backward()-ed loss


def _loss_operands(node: cst.BaseExpression, out: list[cst.BaseExpression]) -> None:
    """`_leaf_operands`, also through tensor methods that reduce or reshape their receiver."""
    leaves: list[cst.BaseExpression] = []
    _leaf_operands(node, leaves)
    for leaf in leaves:
        while isinstance(leaf, cst.Call) and isinstance(leaf.func, cst.Attribute) \
                and leaf.func.attr.value in vocab.TENSOR_PRESERVING_METHODS:
            leaf = leaf.func.value
        if isinstance(leaf, (cst.BinaryOperation, cst.UnaryOperation)):
            _loss_operands(leaf, out)
        else:
            out.append(leaf)


def _converts(value: cst.BaseExpression, name: str) -> bool:
    """Does `name = value` read the name's earlier value other than through a tensor method on it?"""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
            and value.func.attr.value in vocab.TENSOR_PRESERVING_METHODS:
        value = value.func.value
    if isinstance(value, cst.Name) and value.value == name:
        return False
    return any(isinstance(n, cst.Name) and n.value == name for n in walk(value, into_functions=True))


def _computed(value: cst.BaseExpression) -> bool:
    """A value the function computes (a call or arithmetic), not a number or a setting it reads."""
    return not (_is_plain_value(value) or isinstance(value, (cst.Integer, cst.Float, cst.SimpleString)))


def _leaf_operands(node: cst.BaseExpression | None, out: list[cst.BaseExpression]) -> None:
    """Operands of comparisons, arithmetic and boolean operators (the values they combine)."""
    if node is None:
        return
    if isinstance(node, cst.Comparison):
        _leaf_operands(node.left, out)
        for comparison in node.comparisons:
            _leaf_operands(comparison.comparator, out)
    elif isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
        _leaf_operands(node.left, out)
        _leaf_operands(node.right, out)
    elif isinstance(node, cst.UnaryOperation):
        _leaf_operands(node.expression, out)
    else:
        out.append(node)


def _is_plain_value(node: cst.BaseExpression) -> bool:
    """A hyperparameter-like value: `self.p`, `p`, `cfg.prob` (a name or attribute chain, not a call)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


_DEFAULT_DEVICE_CACHE: dict[int, tuple[object, bool]] = {}


def _program_sets_default_device(ctx: RuleContext) -> bool:
    """`torch.set_default_device(...)` anywhere in the program makes bare factories device tensors."""
    cached = _DEFAULT_DEVICE_CACHE.get(id(ctx.program))
    if cached is not None and cached[0] is ctx.program:
        return cached[1]
    found = bool(ctx.program.search(r"set_default_device\("))
    if len(_DEFAULT_DEVICE_CACHE) > 16:
        _DEFAULT_DEVICE_CACHE.clear()
    _DEFAULT_DEVICE_CACHE[id(ctx.program)] = (ctx.program, found)
    return found


_CALL_CACHE: dict[int, tuple[cst.CSTNode, list[cst.Call]]] = {}
_SUBSCRIPT_STORES: dict[int, tuple[cst.CSTNode, dict[str, list[cst.BaseExpression]]]] = {}


def _sized(draw: cst.Call, position: int) -> bool:
    """Does the random draw get a `size` (by keyword or at `position`)? Without one it returns a scalar."""
    return call_arg(draw, "size") is not None or len([a for a in draw.args if a.keyword is None]) > position


def subscript_stores(scope: cst.CSTNode) -> dict[str, list[cst.BaseExpression]]:
    """Source text of an element target -> the values the scope stores there (`images[0] = images[0].cuda()`),
    nested definitions left out."""
    cached = _SUBSCRIPT_STORES.get(id(scope))
    if cached is not None and cached[0] is scope:
        return cached[1]
    found: dict[str, list[cst.BaseExpression]] = {}
    empty = cst.Module(body=[])
    for node in walk(scope):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Subscript):
                    found.setdefault(empty.code_for_node(target.target), []).append(node.value)
    if len(_SUBSCRIPT_STORES) > 64:
        _SUBSCRIPT_STORES.clear()
    _SUBSCRIPT_STORES[id(scope)] = (scope, found)
    return found


def calls_of(root: cst.CSTNode) -> list[cst.Call]:
    cached = _CALL_CACHE.get(id(root))
    if cached is not None and cached[0] is root:
        return cached[1]
    calls = [n for n in walk(root, into_functions=True) if isinstance(n, cst.Call)]
    if len(_CALL_CACHE) > 64:
        _CALL_CACHE.clear()
    _CALL_CACHE[id(root)] = (root, calls)
    return calls


def _root_of_chain(node: cst.BaseExpression) -> str | None:
    """`model` for `model`, `model.to(x)`, `model.cuda().float()`; dotted names kept (`self.net`)."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        node = node.func.value
    return dotted_name(node)


def _is_none(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def last_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Subscript):
        return last_name(node.value)
    return None


def amortised(ctx: RuleContext, *, plainly: bool = False) -> bool:
    """Is the current node in the body of an `if` whose test uses `%` (`if step % N == 0:`), below the hot
    region (or the function) that contains it, and that does not train itself? Such code runs once every N steps
    (a branch that runs the update every N environment steps is the training step). So is a memoising branch
    (`if key not in cache:`), a branch that breaks out of the step loop, and a `@lru_cache` function.
    `plainly`: only a `%` that is plainly rare (`every_many_steps`)."""
    ancestors = ctx.ancestors
    hot = ctx.analysis.hot
    for index in range(len(ancestors) - 2, -1, -1):
        node = ancestors[index]
        if isinstance(node, cst.FunctionDef) and any(
                (dotted_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or "")
                .rsplit(".", 1)[-1] in _MEMOISING for d in node.decorators):
            return True  # `@lru_cache`: computed once per argument
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)) or id(node) in hot:
            return False
        if isinstance(node, cst.If) and index + 1 < len(ancestors) and ancestors[index + 1] is node.body:
            rare = every_many_steps(ctx.analysis, node.test) if plainly else every_n_steps(ctx.analysis, node.test) \
                or _throttle_flag(ctx, node.test, ancestors[:index])
            if rare and not _trains(node.body):
                return True  # (a branch that trains, `if step % train_freq == 0: ...; loss.backward()`, is the step)
            if isinstance(node.test, cst.Comparison) and any(isinstance(c.operator, cst.NotIn)
                                                              for c in node.test.comparisons):
                return True  # `if key not in cache: cache[key] = ...`: once per key
            body = node.body.body if isinstance(node.body, cst.IndentedBlock) else []
            loop = next((n for n in reversed(ancestors[:index]) if isinstance(n, (cst.For, cst.While))), None)
            if body and isinstance(body[-1], cst.SimpleStatementLine) and isinstance(body[-1].body[-1], cst.Break) \
                    and loop is not None and id(loop) in hot:
                return True  # `if done: ...; break` in the step loop: once, on the way out of it
    return False


_MEMOISING = {"lru_cache", "cache", "cached_property", "memoize", "memoized"}


def at_episode_end(ctx: RuleContext) -> bool:
    """Is the current node in the body of an `if done:` (`if player.done:`, `if terminated or truncated:`) branch
    below the hot region that contains it, one that does not train? It runs once per episode (a reset), not every
    environment step."""
    ancestors = ctx.ancestors
    for index in range(len(ancestors) - 2, -1, -1):
        node = ancestors[index]
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)) or id(node) in ctx.analysis.hot:
            return False
        if isinstance(node, cst.If) and index + 1 < len(ancestors) and ancestors[index + 1] is node.body \
                and _ends_episode(node.test) and not _trains(node.body):
            return True
    return False


def _ends_episode(test: cst.BaseExpression) -> bool:
    if isinstance(test, cst.BooleanOperation):
        return _ends_episode(test.left) and _ends_episode(test.right)
    if isinstance(test, cst.Call) and dotted_name(test.func) in ("any", "all") and len(test.args) == 1:
        test = test.args[0].value
    name = dotted_name(test)
    return name is not None and bool(vocab.EPISODE_END_NAME.match(name.rsplit(".", 1)[-1]))


def _throttle_flag(ctx: RuleContext, test: cst.BaseExpression, ancestors: list[cst.CSTNode]) -> bool:
    """`if vis_result:` where `vis_result = step % k == 0` here, or is a parameter its callers pass such a flag
    (the call graph's `#throttle-flag:` marker)."""
    if not isinstance(test, cst.Name):
        return False
    bindings = ctx.analysis.reaching_bindings(test.value, ancestors)
    if any(b.kind is BindingKind.ASSIGN and b.value is not None and every_n_steps(ctx.analysis, b.value)
           for b in bindings):
        return True
    function = next((n for n in reversed(ancestors) if isinstance(n, cst.FunctionDef)), None)
    return function is not None and \
        f"{ctx.analysis.key_of(function)}#throttle-flag:{test.value}" in ctx.analysis.program_keys


def _trains(block: cst.CSTNode) -> bool:
    """Does the block run a training step (`loss.backward()`, `optimizer.step()`) itself?"""
    return any(isinstance(n, cst.Call) and vocab.is_training_step_call(dotted_name(n.func)) for n in walk(block))


def after_init_once_guard(ctx: RuleContext) -> bool:
    """Below `if self.initted: return` at the top of a function that sets `self.initted` itself (lazy
    initialisation: `self.initted = ...`, `self.initted.fill_(...)`, `self.initted.data.copy_(...)`): that code
    runs once per training run, not per step."""
    fn = ctx.enclosing(cst.FunctionDef)
    if not isinstance(fn, cst.FunctionDef) or not isinstance(fn.body, cst.IndentedBlock) or not fn.body.body:
        return False
    guard = fn.body.body[0]
    if not isinstance(guard, cst.If) or guard.orelse is not None or not isinstance(guard.body, cst.IndentedBlock) \
            or not all(isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, cst.Return) for x in s.body)
                       for s in guard.body.body):
        return False
    flag = dotted_name(guard.test)
    if flag is None or not flag.startswith("self.") or any(n is guard for n in ctx.ancestors):
        return False
    for node in walk(fn.body):
        if isinstance(node, cst.AssignTarget) and dotted_name(node.target) == flag:
            return True
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value in ("copy_", "fill_", "zero_") \
                and (dotted_name(node.func.value) or "").removesuffix(".data") == flag:
            return True
    return False


_EXIT_CALLS = {"sys.exit", "os._exit", "os.abort"}
_EXIT_BUILTINS = {"exit", "quit"}
_ASSERT_CALLS = {"torch._assert"}


def _always_false(test: cst.BaseExpression) -> bool:
    """A literal false condition: `False`, `0`, `None`, `""`."""
    if isinstance(test, cst.Name):
        return test.value in ("False", "None")
    if isinstance(test, cst.Integer):
        return test.evaluated_value == 0
    if isinstance(test, cst.SimpleString):
        return test.evaluated_value == ""
    return False


def _terminates(ctx: RuleContext, block: cst.BaseSuite) -> bool:
    """Does this block always end by raising or exiting the process (`raise ...`, `sys.exit(1)`, `os._exit`,
    `assert False`, `torch._assert(False, msg)`)?"""
    body = list(block.body)
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        small = last.body[-1] if last.body else None
        if isinstance(small, cst.Raise):
            return True
        if isinstance(small, cst.Assert):  # `assert False, msg` / `assert 0`
            return _always_false(small.test)
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            func = small.value.func
            if ctx.qualname(func) in _EXIT_CALLS:
                return True
            if ctx.qualname(func) in _ASSERT_CALLS:  # `torch._assert(False, msg)`
                condition = call_arg(small.value, "condition", 0)
                return condition is not None and _always_false(condition.value)
            return isinstance(func, cst.Name) and func.value in _EXIT_BUILTINS \
                and not ctx.analysis.bindings_of(func.value, ctx.ancestors)
        return False
    if isinstance(last, cst.If):  # `if a: raise X` / `else: raise Y`: every branch must end the run
        branch: cst.If | cst.Else | None = last
        while isinstance(branch, cst.If):
            if not _terminates(ctx, branch.body):
                return False
            branch = branch.orelse
        return isinstance(branch, cst.Else) and _terminates(ctx, branch.body)
    return False


def on_error_path(ctx: RuleContext) -> bool:
    """Is the current node part of a `raise` statement, or inside an `if`/`elif`/`else` branch that always ends in
    `raise` / `sys.exit()` / `exit()` / `os._exit()` / `assert False` / `torch._assert(False, ...)` (the branch's
    body, not its test)? That code runs once, when
    the run fails, not every step."""
    ancestors = ctx.ancestors
    for index in range(len(ancestors) - 2, -1, -1):
        node = ancestors[index]
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return False
        if isinstance(node, cst.Raise):
            return True
        if isinstance(node, (cst.If, cst.Else)) and ancestors[index + 1] is node.body \
                and _terminates(ctx, node.body):
            return True
    return False


_COLLECTIVES = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce",
                "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "gather", "scatter",
                "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv"}
READ_BACK_METHODS = {"item", "tolist", "cpu"}  # calls that wait for the value on the host
_READ_BACK_BUILTINS = {"bool", "int", "float"}
_SHAPE_ONLY = {"torch.zeros_like", "torch.empty_like", "torch.ones_like"}
_SCOPE_INDEX: dict[int, tuple[cst.CSTNode, dict[int, cst.CSTNode], dict[str, list[cst.Name]]]] = {}


def _scope_index(root: cst.CSTNode) -> tuple[dict[int, cst.CSTNode], dict[str, list[cst.Name]]]:
    """Parents of the nodes of a scope (not descending into nested defs) and its `Name` nodes by value."""
    cached = _SCOPE_INDEX.get(id(root))
    if cached is not None and cached[0] is root:
        return cached[1], cached[2]
    parents: dict[int, cst.CSTNode] = {}
    names: dict[str, list[cst.Name]] = {}
    stack: list[cst.CSTNode] = [root]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            names.setdefault(current.value, []).append(current)
        if current is not root and isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        for child in child_nodes(current):
            parents[id(child)] = current
            stack.append(child)
    if len(_SCOPE_INDEX) > 16:
        _SCOPE_INDEX.clear()
    _SCOPE_INDEX[id(root)] = (root, parents, names)
    return parents, names


def _allowed_use(ctx: RuleContext, name: cst.Name, parents: dict[int, cst.CSTNode]) -> bool:
    """An occurrence of the name that is a (re)binding, an argument of a torch.distributed collective, a
    shape-only use (`torch.zeros_like(t)`), or reading the value back to the host (`t.item()`, `t[0].tolist()`,
    `bool(t)`)."""
    parent = parents.get(id(name))
    if isinstance(parent, (cst.AssignTarget, cst.AnnAssign)) and parent.target is name:
        return True
    if isinstance(parent, cst.Del):
        return True
    if isinstance(parent, cst.Arg) and parent.value is name:
        call = parents.get(id(parent))
        if isinstance(call, cst.Call):
            qual = ctx.qualname(call.func) or ""
            if qual.startswith("torch.distributed.") and qual.rsplit(".", 1)[-1] in _COLLECTIVES:
                return True
            if qual in _SHAPE_ONLY:
                return True
    node: cst.CSTNode = name
    while isinstance(parents.get(id(node)), cst.Subscript) and parents[id(node)].value is node:  # type: ignore
        node = parents[id(node)]
    parent = parents.get(id(node))
    if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in READ_BACK_METHODS:
        call = parents.get(id(parent))
        return isinstance(call, cst.Call) and call.func is parent and not call.args
    if isinstance(parent, cst.Arg) and parent.value is node:
        call = parents.get(id(parent))
        return isinstance(call, cst.Call) and isinstance(call.func, cst.Name) \
            and call.func.value in _READ_BACK_BUILTINS and len(call.args) == 1
    return False


def collective_only(ctx: RuleContext, name: str) -> bool:
    """Is every use of `name` in its scope a torch.distributed collective or a read-back to the host? Such a
    tensor carries a host value to the other ranks (`t = torch.tensor(flag, device=d)`,
    `dist.all_reduce(t)`, `flag = bool(t.item())`): NCCL needs it on the device and the result is needed on the
    host, so neither the copy nor the read-back can be avoided."""
    scope_node = None
    for scope in ctx.analysis.scope_chain(ctx.ancestors):
        if name in scope.globals_:
            continue
        if name in scope.bindings:
            scope_node = scope.node
            break
    if scope_node is None:
        return False
    parents, names = _scope_index(scope_node)
    found_collective = False
    for occurrence in names.get(name, []):
        if not _allowed_use(ctx, occurrence, parents):
            return False
        parent = parents.get(id(occurrence))
        if isinstance(parent, cst.Arg):
            qual = ctx.qualname(parents[id(parent)].func) or ""  # type: ignore[union-attr]
            found_collective = found_collective or qual.startswith("torch.distributed.")
    return found_collective
