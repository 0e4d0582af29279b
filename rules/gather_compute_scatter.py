"""GPU004: gather rows with a boolean mask, compute on them, scatter the result back."""

from __future__ import annotations

import re

import libcst as cst

from gpulint import Confidence, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import TENSOR_FACTORIES, BindingKind, FileAnalysis, call_arg, dotted_name, method_name, walk
from gpulint.semantic.modules import ModuleResolver, RowCheck, code_of, names_in, rebuild_owner

_PAD_KEYWORDS = {"src_key_padding_mask", "key_padding_mask", "tgt_key_padding_mask", "memory_key_padding_mask"}
_PAD_NAME = re.compile(r"pad", re.I)
_KEEP_NAME = re.compile(r"valid|keep|present|occupied|real|attention_mask", re.I)
_FRESH_METHODS = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "clone", "zeros_like", "ones_like"}
_REDUCE_METHODS = {"all", "any", "sum", "amax", "amin", "max", "min", "mean", "prod", "count_nonzero"}


class GatherComputeScatter(Rule):
    """
    ## What it does
    Finds computations done on the rows a boolean mask selects and written back under the same mask:
    `out[m] = f(x[m])`, the spread-out form `h = f(x[m]); ...; out[m] = h`, and the encoder shape where
    rows whose padding mask is all True are filtered out under `if m.any():`, the rest are encoded with the
    key-padding mask and pooled, and the result is scattered into a zero tensor.

    ## Why is this slow
    Each `x[m]` has a data-dependent shape: the host waits for the GPU to count the selected rows (one sync
    per gather and per scatter; the `if m.any():` is one more), `torch.compile` breaks the graph there and
    CUDA-graph capture fails. On an H100 with `mode="reduce-overhead"` the gather-compute-scatter form had
    1 graph break and 3 CUDA-graph partitions; the full-batch `torch.where` form had none.

    ## Example
    ```python
    pooled = cards.new_zeros(batch, d_model)
    nonempty = ~pad_mask.all(dim=1)
    if nonempty.any():
        h = self.encoder(self.embed(cards[nonempty]), src_key_padding_mask=pad_mask[nonempty])
        pooled[nonempty] = self.pool(h, pad_mask[nonempty])
    ```

    ## Use instead
    ```python
    pooled = cards.new_zeros(batch, d_model)
    nonempty = ~pad_mask.all(dim=1)
    h = self.encoder(self.embed(cards), src_key_padding_mask=pad_mask & nonempty[:, None])
    pooled = torch.where(nonempty[:, None], self.pool(h, pad_mask & nonempty[:, None]), pooled)
    ```
    Rows the mask drops are computed too and then discarded by `torch.where`. Their inputs are first made
    harmless (a padding mask gets no padding in dropped rows, inputs of `log`/`sqrt`/division are set to 1), so
    that they cannot produce NaN: a NaN in a discarded branch of `torch.where` still turns gradients into NaN.

    ## Fix safety
    Unsafe. The full batch costs `1/density` more FLOPs: if the mask usually keeps few rows (< ~25%) and `f` is
    expensive, the gather may be faster in eager mode. Results match the original up to fp32 summation order
    (exactly in fp64). No fix (a report with a note) when `f` mixes rows: BatchNorm, dropout (it draws random
    numbers per row), reductions over the batch, attention with the batch in dim 1, a module whose definition is
    not visible; when the mask is only known by its name; when the selected values are used elsewhere; or when
    `out` is not a fresh local tensor (the in-place write may be seen through another reference).
    """

    code = "GPU004"
    name = "gather-compute-scatter"
    message = "Rows gathered with a boolean mask, computed and scattered back: compute on the full batch and select with `torch.where`"
    fix_title = "Compute on the full batch and select rows with `torch.where`"
    severity = Severity.WARNING
    safety = Safety.UNSAFE
    priority = "P1"
    triggers = ("] =",)
    examples = [
        Valid(  # a plain copy under a mask is GPU002, not a computation
            """
            import torch.nn as nn
            class Net(nn.Module):
                def forward(self, x, y):
                    m = x > 0
                    x[m] = y[m]
                    return x
            """
        ),
        Valid(  # different masks
            """
            import torch.nn as nn
            class Net(nn.Module):
                def forward(self, x, a, b):
                    out = x.new_zeros(x.shape)
                    out[a > 0] = self.proj(x[b > 0])
                    return out
            """
        ),
        Valid(  # NumPy preprocessing outside the model
            """
            import numpy as np
            def normalize(obs, alive):
                obs[alive] = np.log1p(obs[alive])
                return obs
            """
        ),
        Valid(  # an integer position named like a mask (`last_valid_index = self.pos - 1`), not a mask
            """
            import torch.nn as nn
            class Head(nn.Module):
                def forward(self, x):
                    last_valid_index = self.pos - 1
                    saved = self.flags[last_valid_index].clone()
                    self.flags[last_valid_index] = saved * 2
                    return x
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            class Head(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.proj = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
                def forward(self, h, alive):
                    batch, _ = h.shape
                    out = torch.zeros(batch, 8, device=h.device)
                    live = alive > 0
                    out[live] = self.proj(h[live])
                    return out
            """,
            fixed="""
            import torch
            import torch.nn as nn
            class Head(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.proj = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
                def forward(self, h, alive):
                    batch, _ = h.shape
                    out = torch.zeros(batch, 8, device=h.device)
                    live = alive > 0
                    out = torch.where(live.reshape(live.shape + (1,) * (out.dim() - live.dim())), self.proj(h), out)
                    return out
            """,
        ),
        Invalid(  # BatchNorm in the computation: reported, not fixed
            """
            import torch.nn as nn
            class Head(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.proj = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64))
                def forward(self, h, alive):
                    out = h.new_zeros(h.shape[0], 64)
                    live = alive > 0
                    out[live] = self.proj(h[live])
                    return out
            """
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ", "GB"),
        setup=("f = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))\n"
               "x = torch.randn(9, 8, requires_grad=True)\n"
               "z = torch.rand(9, 8)\n"
               "z[2] = 0.0\n"
               "keep = torch.rand(9) > 0.4\n"
               "keep[2] = False"),
        before=("out = torch.zeros(9, 4)\n"
                "if keep.any():\n"
                "    h = f(x[keep] * z[keep].sqrt())\n"
                "    out[keep] = h"),
        after=("out = torch.zeros(9, 4)\n"
               "h = f(torch.where(keep[:, None], x, 1) * torch.where(keep[:, None], z, 1).sqrt())\n"
               "out = torch.where(keep[:, None], h, out)"),
        compare=("out",),
        options={"rtol": 1e-6, "atol": 1e-6},
    )

    def __init__(self, ctx) -> None:  # noqa: ANN001
        super().__init__(ctx)
        self.modules = ModuleResolver(ctx.analysis)

    # -- matching ----------------------------------------------------------------------------

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Subscript):
            return
        target = node.targets[0].target
        mask = _single_index(target)
        if mask is None or not self.ctx.in_hot_region():
            return
        statement = self.ctx.parent()
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return
        evidence = self.ctx.evidence
        if evidence.is_tensor(target.value) is False or _mentions_numpy(self.ctx.analysis, node.value):
            return
        confidence = self._mask_confidence(mask)
        if confidence is None:
            return
        mask_text = code_of(mask)
        site = _Site(self, node, statement, mask, mask_text)
        if not site.matches():
            return
        why_not = site.blocker(confidence)
        if why_not is not None:
            self.report(statement, note=why_not)
            return
        replacements, why_not = site.rewrite()
        if replacements is None:
            self.report(statement, note=why_not)
            return
        self.report(statement, replacements=replacements, imports=site.imports)

    def _mask_confidence(self, mask: cst.BaseExpression, depth: int = 0) -> Confidence | None:
        """The catalog's M, plus reductions that yield booleans (`~pad.all(dim=1)`, `valid.any(-1)`)."""
        if depth > 4:
            return None
        if isinstance(mask, cst.Call) and method_name(mask) in ("all", "any") and isinstance(mask.func, cst.Attribute):
            return Confidence.HIGH
        if isinstance(mask, cst.Call) and self.ctx.qualname(mask.func) in ("torch.all", "torch.any"):
            return Confidence.HIGH
        if isinstance(mask, cst.UnaryOperation) and isinstance(mask.operator, (cst.BitInvert,)):
            inner = self._mask_confidence(mask.expression, depth + 1)
            if inner is Confidence.HIGH:
                return inner
        if isinstance(mask, cst.BinaryOperation) and isinstance(mask.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
            found = [self._mask_confidence(mask.left, depth + 1), self._mask_confidence(mask.right, depth + 1)]
            if Confidence.HIGH in found:
                return Confidence.HIGH
        if isinstance(mask, cst.Name):
            bindings = self.ctx.analysis.reaching_bindings(mask.value, self.ctx.ancestors)
            if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN and bindings[0].value is not None:
                if _integer_position(bindings[0].value):
                    return None  # `last_valid_index = self.pos - 1`: a position, whatever its name says
                if self._mask_confidence(bindings[0].value, depth + 1) is Confidence.HIGH:
                    return Confidence.HIGH
        return self.ctx.mask_confidence(mask)


def _integer_position(value: cst.BaseExpression) -> bool:
    """An integer literal, or a sum or difference with one (`self.pos - 1`, `i + 1`)."""
    if isinstance(value, cst.Integer):
        return True
    return isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Subtract)) and (
        isinstance(value.left, cst.Integer) or isinstance(value.right, cst.Integer))


