"""Which expressions are networks, how a call reaches a module, and rebuilding a call's owner."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

import libcst as cst

from gpulint import Confidence
from gpulint.analysis import (
    BindingKind,
    FileAnalysis,
    call_arg,
    child_nodes,
    dotted_name,
    has_star_args,
    iter_calls,
    method_name,
    walk,
)

# methods that return the module they are called on (moved, cast or switched to train/eval mode)
WRAPPER_METHODS = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval",
                             "requires_grad_", "share_memory", "apply"})  # each returns the module itself


def rebinds_itself(name: str, value: cst.BaseExpression | None) -> bool:
    """`net = net.to(device)`, `model = model.cuda().eval()`: a binding that moves or switches what the name held."""
    found = False
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
            and value.func.attr.value in WRAPPER_METHODS:
        value, found = value.func.value, True
    return found and isinstance(value, cst.Name) and value.value == name


_CONTAINERS = {"Sequential", "ModuleList", "ModuleDict"}
_BATCH_NORM = re.compile(r"^(BatchNorm\dd|SyncBatchNorm|LazyBatchNorm\dd)$")
_DROPOUT = re.compile(r"^(Dropout(\dd)?|AlphaDropout|FeatureAlphaDropout)$")
_SHAPED = re.compile(r"^(Conv(Transpose)?\dd|LazyConv(Transpose)?\dd|Embedding|EmbeddingBag)$")
_PARAMETER_FREE = re.compile(r"^(ReLU\d?|GELU|SiLU|Mish|ELU|SELU|CELU|LeakyReLU|PReLU_|Tanh|Sigmoid|Softplus|Softsign|"
                             r"Hardtanh|Hardswish|Hardsigmoid|LogSigmoid|Softmax\d?d?|LogSoftmax|Identity|Flatten|"
                             r"Unflatten|(Adaptive)?(Max|Avg|LP)Pool\dd|Upsample\w*|PixelShuffle|PixelUnshuffle|"
                             r"ZeroPad\dd|ConstantPad\dd|ReflectionPad\dd|ReplicationPad\dd|ChannelShuffle|"
                             r"Dropout(\dd)?|AlphaDropout|FeatureAlphaDropout|Threshold|GLU|Tanhshrink|Softshrink|Hardshrink)$")
_RECURRENT = {"RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"}
_ATTENTION = {"Transformer", "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
              "TransformerDecoder", "MultiheadAttention"}
_DROPOUT_FUNCTIONS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"}
_BUFFERS = {"torch.nn.Buffer", "torch.nn.parameter.Buffer"}  # `self.cos = nn.Buffer(t)`: a tensor, no weights
_LIBRARY_MODELS = ("torchvision.models.", "timm.models.", "pretrainedmodels.", "segmentation_models_pytorch.")
_LIBRARY_MODEL_FUNCTIONS = {"timm.create_model", "torch.hub.load"}
_NOT_MODULE_PREFIXES = ("numpy.", "np.", "math.", "random.", "torch.nn.init.", "torch.nn.functional.",
                        "torch.nn.utils.", "torch.distributions.",
                        # optimizers, schedulers, scalers, data and devices a network class may build for itself
                        "torch.optim.", "torch.utils.data.", "torch.cuda.", "torch.amp.", "torch.device")


@dataclass(frozen=True)
class ModuleFacts:
    """What gpulint can see of a module's definition. `coupling` names the first thing that makes rows of a
    batch interact in training mode (BatchNorm, dropout) or carries state; `known` is False when some part
    of the definition is not visible (an imported model: "maybe batch-coupled")."""

    known: bool = True
    coupling: str | None = None  # "BatchNorm" / "dropout": differs between one batched and two split calls in train mode
    blocker: str | None = None  # never batchable: recurrent state, sequence-first attention, state written in forward
    cross_row: str | None = None  # forward mixes rows (reduction over the batch dimension)
    outputs: int | None = None  # 1: one tensor; k >= 2: a k-tuple; None: unknown
    loss: bool = False  # a loss module (`nn.MSELoss()`): not a network to batch
    shaped: str | None = None  # layers whose inputs may differ in more than the batch size (conv, tokens)
    parametric: bool = True  # has weights; `nn.ReLU()`, `nn.MaxPool2d(2)` are not networks
    # one built-in layer (`nn.Linear(...)`, `nn.Embedding(...)`): cat + one kernel + split is no fewer launches
    # than two kernels, so there is nothing to gain from merging its calls
    single_layer: bool = False

    def merge(self, other: "ModuleFacts") -> "ModuleFacts":
        return ModuleFacts(self.known and other.known, self.coupling or other.coupling,
                           self.blocker or other.blocker, self.cross_row or other.cross_row,
                           self.outputs if self.outputs is not None else other.outputs, self.loss,
                           self.shaped or other.shaped, self.parametric or other.parametric)


UNKNOWN = ModuleFacts(known=False)
# a network class imported from outside the program: like a model zoo's, it may have BatchNorm or dropout
_LIBRARY_CLASS = ModuleFacts(known=False,
                             coupling="BatchNorm or dropout (a class from outside the program may have them)")


def _is_zero(node: cst.BaseExpression | None) -> bool:
    if isinstance(node, (cst.Integer, cst.Float)):
        try:
            return float(node.evaluated_value) == 0.0
        except ValueError:
            return False
    return False


def is_false(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


class ModuleResolver:
    """Resolves `self.net`, `model`, `make_mlp(...)` to ModuleFacts, looking into this file and, given `imported`
    (`program_class_facts`), into the program file that defines a network class this file imports."""

    def __init__(self, analysis: FileAnalysis, imported: Callable[[str], ModuleFacts | None] | None = None,
                 held: Callable[[str, str], ModuleFacts | None] | None = None) -> None:
        self.a = analysis
        self.imported = imported
        self.held = held  # (class, attribute) -> facts of the networks callers hand the class's `__init__` for it
        self._class_cache: dict[str, ModuleFacts] = {}
        self._function_cache: dict[int, ModuleFacts] = {}

    # -- entry points -----------------------------------------------------------------------

    def of_callee(self, callee: cst.BaseExpression, ancestors: Sequence[cst.CSTNode]) -> ModuleFacts | None:
        """Facts for a called expression, or None when it is not (evidently) a module. `net.forward` is `net`
        (the same forward, without hooks)."""
        if isinstance(callee, cst.Attribute) and callee.attr.value == "forward" and not (
                isinstance(callee.value, cst.Name) and callee.value.value == "self"):
            return self.of_callee(callee.value, ancestors)
        if isinstance(callee, cst.Attribute) and isinstance(callee.value, cst.Name) and callee.value.value == "self":
            info = self.a.enclosing_class(ancestors)
            if info is None:
                return None
            bindings = [b for b in info.attrs.get(callee.attr.value, []) if b.kind is BindingKind.ASSIGN]
            if bindings and self.held is not None and all(isinstance(b.value, cst.Name) for b in bindings):
                # `self.policy = policy` from `__init__(self, policy)`: what the program's callers pass
                return self.held(info.node.name.value, callee.attr.value)
            if bindings:
                return self._of_values([b.value for b in bindings], info.node)
            method = self._method(info.node, callee.attr.value)
            if method is not None and info.is_module:
                # `self.forward_once(x)`: a network only when it wraps a submodule (or the module's own forward);
                # `self._reshape(x)`, a static `get_params(table, t)` are helpers, not networks
                facts = self._method_network(info, method, set())
                if facts is None:
                    return None
                return replace(facts, outputs=returns_arity(method))
            return None
        if isinstance(callee, cst.Name):
            # `D = D.to(device)` keeps what `D` was: only the other bindings say what it is
            bindings = [b for b in self.a.bindings_of(callee.value, ancestors)
                        if not rebinds_itself(callee.value, b.value)]
            values = [b.value for b in bindings if b.kind is BindingKind.ASSIGN]
            if values and len(values) == len(bindings):
                return self._of_values(values, None)
            return None
        return None

    def _method_network(self, info, method: cst.FunctionDef, seen: set[str]) -> ModuleFacts | None:  # noqa: ANN001
        """Facts of the networks a method of a module class runs: `self.encoder(x)`, `self(x)`,
        `self.forward(x)`, another method that does; None when it runs none (a reshaping helper)."""
        seen.add(method.name.value)
        facts: ModuleFacts | None = None
        for call in iter_calls(method.body):
            func = call.func
            found: ModuleFacts | None = None
            if isinstance(func, cst.Name) and func.value == "self":
                found = self.of_class(info.node.name.value)
            elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
                attr = func.attr.value
                bindings = info.attrs.get(attr, [])
                assigned = [b for b in bindings if b.kind is BindingKind.ASSIGN]
                if attr == "forward":
                    found = self.of_class(info.node.name.value)
                elif assigned:
                    found = self._of_values([b.value for b in assigned], info.node)
                    if found is None and MODULE_NAME.search(attr):
                        found = UNKNOWN  # `self.encoder = encoder`: a network handed in
                    if found is not None and (found.loss or not found.parametric):
                        found = None
                elif attr not in seen:
                    inner = self._method(info.node, attr)
                    if inner is not None:
                        found = self._method_network(info, inner, seen)
            if found is not None:
                facts = found if facts is None else facts.merge(found)
        return facts

    def of_expression(self, node: cst.BaseExpression, ancestors: Sequence[cst.CSTNode]) -> ModuleFacts | None:
        if isinstance(node, cst.Call):
            return self.of_construction(node, None)
        return self.of_callee(node, ancestors)

    def _of_values(self, values: list[cst.BaseExpression | None], owner: cst.ClassDef | None) -> ModuleFacts | None:
        facts: ModuleFacts | None = None
        for value in values:
            if not isinstance(value, cst.Call):
                return None
            found = self.of_construction(value, owner)
            if found is None:
                return None
            facts = found if facts is None else facts.merge(found)
        return facts

    # -- constructions ----------------------------------------------------------------------

    def of_construction(self, call: cst.Call, owner: cst.ClassDef | None, depth: int = 0) -> ModuleFacts | None:
        """`nn.Linear(...)`, `MyNet(...).to(device)`, `torch.compile(net)`, `make_mlp(...)`; None: not a module."""
        if depth > 6:
            return UNKNOWN
        name = method_name(call)
        if name in WRAPPER_METHODS and isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Call):
            return self.of_construction(call.func.value, owner, depth + 1)
        qual = self.a.call_qualname(call) or ""
        if qual == "torch.compile" and call.args and isinstance(call.args[0].value, cst.Call):
            return self.of_construction(call.args[0].value, owner, depth + 1)
        if qual in _BUFFERS:
            return None
        if qual.startswith(_LIBRARY_MODELS) or qual in _LIBRARY_MODEL_FUNCTIONS:
            # `torchvision.models.resnet50()`, `timm.create_model(...)`: may have BatchNorm and dropout
            return ModuleFacts(known=False, coupling="BatchNorm or dropout (a library model may have them)")
        if qual.startswith("torch.nn.") and not qual.startswith(_NOT_MODULE_PREFIXES):
            return self._builtin(call, qual.rsplit(".", 1)[-1], owner, depth)
        func = dotted_name(call.func) or ""
        if isinstance(call.func, cst.Name) and func in self.a.classes:
            info = self.a.classes[func]
            return self.of_class(func) if info.is_module else None
        if isinstance(call.func, cst.Name) and func in self.a.functions:
            return self._of_factory(self.a.functions[func][-1], call, owner, depth)
        last = func.rsplit(".", 1)[-1]
        if last[:1].isupper() and not qual.startswith(_NOT_MODULE_PREFIXES) and not func.startswith("self."):
            # (`self.V(h)` runs a submodule named in capitals; it constructs nothing)
            found = self.imported(last) if self.imported is not None else None
            return found if found is not None else UNKNOWN  # an imported model class
        return None

    def _builtin(self, call: cst.Call, kind: str, owner: cst.ClassDef | None, depth: int) -> ModuleFacts:
        if _BATCH_NORM.match(kind):
            return ModuleFacts(coupling="BatchNorm", outputs=1)
        if _DROPOUT.match(kind):
            rate = call_arg(call, "p", 0)
            return ModuleFacts(coupling=None if rate is not None and _is_zero(rate.value) else "dropout", outputs=1,
                               parametric=False)
        if kind in _RECURRENT:
            return ModuleFacts(blocker="a recurrent module (hidden state, batch in dim 1 unless batch_first)")
        if kind in _ATTENTION:
            facts = ModuleFacts(outputs=2 if kind == "MultiheadAttention" else 1)
            if kind in ("TransformerEncoder", "TransformerDecoder"):
                layer = call_arg(call, "encoder_layer" if kind == "TransformerEncoder" else "decoder_layer", 0)
                inner = self._resolve_argument(layer.value if layer else None, call, owner, depth)
                return (inner or UNKNOWN).merge(ModuleFacts(outputs=1))
            first = call_arg(call, "batch_first")
            if first is None or not (isinstance(first.value, cst.Name) and first.value.value == "True"):
                facts = facts.merge(ModuleFacts(blocker="attention with the sequence in dim 0 (batch_first=False)"))
            rate = call_arg(call, "dropout")
            if kind != "MultiheadAttention" and (rate is None or not _is_zero(rate.value)):
                facts = facts.merge(ModuleFacts(coupling="dropout"))
            elif kind == "MultiheadAttention" and rate is not None and not _is_zero(rate.value):
                facts = facts.merge(ModuleFacts(coupling="dropout"))
            return facts
        if kind.endswith("Loss"):
            reduction = call_arg(call, "reduction")
            if reduction is not None and isinstance(reduction.value, cst.SimpleString) \
                    and reduction.value.value.strip("'\"") == "none":
                return ModuleFacts(outputs=1, loss=True)
            return ModuleFacts(outputs=1, loss=True, cross_row="a loss that reduces over the batch")
        if kind in _CONTAINERS:
            facts = ModuleFacts(outputs=1 if kind == "Sequential" else None, parametric=False)
            for arg in call.args:
                for inner_call in _outer_calls(arg.value):
                    inner = self.of_construction(inner_call, owner, depth + 1)
                    if inner is not None:
                        facts = facts.merge(ModuleFacts(inner.known, inner.coupling, inner.blocker, inner.cross_row,
                                                        shaped=inner.shaped, parametric=inner.parametric))
                if isinstance(arg.value, cst.Name):
                    inner = self._resolve_argument(arg.value, call, owner, depth)
                    if inner is None and arg.star == "*":
                        inner = self._list_of_modules(arg.value.value, call, owner, depth)
                    facts = facts.merge(inner or UNKNOWN)
            return facts
        if _SHAPED.match(kind):
            return ModuleFacts(outputs=1, shaped=f"`nn.{kind}` (inputs may differ in spatial size or length)",
                               single_layer=True)
        return ModuleFacts(outputs=1, parametric=not _PARAMETER_FREE.match(kind), single_layer=True)

    def _resolve_argument(self, node: cst.BaseExpression | None, call: cst.Call, owner: cst.ClassDef | None,
                          depth: int) -> ModuleFacts | None:
        if isinstance(node, cst.Call):
            return self.of_construction(node, owner, depth + 1)
        if isinstance(node, cst.Name):
            for scope in self.a.scopes.values():
                if any(n is call for n in iter_calls(scope.node)) and node.value in scope.bindings:
                    values = [b.value for b in scope.bindings[node.value] if b.kind is BindingKind.ASSIGN]
                    if values and all(isinstance(v, cst.Call) for v in values):
                        found = [self.of_construction(v, owner, depth + 1) for v in values]  # type: ignore[arg-type]
                        if all(found):
                            result = found[0]
                            for more in found[1:]:
                                result = result.merge(more)  # type: ignore[union-attr]
                            return result
        return None

    def _list_of_modules(self, name: str, call: cst.Call, owner: cst.ClassDef | None,
                         depth: int) -> ModuleFacts | None:
        """`nn.Sequential(*layers)` where the same function builds `layers` from list literals and
        `layers.append(...)` / `.extend([...])` / `+= [...]`; None when some part is not a construction."""
        scope_node = None
        for scope in self.a.scopes.values():
            if isinstance(scope.node, cst.FunctionDef) and any(n is call for n in iter_calls(scope.node.body)):
                if scope_node is None or any(n is scope.node for n in walk(scope_node.body)):
                    scope_node = scope.node
        if scope_node is None:
            return None
        elements: list[cst.BaseExpression] = []
        seen_binding = False
        for node in walk(scope_node.body):
            if isinstance(node, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name
                                                    for t in node.targets):
                if not isinstance(node.value, (cst.List, cst.Tuple)):
                    return None
                seen_binding = True
                elements += [e.value for e in node.value.elements]
            elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name) and node.target.value == name:
                if not isinstance(node.value, (cst.List, cst.Tuple)):
                    return None
                elements += [e.value for e in node.value.elements]
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                    and isinstance(node.func.value, cst.Name) and node.func.value.value == name:
                verb = node.func.attr.value
                if verb in ("append", "insert") and node.args:
                    elements.append(node.args[-1].value)
                elif verb == "extend" and node.args and isinstance(node.args[0].value, (cst.List, cst.Tuple)):
                    elements += [e.value for e in node.args[0].value.elements]  # type: ignore[union-attr]
                elif verb not in ("pop", "index", "count", "__len__"):
                    return None
        if not seen_binding:
            return None
        facts = ModuleFacts(outputs=1, parametric=False)
        for element in elements:
            if isinstance(element, cst.StarredElement) or not isinstance(element, cst.Call):
                return None
            inner = self.of_construction(element, owner, depth + 1)
            if inner is None:
                return None
            facts = facts.merge(ModuleFacts(inner.known, inner.coupling, inner.blocker, inner.cross_row,
                                            shaped=inner.shaped, parametric=inner.parametric))
        return facts

    def _of_factory(self, fn: cst.FunctionDef, call: cst.Call, owner: cst.ClassDef | None,
                    depth: int) -> ModuleFacts | None:
        """A same-file function: `layer_init(nn.Linear(..))` returning its argument, or `make_mlp(...)`."""
        params = [p.name.value for p in fn.params.params]
        returns = [n for n in walk(fn.body) if isinstance(n, cst.Return)]
        if params and returns and all(isinstance(r.value, cst.Name) and r.value.value == params[0] for r in returns):
            first = call.args[0].value if call.args else None
            return self.of_construction(first, owner, depth + 1) if isinstance(first, cst.Call) else None
        key = id(fn)
        if key in self._function_cache:
            return self._function_cache[key]
        self._function_cache[key] = UNKNOWN  # recursion guard
        facts: ModuleFacts | None = None
        for inner_call in iter_calls(fn.body):
            inner = self.of_construction(inner_call, owner, depth + 1)
            if inner is not None:
                facts = inner if facts is None else facts.merge(inner)
        self._function_cache[key] = facts if facts is not None else UNKNOWN
        return facts

    # -- classes of this file -----------------------------------------------------------------

    def of_class(self, name: str) -> ModuleFacts:
        if name in self._class_cache:
            return self._class_cache[name]
        self._class_cache[name] = UNKNOWN  # recursion guard
        info = self.a.classes[name]
        facts = ModuleFacts()
        for base in info.base_names:
            if base in self.a.classes and self.a.classes[base].is_module:
                facts = facts.merge(self.of_class(base))
            elif not (base.startswith("torch.nn.") or base in ("nn.Module", "Module") or base in _NEUTRAL_BASES):
                # a base class of another file of the program (`class TanhGaussianPolicy(Mlp)`), else unknown
                found = self.imported(base.rsplit(".", 1)[-1]) if self.imported is not None else None
                facts = facts.merge(found if found is not None else UNKNOWN)
        for attr, bindings in info.attrs.items():
            for binding in bindings:
                value = binding.value
                if binding.kind is BindingKind.ASSIGN and isinstance(value, cst.Call) \
                        and self.of_construction(value, info.node) is None and _may_build_module(self.a, value):
                    facts = facts.merge(UNKNOWN)  # `self.backbone = torchvision.models.resnet18()`
        forward = self._method(info.node, "forward")
        # a loss module the network holds for its trainer (`self.loss = nn.MSELoss()`) is not part of its forward
        forward_code = code_of(forward) if forward is not None else None
        for call in iter_calls(info.node, into_functions=True):
            qual = self.a.call_qualname(call) or ""
            last = qual.rsplit(".", 1)[-1]
            if qual.startswith("torch.nn.functional.") or qual in ("torch.dropout", "torch.batch_norm"):
                if last in _DROPOUT_FUNCTIONS and not is_false((call_arg(call, "training", 2) or cst.Arg(cst.Name("True"))).value):
                    facts = facts.merge(ModuleFacts(coupling="dropout"))
                elif last == "batch_norm":
                    facts = facts.merge(ModuleFacts(coupling="BatchNorm"))
                continue
            if method_name(call) in WRAPPER_METHODS:
                continue
            inner = self.of_construction(call, info.node)
            if inner is not None and not (inner.loss and forward_code is not None
                                          and not _called_in(call, info, forward_code)):
                facts = facts.merge(ModuleFacts(inner.known, inner.coupling, inner.blocker, inner.cross_row,
                                                shaped=inner.shaped))
        if forward is not None:
            # its own forward decides what a call returns, not the base class's it overrides
            facts = replace(facts, outputs=returns_arity(forward))
            for node in walk(forward.body):
                target = None
                if isinstance(node, cst.AugAssign):
                    target = node.target
                elif isinstance(node, cst.Assign):
                    target = next((t.target for t in node.targets if isinstance(t.target, cst.Attribute)), None)
                if isinstance(target, cst.Attribute) and dotted_name(target.value) == "self":
                    facts = facts.merge(ModuleFacts(blocker="state written in forward (self." + target.attr.value + ")"))
                    break
            issue = _cross_row_in_forward(self.a, forward)
            if issue:
                facts = facts.merge(ModuleFacts(cross_row=issue))
        else:
            facts = facts.merge(ModuleFacts(outputs=None))
        facts = replace(facts, parametric=self._class_parametric(info))
        self._class_cache[name] = facts
        return facts

    def _class_parametric(self, info) -> bool:  # noqa: ANN001
        """Does a module class of this file hold learned weights? False only when everything is visible and
        there is no `nn.Parameter`, no learned layer (`nn.Linear`, a same-file network, an imported model) and
        no submodule handed in from outside: a rotary-embedding or masking helper that keeps only buffers
        (`register_buffer`, plain tensors) is elementwise glue, not a network."""
        for base in info.base_names:
            if base in self.a.classes and self.a.classes[base].is_module:
                if self.of_class(base).parametric:
                    return True
            elif base not in ("torch.nn.Module", "nn.Module", "Module"):
                last = base.rsplit(".", 1)[-1]
                if not (base.startswith("torch.nn.") and _PARAMETER_FREE.match(last)):
                    return True  # `class Linear(nn.Linear)`, an imported base: may hold weights
        for attr, bindings in info.attrs.items():
            for binding in bindings:
                value = binding.value
                if binding.kind is BindingKind.ASSIGN and isinstance(value, cst.Call) \
                        and self.of_construction(value, info.node) is None and _may_build_module(self.a, value):
                    return True
        called, inspected = _self_uses(info.node)
        params = {p.name.value for fn in walk(info.node, into_functions=True) if isinstance(fn, cst.FunctionDef)
                  for p in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]}
        for attr, bindings in info.attrs.items():
            for binding in bindings:
                value = binding.value
                if isinstance(value, cst.Call) and binding.kind is BindingKind.ASSIGN:
                    continue  # judged below, with every other construction in the class
                if attr in called or (attr in inspected and isinstance(value, cst.Name) and value.value in params):
                    return True  # `self.head = head` then `self.head(x)` / `self.emb.weight`: handed-in weights
        for call in iter_calls(info.node, into_functions=True):
            qual = self.a.call_qualname(call) or ""
            last = (qual or dotted_name(call.func) or "").rsplit(".", 1)[-1]
            if last in ("Parameter", "UninitializedParameter", "register_parameter", "add_module",
                        "register_module", "setattr", "ParameterList", "ParameterDict"):
                return True
            if method_name(call) in WRAPPER_METHODS or qual.startswith(_NOT_MODULE_PREFIXES) or qual in _BUFFERS:
                continue
            inner = self.of_construction(call, info.node)
            if inner is not None and (inner.parametric or not inner.known):
                return True
        return False

    @staticmethod
    def _method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
        for statement in cls.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
                return statement
        return None


_PLAIN_BUILTINS = {"int", "float", "bool", "str", "list", "dict", "tuple", "set", "len", "range", "max", "min",
                   "sum", "abs", "round", "getattr", "isinstance", "super", "print", "sorted", "zip", "enumerate"}


def _may_build_module(a: FileAnalysis, call: cst.Call) -> bool:
    """Could `self.x = call` store a network gpulint cannot see (an imported model or factory)?"""
    qual = a.call_qualname(call) or ""
    if qual.startswith(("torch.", "numpy.", "np.", "math.", "collections.", "itertools.", "functools.", "os.", "sys.",
                        "time.", "datetime.", "json.", "logging.", "re.", "random.", "pathlib.", "argparse.")):
        return False
    if isinstance(call.func, cst.Name) and call.func.value in _PLAIN_BUILTINS:
        return False
    if isinstance(call.func, cst.Attribute) and not qual:
        return False  # a method of a local object: `x.clone()`, `cfg.get(...)`
    return True


def _outer_calls(node: cst.BaseExpression) -> Iterator[cst.Call]:
    """Calls in `node` that are not arguments of another call (`layer_init(nn.Linear(..))` -> the outer one)."""
    if isinstance(node, cst.Call):
        yield node
        return
    for child in child_nodes(node):
        if isinstance(child, cst.BaseExpression):
            yield from _outer_calls(child)
        else:
            for grandchild in child_nodes(child):
                if isinstance(grandchild, cst.BaseExpression):
                    yield from _outer_calls(grandchild)


def _self_uses(cls: cst.ClassDef) -> tuple[set[str], set[str]]:
    """Attributes of `self` that the class calls (`self.x(...)`) and whose attributes it reads (`self.x.weight`)."""
    called: set[str] = set()
    inspected: set[str] = set()
    for node in walk(cls, into_functions=True):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and dotted_name(node.func.value) == "self":
            called.add(node.func.attr.value)
        elif isinstance(node, cst.Attribute) and isinstance(node.value, cst.Attribute) \
                and dotted_name(node.value.value) == "self":
            inspected.add(node.value.attr.value)
    return called, inspected


def returns_arity(fn: cst.FunctionDef) -> int | None:
    arities = set()
    for node in walk(fn.body):
        if isinstance(node, cst.Return):
            value = node.value
            if isinstance(value, cst.Tuple) and not any(isinstance(e, cst.StarredElement) for e in value.elements):
                arities.add(len(value.elements))
            elif value is None or isinstance(value, (cst.Dict, cst.List, cst.DictComp, cst.ListComp)):
                return None
            elif isinstance(value, cst.Call) and (dotted_name(value.func) or "").rsplit(".", 1)[-1][:1].isupper():
                return None  # an object built from the outputs (`Normal(mean, std)`, `Output(...)`), not a tensor
            else:
                arities.add(1)
    return arities.pop() if len(arities) == 1 else None


_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "prod", "std", "var", "logsumexp", "all", "any",
               "argmax", "argmin", "norm", "median", "nansum", "nanmean", "count_nonzero", "cumsum", "cumprod",
               "softmax", "log_softmax", "sort", "topk", "argsort"}


def _dim_argument(call: cst.Call) -> cst.BaseExpression | None:
    arg = call_arg(call, "dim", 0 if isinstance(call.func, cst.Attribute) and method_name(call) else 1)
    return arg.value if arg is not None else None


def int_value(node: cst.BaseExpression | None) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and isinstance(node.expression, cst.Integer):
        return -int(node.expression.value)
    return None


def _cross_row_in_forward(a: FileAnalysis, fn: cst.FunctionDef) -> str | None:
    """Obvious batch-mixing operations in a module's forward: reductions over dim 0 or over everything."""
    for call in iter_calls(fn.body):
        name = method_name(call)
        qual = a.call_qualname(call) or ""
        if name in ("sum", "mean", "amax", "amin", "max", "min", "std", "var", "prod") and isinstance(call.func, cst.Attribute) \
                and not qual:
            dim = _dim_argument(call)
            if dim is None and not call.args:
                return f"`.{name}()` over the whole batch"
            if int_value(dim) == 0:
                return f"`.{name}(0)` over the batch dimension"
        if qual in ("torch.cat", "torch.stack"):
            dim = call_arg(call, "dim", 1)
            if dim is None or int_value(dim.value) == 0:
                return f"`{qual}` along the batch dimension"
    return None


