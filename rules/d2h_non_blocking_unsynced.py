from __future__ import annotations

import libcst as cst

from gpulint import Invalid, Rule, Severity, Valid
from gpulint.analysis import call_arg, child_nodes, dotted_name, method_name
from gpulint.semantic.placement import DEVICE, HOST, NONTENSOR, TENSOR, Placement

# Uses of the host tensor that only look at metadata or hand it back to the GPU (ordered on the same stream).
_METADATA_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "layout", "requires_grad", "is_leaf", "names"}
_METADATA_METHODS = {"size", "dim", "numel", "nelement", "element_size", "is_pinned", "is_contiguous", "stride",
                     "data_ptr", "get_device", "record_stream", "is_floating_point", "storage_offset"}
_BACK_TO_DEVICE = {"cuda", "to"}
# Methods returning a view of the same (still in-flight) data: follow how the view is used.
_VIEW_METHODS = {"detach", "view", "view_as", "squeeze", "unsqueeze", "permute", "transpose", "t", "expand",
                 "expand_as", "narrow", "select", "unflatten", "contiguous", "reshape", "flatten", "as_strided"}
# Calls that read their arguments' data on the host right away.
_HOST_READERS = {"print", "float", "int", "bool", "str", "repr", "list", "tuple", "sum", "max", "min", "sorted",
                 "format"}
_HOST_READER_PREFIXES = ("numpy.", "np.", "torch.", "math.", "pickle.", "json.")
# Calls that wait for the GPU on the host: after them the copy has landed.
_SYNC_METHODS = {"synchronize", "query"}
_BLOCKING_READS = {"item", "tolist", "cpu"}
# Calls known not to wait for the GPU (between the copy and the read, anything else might).
_QUIET_BUILTINS = {"len", "range", "enumerate", "zip", "isinstance", "hasattr", "getattr", "setattr", "min", "max",
                   "abs", "round", "sorted", "list", "dict", "tuple", "set", "sum", "any", "all", "id", "type"}
_QUIET_PREFIXES = ("numpy.", "np.", "math.", "time.", "os.", "random.", "collections.", "itertools.",
                   "functools.", "re.", "json.", "pickle.")
_CONTAINER_METHODS = {"append", "extend", "insert", "pop", "get", "keys", "values", "items", "update", "setdefault",
                      "format", "join", "split", "strip", "startswith", "endswith", "replace", "copy", "clear"}