def _single_index(subscript: cst.Subscript) -> cst.BaseExpression | None:
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    value = subscript.slice[0].slice.value
    if isinstance(value, (cst.Integer, cst.SimpleString, cst.Ellipsis, cst.Tuple, cst.Float)):
        return None
    if isinstance(value, cst.Name) and value.value == "None":
        return None
    return value


def _mentions_numpy(a: FileAnalysis, node: cst.CSTNode) -> bool:
    for inner in walk(node):
        if isinstance(inner, cst.Call) and (a.call_qualname(inner) or "").startswith(("numpy.", "np.")):
            return True
    return False


class _Site:
    """One scatter statement `out[M] = V` and the statements that compute V from rows selected by M."""

    def __init__(self, rule: GatherComputeScatter, assign: cst.Assign, statement: cst.SimpleStatementLine,
                 mask: cst.BaseExpression, mask_text: str) -> None:
        self.rule = rule
        self.ctx = rule.ctx
        self.a: FileAnalysis = rule.ctx.analysis
        self.assign = assign
        self.statement = statement
        self.mask = mask
        self.mask_text = mask_text
        self.target = assign.targets[0].target
        assert isinstance(self.target, cst.Subscript)
        self.block: cst.IndentedBlock | None = None
        self.guard: cst.If | None = None
        self.outer: cst.IndentedBlock | None = None
        self.sequence: list[cst.BaseStatement] = []  # statements before the scatter, in execution order
        self.chain: list[cst.SimpleStatementLine] = []
        self.compacted: set[str] = set()
        self.imports: tuple = ()
        self._locate()

    # -- structure ----------------------------------------------------------------------------

    def _locate(self) -> None:
        ancestors = self.ctx.ancestors
        block = ancestors[-3] if len(ancestors) >= 3 else None
        if not isinstance(block, cst.IndentedBlock):
            return
        self.block = block
        body = list(block.body)
        here = body.index(self.statement)
        owner = ancestors[-4] if len(ancestors) >= 4 else None
        if isinstance(owner, cst.If) and owner.body is block and self._is_nonempty_test(owner.test):
            outer = ancestors[-5] if len(ancestors) >= 5 else None
            if isinstance(outer, cst.IndentedBlock):
                self.guard, self.outer = owner, outer
                outer_body = list(outer.body)
                self.sequence = outer_body[:outer_body.index(owner)] + body[:here]
                return
        self.sequence = body[:here]

    def _is_nonempty_test(self, test: cst.BaseExpression) -> bool:
        """`m.any()`, `torch.any(m)`, `m.any().item()`, `bool(m.any())`, `m.sum() > 0`, `m.count_nonzero() > 0`."""
        if isinstance(test, cst.Call):
            if isinstance(test.func, cst.Name) and test.func.value == "bool" and len(test.args) == 1:
                return self._is_nonempty_test(test.args[0].value)
            if method_name(test) == "item" and isinstance(test.func, cst.Attribute) and not test.args:
                return self._is_nonempty_test(test.func.value)
            if method_name(test) == "any" and isinstance(test.func, cst.Attribute) and not test.args:
                return code_of(test.func.value) == self.mask_text
            if self.ctx.qualname(test.func) == "torch.any" and len(test.args) == 1:
                return code_of(test.args[0].value) == self.mask_text
            return False
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            left, comparison = test.left, test.comparisons[0]
            bound = comparison.comparator
            op = comparison.operator
            counted = isinstance(left, cst.Call) and method_name(left) in ("sum", "count_nonzero") \
                and isinstance(left.func, cst.Attribute) and not left.args and code_of(left.func.value) == self.mask_text
            if counted and isinstance(bound, cst.Integer):
                value = int(bound.value)
                return (isinstance(op, (cst.GreaterThan, cst.NotEqual)) and value == 0) or \
                    (isinstance(op, cst.GreaterThanEqual) and value == 1)
        return False

    def _is_gather(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Subscript) and (mask := _single_index(node)) is not None \
            and code_of(mask) == self.mask_text

    def _tracked(self, node: cst.CSTNode) -> bool:
        return self._is_gather(node) or (isinstance(node, cst.Name) and node.value in self.compacted)

    def _touches(self, node: cst.CSTNode) -> bool:
        return any(self._tracked(n) for n in walk(node))

    def matches(self) -> bool:
        """Does V come from rows gathered with the same mask, through some computation?"""
        computed = False
        for statement in self.sequence:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:
                    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                    if not all(isinstance(t, (cst.Name, cst.Tuple, cst.List)) for t in targets):
                        continue
                    names = {n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)}
                    if self._touches(small.value):
                        self.compacted |= names
                        self.chain.append(statement)
                        computed = computed or _computes(small.value)
                    else:
                        self.compacted -= names
                elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) \
                        and small.target.value in self.compacted:
                    self.chain.append(statement)
                    computed = True
        value = self.assign.value
        # keep only the statements the scattered value depends on
        needed = names_in(value) & self.compacted
        kept: list[cst.SimpleStatementLine] = []
        for statement in reversed(self.chain):
            small = statement.body[0]
            targets = names_in(small.targets[0].target) if isinstance(small, cst.Assign) else \
                names_in(small.target) if isinstance(small, (cst.AugAssign, cst.AnnAssign)) else set()
            if targets & needed:
                kept.append(statement)
                if isinstance(small, cst.Assign):
                    needed -= targets
                needed |= names_in(small.value) & self.compacted if small.value is not None else set()
        self.chain = kept[::-1]
        self.compacted = set().union(*(names_in(s.body[0].targets[0].target) if isinstance(s.body[0], cst.Assign)
                                       else set() for s in self.chain)) if self.chain else set()
        computed = any(_computes(s.body[0].value) for s in self.chain if s.body[0].value is not None)
        if not self._touches(value):
            return False
        if self._is_gather(value):
            return False  # `out[m] = x[m]`: a masked copy (GPU002)
        if isinstance(value, cst.Name) and not computed:
            return False
        return computed or _computes(value)

    # -- when not to fix --------------------------------------------------------------------------

    def blocker(self, confidence: Confidence) -> str | None:
        if confidence is not Confidence.HIGH:
            return "the mask is recognised only by its name; gpulint cannot prove it is boolean"
        if self.block is None:
            return "the scatter is not inside an indented block"
        chain_ids = {id(s) for s in self.chain}
        first_chain = min((self.sequence.index(s) for s in self.chain), default=len(self.sequence))
        for index, statement in enumerate(self.sequence):
            if id(statement) in chain_ids:
                small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None  # type: ignore[union-attr]
                if len(statement.body) != 1 or not isinstance(small, (cst.Assign, cst.AugAssign)):  # type: ignore[union-attr]
                    return "a statement computing the selection is not a single assignment"
                if isinstance(small, cst.Assign) and (len(small.targets) != 1 or not isinstance(small.targets[0].target, cst.Name)):
                    return "a selected value is unpacked or stored outside a local name"
                continue
            if index > first_chain and names_in(statement) & self.compacted:
                return "the selected values are used by another statement"
        if self.guard is not None:
            if self.guard.orelse is not None:
                return "the `if` has an `else` branch"
            guard_body = list(self.guard.body.body)
            index = guard_body.index(self.statement)
            if index != len(guard_body) - 1:
                return "statements follow the scatter inside the `if`"
            if any(id(s) not in chain_ids for s in guard_body[:index]):
                return "the `if` body does more than compute the selected rows"
        # the compacted values must not outlive the scatter
        later = self._statements_after()
        for statement in later:
            used = names_in(statement)
            if used & self.compacted:
                return "a value computed on the selected rows is used after the scatter"
        for statement in self.chain:
            small = statement.body[0]
            if isinstance(small, cst.AugAssign):
                continue
            for inner in walk(small):
                if isinstance(inner, cst.Subscript) and _single_index(inner) is not None and not self._is_gather(inner) \
                        and self.rule._mask_confidence(_single_index(inner)) is not None and self._touches(inner) is False:
                    return "another boolean mask selects rows in the same computation"
        # f must act row by row
        checker = RowCheck(self.a, self.ctx.ancestors, self._tracked, self._mask_rank() == 1, self.rule.modules)
        for statement in self.chain:
            small = statement.body[0]
            value = small.value if isinstance(small, (cst.Assign, cst.AugAssign)) else None
            issue = checker.issue(value) if value is not None else None
            if issue:
                return issue
        issue = checker.issue(self.assign.value)
        if issue:
            return issue
        self.nan_prone = bool(checker.nan_prone)
        mutated = self._mutated_later()
        if mutated:
            return (f"`{mutated}` is changed in place later in the function; computing on the whole of it would "
                    f"make autograd's saved tensor stale")
        # the scattered-into tensor must be a fresh local
        out = self.target.value
        if not isinstance(out, cst.Name):
            return "the scatter writes into an attribute or a view; an in-place write may be seen elsewhere"
        allocation = self._fresh_allocation(out.value)
        if allocation is None:
            return (f"`{out.value}` is not a tensor allocated in this function and untouched until the scatter "
                    f"(a parameter, view or alias sees the in-place write)")
        return None

    def _mutated_later(self) -> str | None:
        """A gathered tensor `x` (of `x[m]`) written in place after the computation starts: `f(x)` would save
        `x` itself for backward, where the original saved the copy `x[m]`."""
        fn = next((a for a in reversed(self.ctx.ancestors) if isinstance(a, cst.FunctionDef)), None)
        if fn is None:
            return None
        bases = {code_of(n.value) for s in [*self.chain, self.assign.value] for n in walk(s) if self._is_gather(n)}
        start = min((self.a.order.get(id(s), 0) for s in [*self.chain, self.statement]), default=0)
        current = 0
        for node in walk(fn.body):
            current = self.a.order.get(id(node), current)
            if current <= start:
                continue
            written: list[cst.BaseExpression] = []
            if isinstance(node, cst.Assign) and node is not self.assign:
                written = [t.target.value for t in node.targets if isinstance(t.target, cst.Subscript)]
            elif isinstance(node, cst.AugAssign):
                written = [node.target.value if isinstance(node.target, cst.Subscript) else node.target]
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                    and node.func.attr.value.endswith("_") and not node.func.attr.value.startswith("_"):
                written = [node.func.value]
            for target in written:
                if code_of(target) in bases:
                    return cst.Module(body=[]).code_for_node(target)
        return None

    def _statements_after(self) -> list[cst.CSTNode]:
        fn = next((a for a in reversed(self.ctx.ancestors) if isinstance(a, cst.FunctionDef)), None)
        if fn is None:
            return []
        here = self.a.order.get(id(self.guard if self.guard is not None else self.statement), 0)
        end = here
        container = self.guard if self.guard is not None else self.statement
        for node in walk(container):
            end = max(end, self.a.order.get(id(node), end))
        return [n for n in walk(fn.body) if isinstance(n, cst.SimpleStatementLine | cst.BaseCompoundStatement)
                and self.a.order.get(id(n), 0) > end and not isinstance(n, cst.BaseCompoundStatement)] + \
            [n.test for n in walk(fn.body) if isinstance(n, (cst.If, cst.While)) and self.a.order.get(id(n), 0) > end]

    def _fresh_allocation(self, name: str) -> cst.BaseExpression | None:
        """The value `name` was allocated from in this function, when it is a fresh tensor nobody else holds."""
        fn = next((a for a in reversed(self.ctx.ancestors) if isinstance(a, cst.FunctionDef)), None)
        if fn is None:
            return None
        bindings = self.a.reaching_bindings(name, self.ctx.ancestors)
        if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN or bindings[0].value is None:
            return None
        value = bindings[0].value
        if not _is_fresh(self.a, value):
            return None
        start, stop = bindings[0].order, self.a.order.get(id(self.statement), 0)
        for node in walk(fn.body):
            order = self.a.order.get(id(node))
            if order is None or not (start < order < stop) or not isinstance(node, cst.SimpleStatementLine):
                continue
            if name in names_in(node):
                return None
        self.allocation = value
        return value

    def _mask_rank(self) -> int | None:
        """1 when the mask selects rows (its rank is known, or a selection is used as a key-padding mask)."""
        rank = _rank(self, self.mask)
        if rank is not None:
            return rank
        for statement in [*self.chain, self.statement]:
            for node in walk(statement):
                if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in _PAD_KEYWORDS \
                        and self._is_gather(node.value):
                    return 1
        return None

    # -- the rewrite -------------------------------------------------------------------------------

    def _align(self, rank: int | None) -> str:
        mask = cst.Module(body=[]).code_for_node(self.mask)
        if not isinstance(self.mask, (cst.Name, cst.Attribute)):
            mask = f"({mask})"
        mask_rank = self._mask_rank()
        if rank is not None and mask_rank is not None and rank >= mask_rank:
            extra = rank - mask_rank
            return mask if extra == 0 else f"{mask}[{', '.join([':'] * mask_rank + ['None'] * extra)}]"
        return None  # type: ignore[return-value]

    def _align_to(self, other: str, rank: int | None) -> str:
        known = self._align(rank)
        if known is not None:
            return known
        mask = cst.Module(body=[]).code_for_node(self.mask)
        if not isinstance(self.mask, (cst.Name, cst.Attribute)):
            mask = f"({mask})"
        return f"{mask}.reshape({mask}.shape + (1,) * ({other}.dim() - {mask}.dim()))"

    def _polarity(self, gathered: cst.Subscript, parent: cst.CSTNode | None) -> str | None:
        """'pad' (True = ignore) or 'keep' (True = use) for boolean masks that are gathered, else None."""
        if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value in _PAD_KEYWORDS:
            return "pad"
        base = gathered.value
        text = dotted_name(base) or ""
        for statement in [*self.chain, self.statement]:
            for node in walk(statement):
                if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in _PAD_KEYWORDS \
                        and self._is_gather(node.value) and code_of(node.value.value) == code_of(base):  # type: ignore[union-attr]
                    return "pad"
        last = text.rsplit(".", 1)[-1]
        if _PAD_NAME.search(last):
            return "pad"
        if _KEEP_NAME.search(last) and self.ctx.mask_confidence(base) is not None:
            return "keep"
        return None

    def _replacement_for_gather(self, gathered: cst.Subscript, parent: cst.CSTNode | None) -> cst.BaseExpression:
        base = gathered.value
        base_code = cst.Module(body=[]).code_for_node(base)
        polarity = self._polarity(gathered, parent)
        rank = _rank(self, base)
        if polarity == "pad":
            text = f"{base_code} & {self._align_to(base_code, rank)}"
        elif polarity == "keep":
            text = f"{base_code} | ~{self._align_to(base_code, rank)}"
        elif self.nan_prone and self.ctx.mask_confidence(base) is None:
            where, imports = self.ctx.spell("torch.where")
            self.imports = imports
            return cst.parse_expression(f"{where}({self._align_to(base_code, rank)}, {base_code}, 1)")
        else:
            return base
        expression = cst.parse_expression(text)
        if not isinstance(parent, (cst.Arg, cst.Assign)):
            expression = expression.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return expression

    def _rewrite_value(self, node: cst.CSTNode) -> cst.CSTNode:
        site = self

        class _Replace(cst.CSTTransformer):
            def __init__(self) -> None:
                super().__init__()
                self.parents: list[cst.CSTNode] = []

            def on_visit(self, node: cst.CSTNode) -> bool:
                self.parents.append(node)
                return not site._is_gather(node)

            def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # noqa: ANN201
                self.parents.pop()
                if site._is_gather(original_node):
                    parent = self.parents[-1] if self.parents else None
                    return site._replacement_for_gather(original_node, parent)  # type: ignore[arg-type]
                return updated_node

        return node.visit(_Replace())

    def rewrite(self) -> tuple[list[tuple[cst.CSTNode, cst.CSTNode]] | None, str | None]:
        out = self.target.value
        assert isinstance(out, cst.Name)
        where, imports = self.ctx.spell("torch.where")
        value = self._rewrite_value(self.assign.value)
        out_rank = _rank(self, self.allocation)
        condition = self._align_to(out.value, out_rank)
        # `out[m] = v` requires v to have out's dtype (index_put does not cast), so `torch.where` keeps it
        value_code = cst.Module(body=[]).code_for_node(value)
        new_assign = cst.parse_statement(f"{out.value} = {where}({condition}, {value_code}, {out.value})\n")
        assert isinstance(new_assign, cst.SimpleStatementLine)
        new_statement = self.statement.with_changes(body=[new_assign.body[0]])
        self.imports = tuple(dict.fromkeys([*imports, *self.imports]))
        rewritten = {id(s): s.with_changes(body=[self._rewrite_value(s.body[0])]) for s in self.chain}
        rewritten[id(self.statement)] = new_statement
        if self.guard is None:
            return [(old, rewritten[id(old)]) for old in [*self.chain, self.statement]], None
        assert self.outer is not None
        body: list[cst.BaseStatement] = []
        for statement in self.outer.body:
            if statement is self.guard:
                inner = [rewritten.get(id(s), s) for s in self.guard.body.body]
                inner[0] = inner[0].with_changes(leading_lines=[*self.guard.leading_lines, *inner[0].leading_lines])
                body.extend(inner)
            else:
                body.append(rewritten.get(id(statement), statement))  # type: ignore[arg-type]
        owner = rebuild_owner(self.ctx.ancestors[:-4], self.outer, body)
        if owner is None:
            return None, "the `if` is not inside a function or loop"
        return [owner], None