_ELEMENTWISE_METHODS = {"relu", "relu_", "tanh", "sigmoid", "exp", "expm1", "abs", "neg", "float", "half", "double",
                        "bfloat16", "long", "int", "bool", "to", "type_as", "clamp", "clamp_min", "clamp_max", "clip",
                        "masked_fill", "where", "contiguous", "detach", "sign", "square", "sin", "cos", "erf",
                        "floor", "ceil", "round", "trunc", "add", "sub", "mul", "div", "logical_not", "logical_and",
                        "logical_or", "eq", "ne", "lt", "le", "gt", "ge", "cpu", "cuda", "numpy", "tolist",
                        "nan_to_num", "lerp", "maximum", "minimum", "softplus", "gelu", "silu", "clone", "pow",
                        "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "reciprocal", "acos", "asin", "atanh",
                        "acosh", "type", "sigmoid_", "tanh_"}
_NAN_PRONE = {"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "acos", "asin", "atanh", "acosh"}
_ELEMENTWISE_FUNCTIONS = {
    "torch.relu", "torch.tanh", "torch.sigmoid", "torch.exp", "torch.abs", "torch.clamp", "torch.clip", "torch.where",
    "torch.maximum", "torch.minimum", "torch.sign", "torch.square", "torch.sin", "torch.cos", "torch.erf",
    "torch.log", "torch.log1p", "torch.log2", "torch.sqrt", "torch.rsqrt", "torch.reciprocal", "torch.nan_to_num",
    "torch.lerp", "torch.matmul", "torch.bmm", "torch.baddbmm", "torch.addmm", "torch.mul", "torch.add",
    "torch.sub", "torch.div", "torch.logical_not", "torch.logical_and", "torch.logical_or", "torch.isnan",
    "torch.isfinite", "torch.pow", "torch.atanh", "torch.acos", "torch.asin",
    "torch.nn.functional.relu", "torch.nn.functional.gelu", "torch.nn.functional.silu", "torch.nn.functional.elu",
    "torch.nn.functional.leaky_relu", "torch.nn.functional.softplus", "torch.nn.functional.mish",
    "torch.nn.functional.tanh", "torch.nn.functional.sigmoid", "torch.nn.functional.hardtanh",
    "torch.nn.functional.linear", "torch.nn.functional.layer_norm", "torch.nn.functional.rms_norm",
    "torch.nn.functional.embedding", "torch.nn.functional.one_hot", "torch.nn.functional.glu",
    "torch.nn.functional.scaled_dot_product_attention", "torch.nn.functional.logsigmoid",
    "numpy.asarray", "numpy.array", "numpy.stack", "torch.as_tensor", "torch.tensor", "torch.from_numpy",
    "torch.stack",
}
_DIM_FUNCTIONS = {"torch.softmax", "torch.log_softmax", "torch.sum", "torch.mean", "torch.amax", "torch.amin",
                  "torch.logsumexp", "torch.cat", "torch.concat", "torch.argmax", "torch.all", "torch.any",
                  "torch.nn.functional.softmax", "torch.nn.functional.log_softmax", "torch.nn.functional.normalize",
                  "torch.nn.functional.cosine_similarity", "torch.cumsum", "torch.norm", "torch.linalg.vector_norm"}
_STACKERS = {"numpy.asarray", "numpy.array", "numpy.stack", "torch.as_tensor", "torch.tensor", "torch.from_numpy",
             "torch.stack"}
_NUMPY_CALL = ("numpy.", "np.")


class RowCheck:
    """Walks expressions and says why one is not a row-by-row function of the tracked values.

    `tracked(node)` says whether a node is a tracked (batch-indexed) value: a name or a gathered subscript.
    With `rank1` the batch index is one dimension, so positive dims keep their meaning in the full batch."""

    def __init__(self, analysis: FileAnalysis, ancestors: Sequence[cst.CSTNode], tracked, rank1: bool,
                 modules: ModuleResolver, *, allow_stacking: bool = False) -> None:
        self.a = analysis
        self.ancestors = ancestors
        self.tracked = tracked
        self.rank1 = rank1
        self.modules = modules
        self.allow_stacking = allow_stacking
        self.nan_prone: list[str] = []
        self.module_calls: list[tuple[cst.Call, ModuleFacts]] = []
        self._touch: dict[int, bool] = {}

    def touches(self, node: cst.CSTNode) -> bool:
        key = id(node)
        if key not in self._touch:
            self._touch[key] = bool(self.tracked(node)) or any(self.touches(c) for c in child_nodes(node))
        return self._touch[key]

    def _dim_ok(self, dim: cst.BaseExpression | None, what: str) -> str | None:
        if isinstance(dim, (cst.Tuple, cst.List)):
            for element in dim.elements:
                issue = self._dim_ok(element.value, what)
                if issue:
                    return issue
            return None
        value = int_value(dim)
        if value is None:
            return f"`{what}` without a literal dim may reduce over rows"
        if value == 0:
            return f"`{what}` over dim 0 mixes rows"
        if value > 0 and not self.rank1:
            return f"`{what}` with a positive dim changes meaning when the batch is not compacted"
        return None

    def issue(self, node: cst.CSTNode) -> str | None:
        if not self.touches(node) or self.tracked(node):
            return None
        if isinstance(node, cst.Subscript):
            first = node.slice[0].slice if node.slice else None
            if self.touches(node.value):
                if isinstance(node.value, cst.Attribute) and node.value.attr.value == "shape":
                    index = first.value if isinstance(first, cst.Index) else None
                    return "reads the row count (`.shape[0]`)" if int_value(index) in (0, None) else None
                ok = isinstance(first, cst.Slice) and first.lower is None and first.upper is None and first.step is None
                ok = ok or (isinstance(first, cst.Index) and isinstance(first.value, cst.Ellipsis))
                if not ok:
                    return "indexes rows of the selection"
            return self._children(node)
        if isinstance(node, cst.Attribute):
            if node.attr.value in ("T", "mT", "H"):
                return f"`.{node.attr.value}` moves the batch dimension"
            if node.attr.value in ("shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "values", "indices"):
                return self.issue(node.value) if node.attr.value in ("values", "indices") else None
            return self._children(node)
        if isinstance(node, cst.Call):
            return self._call(node)
        if isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, cst.Divide) and self.touches(node.right) and not _guarded_denominator(node.right):
                self.nan_prone.append("division")
            if isinstance(node.operator, cst.Power) and self.touches(node.left):
                exponent = int_value(node.right)
                if exponent is None or exponent < 0:
                    self.nan_prone.append("power")
            return self._children(node)
        if isinstance(node, (cst.UnaryOperation, cst.Comparison, cst.Tuple, cst.List, cst.Element,
                             cst.ComparisonTarget, cst.Arg, cst.StarredElement)):
            return self._children(node)
        if isinstance(node, (cst.BooleanOperation, cst.IfExp)):
            return "Python truthiness of a tensor"
        if isinstance(node, (cst.Lambda, cst.ListComp, cst.GeneratorExp, cst.SetComp, cst.DictComp)):
            return "iterates over the selected rows"
        return self._children(node)

    def _children(self, node: cst.CSTNode) -> str | None:
        for child in child_nodes(node):
            issue = self.issue(child)
            if issue:
                return issue
        return None

    def _call(self, call: cst.Call) -> str | None:
        if has_star_args(call):
            return "star arguments"
        qual = self.a.call_qualname(call) or ""
        name = method_name(call)
        receiver_touched = isinstance(call.func, cst.Attribute) and self.touches(call.func.value)
        args_issue = next((i for i in (self.issue(arg.value) for arg in call.args) if i), None)
        if qual:
            last = qual.rsplit(".", 1)[-1]
            if last in _DROPOUT_FUNCTIONS:
                return "dropout (random numbers are drawn per row)"
            if last.startswith(("rand", "bernoulli", "multinomial", "normal")):
                return "random numbers"
            if qual in _STACKERS and not self.allow_stacking and qual not in ("torch.as_tensor", "torch.tensor",
                                                                                "torch.from_numpy", "numpy.asarray", "numpy.array"):
                return f"`{qual}` stacks the selected rows"
            if qual in _ELEMENTWISE_FUNCTIONS:
                if last in _NAN_PRONE or last in ("pow", "div"):
                    self.nan_prone.append(last)
                return args_issue
            if qual in _DIM_FUNCTIONS:
                dim = call_arg(call, "dim", 1)
                if qual == "torch.nn.functional.normalize" and dim is None:
                    return args_issue if self.rank1 else "`normalize` over dim 1"
                issue = self._dim_ok(dim.value if dim else None, qual.rsplit(".", 1)[-1])
                return issue or args_issue
            if qual.startswith(_NUMPY_CALL):
                return f"`{qual}` on tensors"
            if qual == "len":
                return "`len()` of the selection"
            facts = self.modules.of_callee(call.func, self.ancestors) if isinstance(call.func, (cst.Name, cst.Attribute)) else None
            if facts is None:
                return f"`{qual}` is not known to act row by row"
        if name is not None and receiver_touched:
            assert isinstance(call.func, cst.Attribute)
            receiver_issue = self.issue(call.func.value)
            if receiver_issue:
                return receiver_issue
            if name in _ELEMENTWISE_METHODS:
                if name in _NAN_PRONE or name in ("pow", "div"):
                    self.nan_prone.append(name)
                return args_issue
            if name in _REDUCTIONS:
                return self._dim_ok(_dim_argument(call), f".{name}()") or args_issue
            if name in ("unsqueeze", "squeeze", "flatten", "size"):
                dim = call_arg(call, "start_dim" if name == "flatten" else "dim", 0)
                if name == "size" and dim is None:
                    return "reads the row count (`.size()`)"
                if dim is None:
                    return f"`.{name}()` without a dim" if name != "flatten" else "`.flatten()` merges rows"
                value = int_value(dim.value)
                if name == "size":
                    return "reads the row count (`.size(0)`)" if value == 0 or value is None else None
                if value == 0 or value is None:
                    return f"`.{name}({self._code(dim.value)})` touches the batch dimension"
                if value > 0 and not self.rank1:
                    return f"`.{name}` with a positive dim"
                return args_issue
            if name in ("transpose", "permute", "movedim", "swapaxes"):
                values = [int_value(a.value) for a in call.args]
                if name == "permute" and values and values[0] == 0 and all(v is not None and v > 0 for v in values[1:]):
                    return args_issue if self.rank1 else "`.permute` with a compacted batch"
                if name != "permute" and all(v is not None and v != 0 for v in values) and (self.rank1 or all(v < 0 for v in values)):
                    return args_issue
                return f"`.{name}` moves the batch dimension"
            if name == "item":
                return "`.item()` of the selection"
            return f"`.{name}()` is not known to act row by row"
        if isinstance(call.func, (cst.Name, cst.Attribute)) and not receiver_touched:
            if isinstance(call.func, cst.Name) and call.func.value == "len":
                return "`len()` of the selection"
            if isinstance(call.func, cst.Name) and call.func.value in ("float", "int", "bool", "list", "tuple"):
                return f"`{call.func.value}()` of the selection" if call.func.value != "list" else args_issue
            facts = self.modules.of_callee(call.func, self.ancestors)
            if facts is None:
                return f"`{self._code(call.func)}` is not known to act row by row"
            self.module_calls.append((call, facts))
            if not facts.known:
                return f"the definition of `{self._code(call.func)}` is not visible"
            reason = facts.coupling or facts.blocker or facts.cross_row
            if reason:
                return f"`{self._code(call.func)}` has {reason}"
            return args_issue
        return f"`{self._code(call.func)}` is not known to act row by row"

    @staticmethod
    def _code(node: cst.CSTNode) -> str:
        return cst.Module(body=[]).code_for_node(node)


def _guarded_denominator(node: cst.BaseExpression) -> bool:
    """`d.clamp_min(1)`, `d.clamp(min=eps)`, `d + eps`, `torch.clamp(d, min=...)`: cannot be zero."""
    if isinstance(node, cst.Call) and method_name(node) in ("clamp", "clamp_min", "clip"):
        return True
    if isinstance(node, cst.Call) and (dotted_name(node.func) or "").endswith(("clamp", "clamp_min", "clip")):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return not isinstance(node.right, (cst.Call, cst.Subscript)) or not isinstance(node.left, (cst.Call, cst.Subscript))
    return isinstance(node, (cst.Integer, cst.Float))


def code_of(node: cst.CSTNode) -> str:
    """Whitespace-insensitive text of a node, for 'the same expression' tests."""
    return re.sub(r"\s+", "", cst.Module(body=[]).code_for_node(node))


def names_in(node: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


def rebuild_owner(ancestors: Sequence[cst.CSTNode], block: cst.IndentedBlock,
                  body: list[cst.BaseStatement]) -> tuple[cst.CSTNode, cst.CSTNode] | None:
    """(old, new) for the nearest compound statement owning `block`, with the block's statements replaced."""
    for node in reversed(ancestors):
        if isinstance(node, cst.BaseCompoundStatement) and node is not block:
            if any(n is block for n in walk(node, into_functions=True)):
                return node, node.deep_replace(block, block.with_changes(body=body))
    return None


MODULE_NAME = re.compile(r"(^|_)(model|net|network|policy|actor|critic|encoder|decoder|disc|discriminator|"
                          r"generator|q_?net|q_?func|value_?net|backbone|agent)s?\d*$", re.I)


def module_like(expr: cst.BaseExpression, ctx, depth: int = 0) -> bool:
    """Is `expr` an nn.Module instance? Also knows Module classes defined in other files of the program and
    torchvision/timm constructors (the engine's `is_module` only knows this file's classes)."""
    if depth > 4:
        return False
    if ctx.evidence.is_module(expr) is Confidence.HIGH:
        return True
    if isinstance(expr, cst.Call):
        qual = ctx.qualname(expr.func) or ""
        last = (dotted_name(expr.func) or "").rsplit(".", 1)[-1]
        if last in ctx.program.module_classes or qual.startswith(("torchvision.models.", "timm.create_model")):
            return True
        if method_name(expr) in ("to", "cuda", "float", "half", "train", "eval") and isinstance(expr.func,
                                                                                              cst.Attribute):
            return module_like(expr.func.value, ctx, depth + 1)
        return False
    if isinstance(expr, cst.Name):
        bindings = ctx.analysis.bindings_of(expr.value, ctx.ancestors)
        values = [b.value for b in bindings if b.kind is BindingKind.ASSIGN and b.value is not None]
        return bool(values) and len(values) == len(bindings) and all(
            module_like(v, ctx, depth + 1) for v in values)
    return False


def program_class_facts(ctx) -> Callable[[str], ModuleFacts | None]:  # noqa: ANN001
    """For `ModuleResolver(imported=...)`: the facts of a network class the current file imports, read from the
    one file of its program (among those it imports, transitively) that defines a class of that name; a library
    class's when none does; None when several do. Each such file is parsed once per run, and only when a rule asks."""
    from gpulint.program import defining_files  # (the program layer reads imports without libcst)

    def facts(name: str) -> ModuleFacts | None:
        defining = defining_files(ctx, "class", name)
        if not defining:  # a library's class (`NLayerDiscriminator` from taming): its layers are not in sight
            return _LIBRARY_CLASS
        files = [path for path in defining if path != ctx.path]
        if len(files) != 1:
            return None
        path = files[0]
        return ctx.program.derived(f"module-facts:{path}:{name}",
                                   lambda program: _class_facts_in(program.sources[path], name, program.module_classes))

    return facts


def held_class_facts(ctx) -> Callable[[str, str], ModuleFacts | None]:  # noqa: ANN001
    """For `ModuleResolver(held=...)`: the facts of the network classes the program's callers pass to a class's
    `__init__` for the parameter it keeps in `self.<attr>` (the call graph's `#holds:` markers), merged; None when
    they pass no network class. Classes that are not networks (an exploration strategy passed as a policy in
    another script) do not count."""
    from gpulint.program import program_index  # (the program layer reads imports without libcst)

    def facts(class_name: str, attr: str) -> ModuleFacts | None:
        prefix = f"{class_name}#holds:{attr}:"
        found: ModuleFacts | None = None
        for key in ctx.analysis.program_keys:
            if not key.startswith(prefix) or "::" not in key:
                continue
            path, name = key[len(prefix):].rsplit("::", 1)
            if path not in ctx.program.sources:
                continue
            held = _program_class_facts(ctx.program, program_index(ctx).definitions("class"), path, name, 0)
            if held is not None:
                found = held if found is None else found.merge(held)
        return found

    return facts


_BASE_DEPTH = 4  # base classes followed across the program's files
_NEUTRAL_BASES = frozenset({"object", "ABC", "abc.ABC", "Generic", "typing.Generic", "Protocol"})


def _called_in(construction: cst.Call, info, code: str) -> bool:  # noqa: ANN001
    """Is the attribute that `construction` is assigned to (`self.loss = nn.MSELoss()`) called in `code`? True when
    it is bound to no attribute (built inline where it is used)."""
    for attr, bindings in info.attrs.items():
        if any(binding.value is construction for binding in bindings):
            return re.search(rf"\bself\.{re.escape(attr)}\s*\(", code) is not None
    return True


def _program_class_facts(program, defining: dict[str, list[str]], path: str, name: str,  # noqa: ANN001
                         depth: int) -> ModuleFacts | None:
    """The facts of class `name` defined in `path`, its base classes looked up in the files of the program that
    define them (`defining`: `ProgramIndex.definitions("class")`), to _BASE_DEPTH levels. Remembered per program."""
    def compute(program) -> ModuleFacts | None:  # noqa: ANN001
        def base_facts(base: str) -> ModuleFacts | None:
            files = defining.get(base, [])
            if depth >= _BASE_DEPTH or not files:
                return None
            if base not in program.module_classes:
                return ModuleFacts()  # a plain mixin of the program (`class Policy(object)`): no layers
            found = [_program_class_facts(program, defining, file, base, depth + 1) for file in files]
            if any(facts is None for facts in found):
                return None
            merged = found[0]
            for facts in found[1:]:  # several files define the name: what holds for all of them
                merged = merged.merge(facts)
            return merged
        return _class_facts_in(program.sources[path], name, program.module_classes, base_facts)
    return program.derived(f"held-module-facts:{path}:{name}", compute)


def _class_facts_in(text: str, name: str, module_classes: set[str],
                    bases: Callable[[str], ModuleFacts | None] | None = None) -> ModuleFacts | None:
    from gpulint.analysis import analyze
    from gpulint.engine import TooComplex, parse  # the parse guarded against inputs that crash libcst

    try:
        module = parse(text)
    except (SyntaxError, cst.ParserSyntaxError, TooComplex, ValueError):
        return None  # the class stays unknown; the file's own run reports the problem
    analysis = analyze(module, module_classes)
    info = analysis.classes.get(name)
    if info is None or not info.is_module:
        return None
    return ModuleResolver(analysis, bases).of_class(name)