class D2hNonBlockingUnsynced(Rule):
    """
    ## What it does
    Finds device-to-host copies made with `non_blocking=True` (`t.to("cpu", non_blocking=True)`,
    `host_buf.copy_(gpu_t, non_blocking=True)`) whose result is read on the host (`.numpy()`, `.item()`,
    `.tolist()`, indexing, arithmetic, `print`, an `if`) before anything waits for the GPU
    (`torch.cuda.synchronize()`, `stream.synchronize()`, `event.synchronize()`, or another blocking read such
    as `loss.item()`).

    ## Why is this slow
    It is not slow, it is wrong. A non-blocking device-to-host copy returns before the data has arrived: the
    host tensor holds whatever was in that memory until the copy engine finishes. Reading it early gives
    silently wrong values (H100: 10 of 100 trials read wrong data without a sync, 0 of 100 with one; H200,
    torch 2.11, 800 MB copies: 49 of 50 wrong, `torch.cat` of the result 45 of 50 wrong, 0 of 50 after
    `torch.cuda.synchronize()` or after a blocking `.item()` on another GPU value). The
    PyTorch pin-memory tutorial: `cuda_tensor.to("cpu", non_blocking=True).mean()` "will result in erroneous
    outputs". Torch raises no error and no warning.

    ## Example
    ```python
    preds = logits.argmax(-1).to("cpu", non_blocking=True)
    accuracy = (preds.numpy() == labels).mean()
    ```

    ## Use instead
    ```python
    preds = logits.argmax(-1).to("cpu", non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    ...  # overlap other host work here
    done.synchronize()
    accuracy = (preds.numpy() == labels).mean()
    ```
    or drop `non_blocking=True` when nothing else needs to overlap the copy.

    ## Fix safety
    No automatic fix: whether to block at the copy or to place an event wait later is a design choice.
    """

    code = "GPU012"
    name = "d2h-non-blocking-unsynced"
    message = "Non-blocking device-to-host copy read on the host before any synchronization: the data may not have arrived"
    severity = Severity.ERROR
    priority = "P1"
    triggers = ("non_blocking",)
    examples = [
        Valid(
            """
            import torch
            out = model(x.cuda())
            host = out.to("cpu", non_blocking=True)
            torch.cuda.synchronize()
            print(host.numpy())
            """
        ),
        Valid(  # host-to-device is ordered on the stream: safe
            """
            import torch
            x = batch.to("cuda", non_blocking=True)
            print(model(x).sum())
            """
        ),
        Invalid(
            """
            import torch
            out = model(x.cuda())
            host = out.to("cpu", non_blocking=True)
            print(host.numpy())
            """
        ),
        Invalid(
            """
            import torch
            gpu_values = torch.randn(1024, device="cuda")
            buf = torch.empty(1024, pin_memory=True)
            buf.copy_(gpu_values, non_blocking=True)
            total = buf.sum()
            """
        ),
    ]

    def __init__(self, ctx) -> None:  # noqa: ANN001 - RuleContext
        super().__init__(ctx)
        self._enabled = ctx.targets_cuda()

    def visit_Call(self, node: cst.Call) -> None:
        if not self._enabled or not isinstance(node.func, cst.Attribute):
            return
        flag = call_arg(node, "non_blocking")
        if flag is None or not (isinstance(flag.value, cst.Name) and flag.value.value == "True"):
            return
        name = method_name(node)
        placement = Placement(self.ctx)
        if name == "to":
            if placement.target_of_to(node) != HOST:
                return
            if placement.of(node.func.value) in (HOST, NONTENSOR):
                return  # CPU to CPU: nothing in flight
            tracked = self._assigned_names(node)
        elif name == "copy_":
            source = call_arg(node, "src", 0)
            if source is None or placement.of(node.func.value) != HOST \
                    or placement.of(source.value) not in (DEVICE, TENSOR):
                return
            target = dotted_name(node.func.value)
            tracked = {target} if target else set()
        else:
            return
        read = self._immediate_read(node) if name == "to" else None
        if read is None and tracked:
            read = self._first_read(tracked)
        if read is None:
            return
        line = self._line_of(read)
        where = f" (read on line {line})" if line else ""
        self.report(node, f"Non-blocking device-to-host copy read on the host before any synchronization{where}: "
                          "the data may not have arrived yet; drop `non_blocking=True` or wait on an event / "
                          "`torch.cuda.synchronize()` before reading")

    # -- what is the copy's result called, and how is it used right away ---------------------

    def _assigned_names(self, call: cst.Call) -> set[str]:
        ancestors = self.ctx.ancestors
        parent = ancestors[-2] if len(ancestors) > 1 else None
        if isinstance(parent, cst.Element) and len(ancestors) > 3 and isinstance(ancestors[-3], cst.Tuple) \
                and isinstance(ancestors[-4], cst.Assign):
            assign, index = ancestors[-4], ancestors[-3].elements.index(parent)
            found = set()
            for target in assign.targets:
                if isinstance(target.target, cst.Tuple) and index < len(target.target.elements):
                    name = dotted_name(target.target.elements[index].value)
                    if name:
                        found.add(name)
            return found
        if isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is call:
            targets = [t.target for t in parent.targets] if isinstance(parent, cst.Assign) else [parent.target]
            return {n for n in (dotted_name(t) for t in targets) if n}
        return set()

    def _immediate_read(self, call: cst.Call) -> cst.CSTNode | None:
        """`t.to("cpu", non_blocking=True).numpy()`: the result read in the same expression."""
        ancestors = self.ctx.ancestors
        parent = ancestors[-2] if len(ancestors) > 1 else None
        if isinstance(parent, cst.Assign) and parent.value is call:
            placement = Placement(self.ctx)
            for target in parent.targets:
                if isinstance(target.target, cst.Subscript) \
                        and placement.of(target.target.value) in (HOST, DEVICE, TENSOR):
                    return parent  # `host_t[i] = gpu.to("cpu", non_blocking=True)` copies the in-flight data
        return _use_is_read(call, list(ancestors[:-1]), self.ctx)

    # -- scanning forward --------------------------------------------------------------------

    def _first_read(self, tracked: set[str]) -> cst.CSTNode | None:
        """The first host read of a tracked name after the current statement, unless a sync, a rebinding or an
        escape (return, stored in a container, passed to an unknown function) comes first."""
        ancestors = self.ctx.ancestors
        for index in range(len(ancestors) - 1, 0, -1):
            statement = ancestors[index]
            parent = ancestors[index - 1]
            if isinstance(statement, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if not isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                continue
            body = getattr(parent, "body", None)
            if not isinstance(body, (list, tuple)) or statement not in body:
                continue
            for later in body[body.index(statement) + 1:]:
                outcome = self._scan(later, tracked)
                if outcome == "stop":
                    return None
                if isinstance(outcome, cst.CSTNode):
                    return outcome
        return None

    def _scan(self, statement: cst.CSTNode, tracked: set[str]) -> cst.CSTNode | str | None:
        """Walk one statement in evaluation order (a call acts after its arguments): the reading node, "stop"
        (a sync or a call that may sync, a rebinding, an escape) or None."""
        parents: dict[int, cst.CSTNode] = {}
        stack: list[tuple[cst.CSTNode, bool]] = [(statement, False)]
        while stack:
            current, leaving = stack.pop()
            if leaving:
                if isinstance(current, cst.Call) and self._may_sync(current, tracked):
                    return "stop"
                continue
            if isinstance(current, (cst.Name, cst.Attribute)) and dotted_name(current) in tracked:
                outcome = self._occurrence(current, parents)
                if outcome is not None:
                    return outcome
            if isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                continue
            stack.append((current, True))
            for child in reversed(child_nodes(current)):
                parents[id(child)] = current
                stack.append((child, False))
        return None

    def _occurrence(self, node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> cst.CSTNode | str | None:
        parent = parents.get(id(node))
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return None
        chain = _parent_chain(node, parents)
        if _is_store(node, chain):
            return "stop"  # rebound: no longer the copy's result
        use = _use_is_read(node, chain, self.ctx)
        if use is not None:
            return use
        return "stop" if _escapes(node, chain) else None

    def _may_sync(self, call: cst.Call, tracked: set[str]) -> bool:
        """Does this call (possibly) wait for the GPU on the host? Unknown functions count as "maybe"."""
        qual = self.ctx.qualname(call.func) or ""
        if qual.startswith(("torch.cuda.", "torch.distributed.")):
            return True  # torch.cuda.synchronize() & co.
        placement = Placement(self.ctx)
        if isinstance(call.func, cst.Attribute):
            method = call.func.attr.value
            receiver = dotted_name(call.func.value)
            if receiver in tracked:
                return False
            if method in _SYNC_METHODS:
                return True
            kind = placement.of(call.func.value)
            if kind in (DEVICE, TENSOR):
                if method in _BLOCKING_READS:
                    return True
                if method == "to" and call_arg(call, "non_blocking") is None \
                        and placement.target_of_to(call) == HOST:
                    return True
                return False  # other tensor methods only queue kernels
            if kind in (HOST, NONTENSOR) or method in _CONTAINER_METHODS:
                return False
            if qual.startswith(_QUIET_PREFIXES) or qual.startswith("torch."):
                return False
            return True  # a method of something we do not know: it may sync
        if isinstance(call.func, cst.Name) and not qual:
            if call.func.value in ("float", "int", "bool", "print", "str", "repr", "format"):
                return any(placement.of(a.value) in (DEVICE, TENSOR) for a in call.args)
            if call.func.value in _QUIET_BUILTINS and not self.ctx.analysis.bindings_of(call.func.value,
                                                                                        self.ctx.ancestors):
                return False
            return True
        if qual.startswith(_QUIET_PREFIXES) or qual.startswith("torch."):
            return False
        return True

    def _line_of(self, node: cst.CSTNode) -> int | None:
        from libcst.metadata import MetadataWrapper, PositionProvider

        try:
            positions = MetadataWrapper(self.ctx.module, unsafe_skip_copy=True).resolve(PositionProvider)
            return positions[node].start.line
        except Exception:  # noqa: BLE001 - the line is only a hint in the message
            return None


def _parent_chain(node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> list[cst.CSTNode]:
    """Ancestors of `node` inside the scanned statement, outermost first (node excluded)."""
    chain = []
    current = parents.get(id(node))
    while current is not None:
        chain.append(current)
        current = parents.get(id(current))
    return chain[::-1]


def _is_store(node: cst.CSTNode, chain: list[cst.CSTNode]) -> bool:
    for parent in reversed(chain):
        if isinstance(parent, cst.AssignTarget):
            return True
        if isinstance(parent, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            if isinstance(parent, cst.AugAssign) and parent.target is node:
                return False  # `host += 1` reads it first
            return isinstance(parent, cst.AnnAssign) and parent.target is node
        if isinstance(parent, (cst.For,)) and parent.target is node:
            return True
    return False


def _use_is_read(node: cst.CSTNode, chain: list[cst.CSTNode], ctx) -> cst.CSTNode | None:  # noqa: ANN001
    """Is this occurrence of the host tensor (or the copy expression itself) a read of its data? `chain` holds
    the node's ancestors, outermost first. Returns the reading node."""
    parent = chain[-1] if chain else None
    grandparent = chain[-2] if len(chain) > 1 else None
    if isinstance(parent, cst.Attribute) and parent.value is node:
        attr = parent.attr.value
        if attr in _METADATA_ATTRS:
            return None
        if isinstance(grandparent, cst.Call) and grandparent.func is parent:
            if attr in _METADATA_METHODS:
                return None
            if attr in _VIEW_METHODS:
                return _use_is_read(grandparent, chain[:-2], ctx)  # same in-flight data under a new name
            if attr in _BACK_TO_DEVICE:
                target = call_arg(grandparent, "device", 0)
                if attr == "cuda" or target is not None and Placement(ctx).device_kind(target.value) == DEVICE:
                    return None  # handed back to the GPU: ordered on the stream
            return grandparent  # host.numpy(), host.item(), host.mean(), host.copy_(...)
        return parent  # host.T, host.data, ... then used
    if isinstance(parent, cst.Subscript) and parent.value is node:
        return parent
    if isinstance(parent, (cst.BinaryOperation, cst.Comparison, cst.UnaryOperation, cst.BooleanOperation)):
        return parent
    if isinstance(parent, (cst.If, cst.While, cst.IfExp, cst.Assert)) and getattr(parent, "test", None) is node:
        return parent
    if isinstance(parent, cst.AugAssign):
        return parent
    if isinstance(parent, (cst.FormattedStringExpression,)):
        return parent
    if isinstance(parent, cst.Element) and isinstance(grandparent, (cst.List, cst.Tuple)) and len(chain) > 3 \
            and isinstance(chain[-3], cst.Arg) and isinstance(chain[-4], cst.Call):
        qual = ctx.qualname(chain[-4].func) or ""
        if qual.startswith(("torch.", "numpy.", "np.")) and not qual.startswith("torch.cuda"):
            return chain[-4]  # torch.cat([host, ...]) reads it on the host
    if isinstance(parent, cst.Arg) and isinstance(grandparent, cst.Call):
        func = grandparent.func
        qual = ctx.qualname(func) or ""
        if isinstance(func, cst.Name) and func.value in _HOST_READERS and not qual:
            return grandparent
        if qual.startswith(_HOST_READER_PREFIXES) and not qual.startswith("torch.cuda"):
            return grandparent
    return None


def _escapes(node: cst.CSTNode, chain: list[cst.CSTNode]) -> bool:
    """Handed to code we do not follow: returned, yielded, stored, passed to an unknown function."""
    parent = chain[-1] if chain else None
    return isinstance(parent, (cst.Return, cst.Yield, cst.Arg, cst.Element, cst.DictElement, cst.Assign,
                               cst.AssignTarget))