def _computes(node: cst.CSTNode) -> bool:
    return any(isinstance(n, (cst.Call, cst.BinaryOperation)) for n in walk(node))


def _is_fresh(a: FileAnalysis, value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.Call):
        qual = a.call_qualname(value) or ""
        if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in TENSOR_FACTORIES | {"zeros_like", "full_like"}:
            return True
        return method_name(value) in _FRESH_METHODS and isinstance(value.func, cst.Attribute)
    return isinstance(value, cst.BinaryOperation)


def _rank(site: _Site, node: cst.BaseExpression | None, depth: int = 0) -> int | None:
    """Number of dimensions of a tensor expression when it is evident from this function."""
    if node is None or depth > 6:
        return None
    a = site.a
    if isinstance(node, cst.Call):
        qual = a.call_qualname(node) or ""
        name = method_name(node)
        sizes = [arg for arg in node.args if arg.keyword is None]
        if qual in ("torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.rand", "torch.randn") or \
                name in ("new_zeros", "new_ones", "new_empty", "new_full"):
            if qual == "torch.full" or name == "new_full":
                sizes = sizes[:1]
            if len(sizes) == 1 and isinstance(sizes[0].value, (cst.Tuple, cst.List)):
                return len(sizes[0].value.elements)
            if sizes and not any(arg.star for arg in sizes) and all(isinstance(s.value, (cst.Integer, cst.Name, cst.Attribute, cst.Subscript, cst.BinaryOperation)) for s in sizes):
                if len(sizes) == 1 and isinstance(sizes[0].value, cst.Attribute) and sizes[0].value.attr.value == "shape":
                    return _rank(site, sizes[0].value.value, depth + 1)
                return len(sizes)
            return None
        if qual in ("torch.zeros_like", "torch.ones_like", "torch.full_like", "torch.empty_like") and node.args:
            return _rank(site, node.args[0].value, depth + 1)
        if name in _REDUCE_METHODS and isinstance(node.func, cst.Attribute):
            dim = call_arg(node, "dim", 0)
            keep = call_arg(node, "keepdim", 1)
            inner = _rank(site, node.func.value, depth + 1)
            if dim is None or inner is None:
                return None if dim is not None else 0
            if keep is not None and isinstance(keep.value, cst.Name) and keep.value.value == "True":
                return inner
            return inner - 1
        if name in ("bool", "float", "long", "to", "clone", "detach", "contiguous", "logical_not") and isinstance(node.func, cst.Attribute):
            return _rank(site, node.func.value, depth + 1)
        if name == "unsqueeze" and isinstance(node.func, cst.Attribute):
            inner = _rank(site, node.func.value, depth + 1)
            return inner + 1 if inner is not None else None
        return None
    if isinstance(node, cst.UnaryOperation):
        return _rank(site, node.expression, depth + 1)
    if isinstance(node, cst.Comparison):
        return _rank(site, node.left, depth + 1)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
        left, right = _rank(site, node.left, depth + 1), _rank(site, node.right, depth + 1)
        return left if left == right else None
    if isinstance(node, cst.Subscript):
        inner = _rank(site, node.value, depth + 1)
        if inner is None:
            return None
        for element in node.slice:
            part = element.slice
            if isinstance(part, cst.Index):
                if isinstance(part.value, cst.Integer) or (isinstance(part.value, cst.UnaryOperation) and isinstance(part.value.expression, cst.Integer)):
                    inner -= 1
                elif isinstance(part.value, cst.Name) and part.value.value == "None":
                    inner += 1
                elif isinstance(part.value, cst.Ellipsis):
                    continue
                else:
                    return None
        return inner
    if isinstance(node, cst.Name):
        bindings = a.reaching_bindings(node.value, site.ctx.ancestors)
        if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN:
            return _rank(site, bindings[0].value, depth + 1)
        return _rank_from_usage(site, node.value)
    return None


def _rank_from_usage(site: _Site, name: str) -> int | None:
    """`batch, slots = pad_mask.shape` in the function, or `src_key_padding_mask=pad_mask` (always 2-D)."""
    fn = next((a for a in reversed(site.ctx.ancestors) if isinstance(a, cst.FunctionDef)), None)
    if fn is None:
        return None
    for node in walk(fn.body):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Tuple):
            value = node.value
            if isinstance(value, cst.Attribute) and value.attr.value == "shape" and isinstance(value.value, cst.Name) \
                    and value.value.value == name:
                elements = node.targets[0].target.elements
                if not any(isinstance(e, cst.StarredElement) for e in elements):
                    return len(elements)
        if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in _PAD_KEYWORDS:
            inner = node.value
            if isinstance(inner, cst.Name) and inner.value == name:
                return 2
            if isinstance(inner, cst.Subscript) and isinstance(inner.value, cst.Name) and inner.value.value == name \
                    and _single_index(inner) is not None:
                return 2
    return None
