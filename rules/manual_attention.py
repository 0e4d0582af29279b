from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterator, Sequence

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import (Binding, BindingKind, call_arg, child_nodes, dotted_name, has_star_args, method_name,
                              string_value)
from gpulint.pins import torch_pinned_below
from gpulint.program import related_texts
from gpulint.semantic.precision import option_off_by_default

_SOFTMAX_FUNCTIONS = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
_DROPOUT_FUNCTIONS = {"torch.nn.functional.dropout", "torch.dropout"}
_MATMUL_FUNCTIONS = {"torch.matmul", "torch.bmm"}
# An identifier naming an attention kernel (or the switch to it) in the function or class: the manual form
# there is a fallback path (`if self.flash:` in nanoGPT, `if self.fused_attn:` in timm).
_FUSED_ATTENTION_NAME = re.compile(
    r"scaled_dot_product_attention|flash_attn|memory_efficient_attention|sdpa|fused_attn|^flash$|use_flash", re.I)
_DTYPE_METHODS = {"float", "double", "half", "bfloat16", "to", "type", "type_as"}
_LINE_LIMIT = 100  # the rewritten call wraps its arguments past this column
_MIN_MASK_MAGNITUDE = 1e4  # a masked_fill value this negative (or -inf, finfo.min) removes the position


class ManualAttention(Rule):
    """
    ## What it does
    Finds attention written out by hand: `softmax(q @ k.transpose(-2, -1) * scale [+ mask]) [dropout] @ v`,
    inline or spread over several statements (`att = q @ k.transpose(-2, -1) * s`,
    `att = att.masked_fill(...)`, `att = F.softmax(att, dim=-1)`, `att = self.attn_dropout(att)`,
    `y = att @ v`), and rewrites it to `F.scaled_dot_product_attention`.

    Attention the rewrite cannot follow is reported at its scores without a fix: the scores assigned in the
    branches of an `if`, keys transposed before the product (`bmm(theta.transpose(1, 2), phi)` in a non-local
    block), the weights on the right of the product (`bmm(g, p.transpose(1, 2))`), any two-operand `einsum`
    whose softmax runs over the key index. The steps between the product and the softmax, and between the
    softmax and the product with the values, must be element-wise (scaling, masks, biases, casts, views,
    dropout): a layer in between (talking heads mixing the heads) is not this pattern.

    It stays silent where the function or its class already calls `scaled_dot_product_attention` (or a
    flash-attention kernel): there the manual form is a fallback path (nanoGPT's `if self.flash: ... else:`,
    timm's `if self.fused_attn: ... else:`).

    ## Why is this slow
    The manual form materialises the full `L x S` score matrix in memory several times (scores, mask,
    softmax, dropout) and launches one kernel per step. SDPA dispatches to fused FlashAttention /
    memory-efficient kernels that never store it. Measured on an H100 (bf16, causal, B8 H16 L2048 D64,
    forward + backward): 12.30 ms and 5.29 GiB peak memory manual, 0.96 ms and 0.48 GiB with SDPA (x12.8).

    ## Example
    ```python
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(pad, float("-inf"))  # pad: True = masked
    att = F.softmax(att, dim=-1)
    att = self.attn_dropout(att)
    y = att @ v
    ```

    ## Use instead
    ```python
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad,
                                       dropout_p=self.attn_dropout.p if self.training else 0.0)
    ```

    ## Fix safety
    Unsafe: the result is equal up to floating-point rounding (fp64 max diff 9e-16, fp32 4e-7), dropout draws
    different random numbers, and a query row whose keys are all masked gives 0 with SDPA instead of NaN
    (or instead of the uniform average that a finite fill such as `-1e9` gives). The rewrite keeps the
    meaning otherwise: a boolean `masked_fill(mask, -inf)` mask is inverted (SDPA's boolean mask is True
    where attention is allowed), an additive mask is passed unchanged, the scale is passed as `scale=`
    unless it is provably `1/sqrt(head_dim)`, a lower-triangular buffer mask becomes `is_causal=True`, and
    `dropout_p` is gated on `self.training` because SDPA applies dropout whenever `dropout_p > 0`.
    No fix is offered (the finding stays) when the attention weights are used for anything else inside the
    function (logged, reduced to a statistic), when the scale may be a tensor (SDPA takes a Python float),
    when the softmax runs in another dtype, or when the mask is applied before the scaling.

    Not reported when the weights (or the scores) leave the function otherwise: returned on request (an
    `output_attentions` flag) or in a dict or output record, yielded, stored on an object attribute, appended
    to a list, or put in a container that is returned or stored. SDPA cannot return the weights, so such code
    (an eager fallback that returns attention maps, a layer that keeps them for visualisation) has nothing to
    switch to. A function that always ends in `return output, weights` (the usual hand-written transformer,
    whose callers mostly drop the weights) is reported without a fix.
    """

    code = "GPU030"
    name = "manual-attention"
    message = "Attention written out by hand; `F.scaled_dot_product_attention` runs fused kernels"
    fix_title = "Replace with `F.scaled_dot_product_attention`"
    severity = Severity.WARNING
    safety = Safety.UNSAFE
    priority = "P1"
    triggers = ("softmax", "Softmax")
    examples = [
        Valid(  # already SDPA
            """
            import torch.nn.functional as F
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            """
        ),
        Valid(  # a fallback path next to SDPA (nanoGPT)
            """
            import torch.nn.functional as F
            def attend(q, k, v, flash):
                if flash:
                    return F.scaled_dot_product_attention(q, k, v)
                att = F.softmax(q @ k.transpose(-2, -1), dim=-1)
                return att @ v
            """
        ),
        Valid(  # softmax over another dim: not attention
            """
            import torch
            w = torch.softmax(q @ k.transpose(-2, -1), dim=1) @ v
            """
        ),
        Invalid(  # einops-style specs, also written as f-strings without placeholders (no rewrite: the scale
            # is an attribute, maybe a tensor)
            """
            import torch
            from torch import einsum

            class Attention(torch.nn.Module):
                def forward(self, q, k, v):
                    sim = einsum(f"b h i d, b h j d -> b h i j", q, k) * self.scale  # error: GPU030
                    attn = sim.softmax(dim=-1)
                    return einsum(f"b h i j, b h j d -> b h i d", attn, v)
            """
        ),
        Invalid(
            """
            import math
            import torch.nn.functional as F
            def attention(q, k, v):
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
                return F.softmax(scores, dim=-1) @ v
            """,
            fixed="""
            import math
            import torch.nn.functional as F
            def attention(q, k, v):
                return F.scaled_dot_product_attention(q, k, v)
            """,
        ),
        Invalid(
            """
            import torch
            def attention(q, k, v, pad):
                att = torch.matmul(q, k.transpose(-2, -1)) * 0.125
                att = att.masked_fill(pad, float("-inf"))
                att = att.softmax(dim=-1)
                return torch.matmul(att, v)
            """,
            fixed="""
            import torch
            def attention(q, k, v, pad):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~pad, scale=0.125)
            """,
        ),
        Invalid(  # an `nn.Softmax(dim=-1)` module and the transposed keys bound to a name first
            """
            import math
            import torch
            from torch import nn
            class Attention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=-1)
                def forward(self, q, k, v):
                    k_t = k.transpose(2, 3)
                    score = (q @ k_t) / math.sqrt(q.size(-1))
                    score = self.softmax(score)
                    return score @ v
            """,
            fixed="""
            import math
            import torch
            from torch import nn
            class Attention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=-1)
                def forward(self, q, k, v):
                    return nn.functional.scaled_dot_product_attention(q, k, v)
            """,
        ),
        Invalid(  # the weights are always returned: reported without a fix (SDPA cannot give them)
            """
            import torch
            def attention(q, k, v):
                p = torch.softmax(q @ k.transpose(-2, -1), dim=-1)  # error: GPU030
                return p @ v, p
            """
        ),
        Valid(  # the weights are appended to the returned outputs (Hugging Face style)
            """
            import torch
            def attention(q, k, v, output_attentions=False):
                weights = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
                outputs = (weights @ v,)
                if output_attentions:
                    outputs = outputs + (weights,)
                return outputs
            """
        ),
        Valid(  # the weights are stored on the module, collected in a list, or returned in a container
            """
            import torch
            class Attention(torch.nn.Module):
                def forward(self, q, k, v, maps, keep):
                    p = (q @ k.transpose(-2, -1) * 0.125).softmax(dim=-1)
                    self.last_weights = p.detach()
                    return p @ v
                def collect(self, q, k, v, maps):
                    p = (q @ k.transpose(-2, -1)).softmax(dim=-1)
                    maps.append(p)
                    return p @ v
                def outputs(self, q, k, v, keep):
                    p = (q @ k.transpose(-2, -1)).softmax(dim=-1)
                    out = p @ v
                    result = (out, p) if keep else (out,)
                    return result
            """
        ),
        Invalid(  # the weights stay local (the name is rebound before the return): rewritten
            """
            import torch
            def attention(q, k, v):
                w = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
                out = w @ v
                w = out.norm(dim=-1)
                return out, w
            """,
            fixed="""
            import torch
            def attention(q, k, v):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
                w = out.norm(dim=-1)
                return out, w
            """,
        ),
        Invalid(  # scores assigned in both branches of an `if`: reported at the scores, without a fix
            """
            import math
            import torch.nn.functional as F
            def attention(q, k, v, by_layer, layer):
                if by_layer:
                    att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1)) / layer
                else:
                    att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))  # error: GPU030
                att = F.softmax(att, dim=-1)
                return att @ v
            """
        ),
        Invalid(  # a non-local block: keys transposed before the product, the weights on the right of `bmm`
            """
            import torch
            import torch.nn.functional as F
            def non_local(theta, phi, g):
                scores = torch.bmm(theta.transpose(1, 2), phi)  # error: GPU030
                p = F.softmax(scores * 0.125, dim=-1)
                return torch.bmm(g, p.transpose(1, 2))
            """
        ),
        Invalid(  # einsum attention over a key index the spec names, the softmax cast back to the input's dtype
            """
            import torch
            def attention(q, k, v):
                weight = torch.einsum("bct,bcs->bts", q * 0.3, k * 0.3)  # error: GPU030
                weight = torch.softmax(weight.float(), dim=-1).type(weight.dtype)
                return torch.einsum("bts,bcs->bct", weight, v)
            """
        ),
        Valid(  # talking heads: the weights are mixed across heads by a parameter around the softmax
            """
            import torch
            from torch import nn
            class TalkingHeads(nn.Module):
                def forward(self, q, k, v):
                    dots = torch.einsum("bhid,bhjd->bhij", q, k)
                    dots = torch.einsum("bhij,hg->bgij", dots, self.mix_pre)
                    attn = dots.softmax(dim=-1)
                    attn = torch.einsum("bhij,hg->bgij", attn, self.mix_post)
                    return torch.einsum("bhij,bhjd->bhid", attn, v)
            """
        ),
        Valid(  # a softmax over the query index of an einsum (`i`, not the keys `j`): not attention
            """
            import torch
            def pool(q, k, v):
                sim = torch.einsum("bid,bjd->bij", q, k)
                w = sim.softmax(dim=1)
                return torch.einsum("bij,bjd->bid", w, v)
            """
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup=(
            "import math\n"
            "import torch.nn.functional as F\n"
            "q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))\n"
            "pad = torch.zeros(2, 1, 1, 5, dtype=torch.bool); pad[..., -2:] = True\n"
            "bias = torch.tril(torch.ones(5, 5)).view(1, 1, 5, 5)"
        ),
        before=(
            "att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))\n"
            "att = att.masked_fill(pad, float('-inf'))\n"
            "att = F.softmax(att, dim=-1)\n"
            "y = att @ v\n"
            "c = (q @ k.transpose(-2, -1)) * 0.1\n"
            "c = c.masked_fill(bias[:, :, :5, :5] == 0, float('-inf'))\n"
            "yc = F.softmax(c, dim=-1) @ v"
        ),
        after=(
            "y = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad)\n"
            "yc = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.1)"
        ),
        compare=("y", "yc"),
        options={
            "atol": 1e-12, "fp32_atol": 1e-5, "polarity_probe": "attn_mask=pad must differ",
            # GPU timing at a GPT-sized causal attention (catalog F10: B8 H16 L2048 D64, bf16, forward)
            "perf_setup": "q, k, v = (torch.randn(8, 16, 2048, 64, dtype=torch.bfloat16) for _ in range(3))\n"
                          "bias = torch.tril(torch.ones(2048, 2048)).view(1, 1, 2048, 2048)",
            "perf_before": "c = (q @ k.transpose(-2, -1)) * 0.125\n"
                           "c = c.masked_fill(bias[:, :, :2048, :2048] == 0, float('-inf'))\n"
                           "yc = F.softmax(c, dim=-1) @ v",
            "perf_after": "yc = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125)",
        },
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._fused_cache: dict[int, bool] = {}
        self._loosely_reported: set[int] = set()

    # -- anchors: `p @ v`, `torch.matmul(p, v)`, `torch.einsum("...qk,...kd->...qd", p, v)` ---------------

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, cst.MatrixMultiply):
            self._check(node, node.left, node.right, None)

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual in _MATMUL_FUNCTIONS and not has_star_args(node):
            args = [a for a in node.args if a.keyword is None]
            if len(args) == 2 and len(node.args) == 2:
                self._check(node, args[0].value, args[1].value, None)
        elif qual == "torch.einsum" and not has_star_args(node):
            spec = _einsum_spec(string_value(node.args[0].value)) if len(node.args) == 3 else None
            if spec is not None and spec.kind == "pv":
                self._check(node, node.args[1].value, node.args[2].value, spec.rank)
            elif (found := _einsum_operands(node)) is not None and _statement_position(self.ctx.ancestors):
                switched_off = self._under_switch_off_by_default()  # (also `einsum(spec, (a, b))`)
                if switched_off or not self._next_to_fused_attention():
                    self._report_loosely(node, found[1], switched_off)

    # -- the match ---------------------------------------------------------------------------------------

    def _check(self, anchor: cst.BaseExpression, probs: cst.BaseExpression, value: cst.BaseExpression,
               value_rank: int | None) -> None:
        where = _statement_position(self.ctx.ancestors)
        if where is None:
            return
        stmt_index_in_ancestors, block, final_index = where
        switched_off = self._under_switch_off_by_default()
        if not switched_off and self._next_to_fused_attention():
            return
        tracer = _Tracer(self, block, final_index)
        trace = tracer.probs(probs, final_index, _Trace())
        if trace is None or trace.q is None:
            self._report_loosely(anchor, (probs, value), switched_off)
            return
        if value_rank is not None and trace.rank is not None and value_rank != trace.rank:
            return
        if trace.softmax_dim is not None and trace.softmax_dim != -1 and (
                trace.rank is None or trace.softmax_dim != trace.rank - 1):
            return  # softmax over a dim that is not the key dim: not attention
        final = block.body[final_index]
        if self._weights_escape(trace, block, final_index, returns=False):
            return  # the weights are kept (stored on an object, collected): SDPA cannot give them
        if self._weights_escape(trace, block, final_index):
            function = next((n for n in reversed(self.ctx.ancestors) if isinstance(n, cst.FunctionDef)), None)
            if function is not None and _always_returned(function, set(trace.names)):
                # `return output, attn` on every call (no `output_attentions` flag): callers that drop or only
                # visualise the weights (most hand-written transformers) could use SDPA
                self.report(_statement_of_chain(block, trace, anchor), note=_RETURNED_NOTE)
            return  # the caller gets the weights: SDPA cannot give them
        tracer.check_uses(trace, final, anchor, probs, self.ctx.ancestors[:stmt_index_in_ancestors + 1])
        problems = list(trace.problems)
        if switched_off:
            problems.append("the fused kernel is behind a switch that is off by default, so this path is the one "
                            "that runs: turn the switch on by default")
        if torch_pinned_below(self.ctx.path, (2, 0)):  # SDPA arrived in torch 2.0
            problems.append("the project pins torch below 2.0, which has no `scaled_dot_product_attention`: "
                            "upgrade torch first")
        call, imports, note = None, (), None
        if not problems:
            call, imports, note = self._build_call(trace, value, problems)
        if call is not None and call_arg(call, "scale") is not None and torch_pinned_below(self.ctx.path, (2, 1)):
            problems.append("the project pins torch below 2.1, whose SDPA has no `scale=`")
        start = _statement_of_chain(block, trace, anchor)
        if problems or call is None:
            self.report(start, note=_problem_note(problems))
            return
        if not trace.consumed:
            self.report(anchor, replacement=call, imports=imports, note=note)
            return
        owner = _owner(self.ctx.ancestors, stmt_index_in_ancestors)
        if owner is None:
            self.report(start, note="no fix at module level: the statements to remove are not in a function or block")
            return
        new_block = _rebuild_block(block, set(trace.consumed), final_index, anchor, call)
        new_owner = owner.deep_replace(block, new_block)
        self.report(start, replacements=[(owner, new_owner)], imports=imports, note=note)

    def _weights_escape(self, trace: "_Trace", block: cst.CSTNode, final_index: int, returns: bool = True) -> bool:
        """Do the attention weights (the chain's temporaries) leave the function (when `returns`) or get stored?"""
        stmts: Sequence[cst.CSTNode] = block.body  # type: ignore[attr-defined]
        final = stmts[final_index]
        function = next((n for n in reversed(self.ctx.ancestors) if isinstance(n, cst.FunctionDef)), None)
        params: set[str] = set()
        if function is not None:
            p = function.params
            params = {param.name.value for param in (*p.posonly_params, *p.params, *p.kwonly_params)}
        scope = function if function is not None else self.ctx.module
        names = set(trace.names)
        # a name that the attention statement rebinds (`attn = attn @ v`), or a later statement of the block
        # rebinds from scratch, no longer holds the weights after that
        after = names - _assigned_names(final)
        killed: dict[str, int] = {}
        for j in range(final_index + 1, len(stmts)):
            for name in (_assigned_names(stmts[j]) & after) - killed.keys():
                if name not in _names_read(stmts[j]):
                    killed[name] = j
        if _weights_escape([scope], after - killed.keys(), params, returns):
            return True
        for name, j in killed.items():
            if _weights_escape(stmts[final_index + 1:j], {name}, params, returns):
                return True
        # between the chain's statements every chain name holds the scores or the weights
        consumed = set(trace.consumed)
        between = [stmts[j] for j in range(min(consumed, default=final_index), final_index) if j not in consumed]
        return _weights_escape(between, names, params, returns)

    # -- attention in a shape the rewrite does not follow: reported without a fix ---------------------------

    def _report_loosely(self, anchor: cst.BaseExpression, operands: Sequence[cst.BaseExpression],
                        switched_off: bool) -> None:
        """`weights @ v` (or `bmm`, `matmul`, a two-operand `einsum`) whose weights are a softmax over the key
        dimension of a product of two activations (`q @ k`, `bmm(q, k)`, `einsum("bhid,bhjd->bhij", q, k)`), the
        steps between them element-wise (scaling, masks, biases, dropout, views): attention the rewrite cannot
        follow (assigned in branches, keys transposed elsewhere, the weights on the right of the product, a
        non-local block). Reported at the scores' statement, without a fix."""
        function = next((n for n in reversed(self.ctx.ancestors) if isinstance(n, cst.FunctionDef)), None)
        if function is None:
            return
        here = self.ctx.analysis.statement_order(self.ctx.ancestors)
        for operand in operands:
            others = [o for o in operands if o is not operand]
            if any((dotted_name(o) or "").startswith("self.") for o in others):
                continue  # weights times a parameter (talking heads mixing the heads): no attention output
            weights = self._trace_back(operand, here, _softmax_goal(self), dropout=True)
            if weights is None:
                continue
            (softmax, softmax_order), weight_names = weights
            scores = self._scores_of(softmax, softmax_order)
            if scores is None:
                continue
            product, names = scores
            params = {p.name.value for p in (*function.params.posonly_params, *function.params.params,
                                            *function.params.kwonly_params)}
            if _weights_escape([function], weight_names | names, params):
                return  # the weights (or the scores) leave the function: SDPA cannot give them
            if id(product) in self._loosely_reported:
                return
            self._loosely_reported.add(id(product))
            problems = ["the attention is written in a shape the rewrite does not follow (assigned in branches, "
                        "keys transposed elsewhere, or the weights on the right of the product): replace it with "
                        "`F.scaled_dot_product_attention(q, k, v, ...)` by hand"]
            if switched_off:
                problems.append("the fused kernel is behind a switch that is off by default, so this path is the "
                                "one that runs: turn the switch on by default")
            self.report(product, note=_problem_note(problems))
            return

    def _scores_of(self, softmax: cst.Call, order: int) -> tuple[cst.BaseExpression, set[str]] | None:
        """The product of two activations that the softmax (read at statement `order`) normalises over its key
        dimension, and the names that held the scores; None if the softmax input is no such product."""
        parts = _softmax_parts(self, softmax)
        if parts is None:
            return None
        expr, dim = parts

        def product_here(node: cst.BaseExpression, _: int) -> cst.BaseExpression | None:
            product = _activation_product(self.ctx, node)
            if product is None:
                return None
            rank, key_dims = product
            if key_dims:  # an einsum names its key dimension: the softmax must run over it
                return node if dim in key_dims else None
            fits = dim == -1 or (rank is not None and dim == rank - 1) or (rank is None and dim >= 2)
            return node if fits else None

        found = self._trace_back(expr, order, product_here, dropout=False)
        return None if found is None else (found[0], found[1])

    def _trace_back(self, expr: cst.BaseExpression, order: int, goal, *, dropout: bool):
        """Follow `expr` (read at statement `order`) back through the assignments that last bound its names, and
        through element-wise steps (both operands of an arithmetic step), until `goal(node, its statement's
        order)` gives a result: (that result, the names passed through). An augmented assignment (`att *= s`)
        keeps the value it rescales; a name bound any other way (unpacked, a parameter) ends the path."""
        names: set[str] = set()
        pending = [(expr, order)]
        for _ in range(32):
            if not pending:
                return None
            node, at = pending.pop()
            if isinstance(node, cst.Name):
                binding = self._last_binding(node.value, at)
                if binding is not None:
                    names.add(node.value)
                    pending.append((binding.value, binding.order))  # type: ignore[arg-type]
                continue
            found = goal(node, at)
            if found is not None:
                return found, names
            pending.extend((inner, at) for inner in reversed(_elementwise_operands(self.ctx, node, dropout=dropout)))
        return None

    def _last_binding(self, name: str, before: int) -> Binding | None:
        """The assignment that last gave `name` its value before statement `before`, in source order (across the
        branches of an `if`: each computes the same kind of value), passing over augmented assignments."""
        while True:
            prior = [b for b in self.ctx.analysis.reaching_bindings(name, self.ctx.ancestors, before)
                     if b.order < before]
            if not prior:
                return None
            binding = prior[-1]
            if binding.kind is BindingKind.AUGMENT:
                before = binding.order
                continue
            return binding if binding.kind is BindingKind.ASSIGN and binding.value is not None else None

    def _next_to_fused_attention(self) -> bool:
        """In a function or class that also calls a fused kernel: the manual form is its fallback."""
        for node in reversed(self.ctx.ancestors):
            if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                key = id(node)
                if key not in self._fused_cache:
                    self._fused_cache[key] = any(
                        _FUSED_ATTENTION_NAME.search(n.value if isinstance(n, cst.Name) else n.attr.value)
                        for n in _iter_nodes(node) if isinstance(n, (cst.Name, cst.Attribute))
                        and not _names_own_method(n, node))
                if self._fused_cache[key]:
                    return True
        return False

    def _under_switch_off_by_default(self) -> bool:
        """`if self.flash: <fused> else: <here>` (or `if not FLASH: <here>`) with the switch off by default."""
        ancestors = self.ctx.ancestors
        for index in range(len(ancestors) - 1, 0, -1):
            branch, node = ancestors[index], ancestors[index - 1]
            if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                return False
            if not isinstance(node, cst.If):
                continue
            test, negated = node.test, False
            if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                test, negated = test.expression, True
            name = dotted_name(test)
            if name is None or not _FUSED_ATTENTION_NAME.search(name.rsplit(".", 1)[-1]):
                continue
            if (branch is node.orelse) != negated:  # the branch that runs while the switch is off
                return not self._switch_computed(name) and option_off_by_default(
                    self.ctx, related_texts(self.ctx), name.rsplit(".", 1)[-1])
        return False

    def _switch_computed(self, name: str) -> bool:
        """`self.flash = hasattr(F, "scaled_dot_product_attention")`: the class decides the switch itself (on
        wherever the kernel exists), rather than copying a setting (`self.flash = config.flash`)."""
        info = self.ctx.analysis.enclosing_class(self.ctx.ancestors)
        if not name.startswith("self.") or info is None:
            return False
        attr = name[len("self."):]
        return any(b.value is not None and not (isinstance(b.value, (cst.Name, cst.Attribute, cst.Integer))
                                                or dotted_name(b.value) in ("False", "True"))
                   for b in info.attrs.get(attr, []))

    # -- the replacement ---------------------------------------------------------------------------------

    def _build_call(self, trace: "_Trace", value: cst.BaseExpression, problems: list[str]
                    ) -> tuple[cst.Call | None, tuple, str | None]:
        keywords: list[tuple[str, cst.BaseExpression]] = []
        notes: list[str] = []
        masks = [s for s in trace.steps if s.kind in ("bool", "add")]
        scales = [s for s in trace.steps if s.kind == "scale"]
        if len(scales) > 1:
            problems.append("the scores are scaled more than once")
            return None, (), None
        if any(s.cond is not None for s in masks) and len(masks) > 1:
            problems.append("a conditional mask is combined with other masks")
            return None, (), None
        kinds = {s.kind for s in masks}
        if kinds == {"bool", "add"}:
            problems.append("boolean and additive masks are combined")
            return None, (), None
        is_causal = len(masks) == 1 and masks[0].causal
        if masks and not is_causal:
            if kinds == {"bool"}:
                parts = [_invert_mask(s.node) for s in masks]
                mask = parts[0] if len(parts) == 1 else _join(parts, cst.BitAnd())
                if not any(s.causal for s in masks):
                    notes.append("a query row whose keys are all masked gives 0 with SDPA, not NaN")
            else:
                mask = masks[0].node if len(masks) == 1 else _join([s.node for s in masks], cst.Add())
                notes.append("the additive mask must be a float tensor (a bool tensor means the opposite to SDPA)")
            if masks[0].cond is not None and not _tests_not_none(masks[0].cond, mask):
                mask = cst.IfExp(test=masks[0].cond, body=_parens_if_needed(mask), orelse=cst.Name("None"))
            keywords.append(("attn_mask", _strip_parens(mask)))
        if trace.dropout is not None:
            p, training = trace.dropout
            if training is None:
                keywords.append(("dropout_p", p))
            elif not (isinstance(training, cst.Name) and training.value == "False"):
                if isinstance(training, cst.Name) and training.value == "True":
                    keywords.append(("dropout_p", p))
                else:
                    keywords.append(("dropout_p", cst.IfExp(test=training, body=p, orelse=cst.Float("0.0"))))
        if is_causal:
            keywords.append(("is_causal", cst.Name("True")))
        if not scales:
            keywords.append(("scale", cst.Float("1.0")))
        else:
            step = scales[0]
            if not self._tracer_float_like(step.node):
                problems.append("the scale may be a tensor (SDPA's `scale` is a Python float)")
                return None, (), None
            if not _is_default_scale(step, trace, self):
                keywords.append(("scale", _strip_parens(step.node) if step.op == "mul" else _reciprocal(step.node)))
        func_text, imports = self.ctx.spell("torch.nn.functional.scaled_dot_product_attention")
        args = [_arg(trace.q), _arg(trace.k), _arg(value)]
        args += [_arg(v, k) for k, v in keywords]
        call = cst.Call(func=cst.parse_expression(func_text), args=_with_commas(args))
        return self._wrapped(call, func_text), imports, "; ".join(notes) or None

    def _wrapped(self, call: cst.Call, func_text: str) -> cst.Call:
        """Break the argument list at the opening parenthesis when the line would pass _LINE_LIMIT columns."""
        where = _statement_position(self.ctx.ancestors)
        if where is None:
            return call
        index, block, final_index = where
        anchor = self.ctx.ancestors[-1]
        statement = block.body[final_index].with_changes(leading_lines=[])  # type: ignore[attr-defined]
        first_line = self.ctx.code(statement).split("\n", 1)[0]
        anchor_line = self.ctx.code(anchor).split("\n", 1)[0]
        column = first_line.find(anchor_line)
        if column < 0:
            return call
        indent = sum(len(node.indent if node.indent is not None else self.ctx.module.default_indent)
                     for node in self.ctx.ancestors[:index] if isinstance(node, cst.IndentedBlock))
        rest = first_line[column + len(anchor_line):].split("#", 1)[0].rstrip()
        texts = [cst.Module([]).code_for_node(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for arg in call.args]
        open_column = indent + column + len(func_text) + 1
        if open_column + len(", ".join(texts)) + 1 + len(rest) <= _LINE_LIMIT:
            return call
        args = list(call.args)
        width = open_column
        for i, text in enumerate(texts):
            last = i == len(texts) - 1
            needed = len(text) + (1 + len(rest) if last else 1)
            if i > 0 and width + needed > _LINE_LIMIT:
                newline = cst.ParenthesizedWhitespace(
                    first_line=cst.TrailingWhitespace(), empty_lines=[], indent=True,
                    last_line=cst.SimpleWhitespace(" " * (open_column - indent)))
                args[i - 1] = args[i - 1].with_changes(comma=cst.Comma(whitespace_after=newline))
                width = open_column
            width += len(text) + 2
        return call.with_changes(args=args)

    def _tracer_float_like(self, node: cst.BaseExpression) -> bool:
        return _FloatLike(self).check(node)


# ---------------------------------------------------------------------------------------------------------
# tracing the chain backwards through the statements of one block


@dataclass
class _Step:
    kind: str  # "scale" | "bool" | "add"
    node: cst.BaseExpression  # the scale factor / the mask / the additive bias
    pos: int  # index of the statement (in the block) the node is in
    op: str = ""  # scale: "mul" | "div"
    cond: cst.BaseExpression | None = None  # `if <cond>:` around a mask step
    causal: bool = False


@dataclass
class _Trace:
    consumed: list[int] = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list)  # outermost first
    names: set[str] = field(default_factory=set)  # chain temporaries
    problems: list[str] = field(default_factory=list)
    dropout: tuple[cst.BaseExpression, cst.BaseExpression | None] | None = None  # (p, training)
    softmax_dim: int | None = None
    q: cst.BaseExpression | None = None
    k: cst.BaseExpression | None = None
    qk_pos: int = 0
    rank: int | None = None
    moved: list[tuple[cst.BaseExpression, int]] = field(default_factory=list)  # (expr, statement index)

    def copy(self) -> "_Trace":
        return replace(self, consumed=list(self.consumed), steps=list(self.steps), names=set(self.names),
                       problems=list(self.problems), moved=list(self.moved))


# (value, index of its statement in the block, the `if` test it is under)
_Resolved = tuple[cst.BaseExpression, int, "cst.BaseExpression | None"]


class _Tracer:
    def __init__(self, rule: ManualAttention, block: cst.CSTNode, final_index: int) -> None:
        self.rule = rule
        self.ctx = rule.ctx
        self.stmts: Sequence[cst.CSTNode] = block.body  # type: ignore[attr-defined]
        self.final_index = final_index

    # name resolution: the statement that last gave `name` its value before statement `pos`
    def resolve(self, name: str, pos: int, t: _Trace) -> _Resolved | None:
        for j in range(pos - 1, -1, -1):
            stmt = self.stmts[j]
            found = _definition(stmt, name)
            if found is not None:
                value, cond = found
                t.consumed.append(j)
                t.names.add(name)
                return value, j, cond
            if name in _names_bound(stmt):
                return None  # bound some other way (loop target, unpacking, with-as): not followed
            if name in _names_read(stmt):
                t.problems.append(f"the attention weights `{name}` are used elsewhere")
        return None

    def _follow(self, expr: cst.BaseExpression, pos: int, t: _Trace) -> _Resolved | None:
        if isinstance(expr, cst.Name):
            return self.resolve(expr.value, pos, t)
        return expr, pos, None

    # probs := dropout(softmax) | softmax | probs * head_mask
    def probs(self, expr: cst.BaseExpression, pos: int, t: _Trace) -> _Trace | None:
        for _ in range(8):
            got = self._follow(expr, pos, t)
            if got is None:
                return None
            expr, pos, cond = got
            dropout = self._dropout(expr, t)
            if dropout is not None:
                inner, info = dropout
                if t.dropout is not None or cond is not None:
                    t.problems.append("dropout is applied conditionally or twice")
                if info is None:
                    t.problems.append("the dropout module is not a plain `nn.Dropout`")
                else:
                    t.dropout = info
                    t.moved.extend((e, pos) for e in info if e is not None)
                expr = inner
                continue
            if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply) \
                    and isinstance(expr.left, cst.Name):
                t.problems.append("the attention weights are rescaled after the softmax")
                expr = expr.left
                continue
            if cond is not None:
                return None
            return self.softmax(expr, pos, t)
        return None

    def _dropout(self, expr: cst.BaseExpression, t: _Trace):
        """(inner, (p, training) | None) when `expr` is dropout of something, else None."""
        if not isinstance(expr, cst.Call) or has_star_args(expr):
            return None
        qual = self.ctx.qualname(expr.func)
        if qual in _DROPOUT_FUNCTIONS:
            x = call_arg(expr, "input", 0)
            p = call_arg(expr, "p", 1)
            training = call_arg(expr, "training" if qual.endswith("functional.dropout") else "train", 2)
            if x is None:
                return None
            if qual == "torch.dropout" and training is None:
                return None
            return x.value, ((p.value if p else cst.Float("0.5")), training.value if training else None)
        name = dotted_name(expr.func) or ""
        if len(expr.args) == 1 and "drop" in name.rsplit(".", 1)[-1].lower():
            inner = expr.args[0].value
            module = self._dropout_module(expr.func)
            if module is None:
                return inner, None
            return inner, (cst.parse_expression(f"{name}.p"), cst.parse_expression("self.training"))
        return None

    def _dropout_module(self, func: cst.BaseExpression) -> bool | None:
        """`self.attn_drop` built only as `nn.Dropout(...)` in the class."""
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
            return None
        info = self.ctx.analysis.enclosing_class(self.ctx.ancestors)
        bindings = info.attrs.get(func.attr.value, []) if info else []
        if not bindings:
            return None
        for binding in bindings:
            value = binding.value
            if binding.kind is not BindingKind.ASSIGN or not isinstance(value, cst.Call) \
                    or self.ctx.qualname(value.func) != "torch.nn.Dropout":
                return None
        return True

    def softmax(self, expr: cst.BaseExpression, pos: int, t: _Trace) -> _Trace | None:
        got = self._follow(expr, pos, t)
        if got is None or got[2] is not None:
            return None
        expr, pos, _ = got
        if isinstance(expr, cst.Call) and method_name(expr) in _DTYPE_METHODS \
                and isinstance(expr.func, cst.Attribute) and _is_softmax_call(self.ctx, expr.func.value):
            t.problems.append("the softmax runs in another dtype")
            expr = expr.func.value
        if not isinstance(expr, cst.Call) or has_star_args(expr):
            return None
        qual = self.ctx.qualname(expr.func)
        module_dim = _softmax_module_dim(self.ctx, expr.func) if len(expr.args) == 1 else None
        if qual in _SOFTMAX_FUNCTIONS:
            x, dim = call_arg(expr, "input", 0), call_arg(expr, "dim", 1)
        elif module_dim is not None and expr.args[0].keyword is None:  # `self.softmax(x)`, an `nn.Softmax(dim=-1)`
            x, dim = expr.args[0], cst.Arg(module_dim)
        elif method_name(expr) == "softmax" and qual is None:
            assert isinstance(expr.func, cst.Attribute)
            receiver = expr.func.value
            module_dim = _softmax_module_dim(self.ctx, receiver)
            if module_dim is not None:
                return None  # `self.softmax.softmax(...)`: not a pattern
            x, dim = cst.Arg(receiver), call_arg(expr, "dim", 0)
        else:
            return None
        if x is None or dim is None:
            return None  # implicit-dim softmax: not this pattern
        dim_value = _int_literal(dim.value)
        if dim_value is None:
            return None
        t.softmax_dim = dim_value
        if call_arg(expr, "dtype") is not None:
            t.problems.append("the softmax runs in another dtype")
        inner = x.value
        if isinstance(inner, cst.Call) and method_name(inner) in _DTYPE_METHODS \
                and isinstance(inner.func, cst.Attribute):
            t.problems.append("the softmax runs in another dtype")
            inner = inner.func.value
        return self.scores(inner, pos, t)

    # scores := scores.masked_fill(M, -inf) | scores + bias | scores * s | s * scores | scores / s | q @ kT
    def scores(self, expr: cst.BaseExpression, pos: int, t: _Trace) -> _Trace | None:
        cond: cst.BaseExpression | None = None
        for _ in range(16):
            if isinstance(expr, cst.Name):
                got = self.resolve(expr.value, pos, t)
                if got is None:
                    return None
                expr, pos, cond = got
            step_cond, cond = cond, None
            if step_cond is not None:
                t.moved.append((step_cond, pos))
            # masked_fill
            if isinstance(expr, cst.Call) and method_name(expr) in ("masked_fill", "masked_fill_") \
                    and isinstance(expr.func, cst.Attribute) and not has_star_args(expr):
                mask, fill = call_arg(expr, "mask", 0), call_arg(expr, "value", 1)
                if mask is None or fill is None or not self._is_large_negative(fill.value):
                    return None
                causal = self._is_causal_mask(mask.value)
                t.steps.append(_Step("bool", mask.value, pos, cond=step_cond, causal=causal))
                if not causal:
                    t.moved.append((mask.value, pos))
                expr = expr.func.value
                if step_cond is not None and not isinstance(expr, cst.Name):
                    return None
                continue
            if step_cond is not None and not (isinstance(expr, cst.BinaryOperation)
                                              and isinstance(expr.operator, cst.Add)):
                return None  # only a mask may be applied under `if`
            if isinstance(expr, cst.BinaryOperation):
                op = expr.operator
                if isinstance(op, cst.MatrixMultiply):
                    return self._qk(expr.left, expr.right, pos, t)
                if isinstance(op, cst.Add):
                    for chain, other in ((expr.left, expr.right), (expr.right, expr.left)):
                        attempt = t.copy()
                        attempt.steps.append(_Step("add", other, pos, cond=step_cond))
                        attempt.moved.append((other, pos))
                        if step_cond is not None and not isinstance(chain, cst.Name):
                            continue
                        done = self.scores(chain, pos, attempt)
                        if done is not None:
                            return done
                    return None
                if isinstance(op, cst.Multiply):
                    for chain, other in ((expr.left, expr.right), (expr.right, expr.left)):
                        attempt = t.copy()
                        attempt.steps.append(_Step("scale", other, pos, op="mul"))
                        attempt.moved.append((other, pos))
                        done = self.scores(chain, pos, attempt)
                        if done is not None:
                            return done
                    return None
                if isinstance(op, cst.Divide):
                    t.steps.append(_Step("scale", expr.right, pos, op="div"))
                    t.moved.append((expr.right, pos))
                    expr = expr.left
                    continue
                return None
            if isinstance(expr, cst.Call) and not has_star_args(expr):
                qual = self.ctx.qualname(expr.func)
                positional = [a for a in expr.args if a.keyword is None]
                if qual in _MATMUL_FUNCTIONS and len(positional) == 2 == len(expr.args):
                    return self._qk(positional[0].value, positional[1].value, pos, t)
                if qual == "torch.einsum" and len(expr.args) == 3:
                    spec = _einsum_spec(string_value(expr.args[0].value))
                    if spec is None or spec.kind != "qk":
                        return None
                    return self._finish_qk(expr.args[1].value, expr.args[2].value, spec.rank, pos, t)
            return None
        return None

    def _qk(self, left: cst.BaseExpression, right: cst.BaseExpression, pos: int, t: _Trace) -> _Trace | None:
        if isinstance(right, cst.Name):  # `k_t = k.transpose(2, 3)` a statement before `q @ k_t`
            got = self.resolve(right.value, pos, t)
            if got is None or got[2] is not None:
                return None
            right = got[0]
        transposed = _transposed_last_two(self.ctx, right)
        if transposed is None:
            return None
        k, rank = transposed
        return self._finish_qk(left, k, rank, pos, t)

    def _finish_qk(self, q: cst.BaseExpression, k: cst.BaseExpression, rank: int | None, pos: int,
                   t: _Trace) -> _Trace | None:
        # `(q * scale) @ k.transpose(-2, -1)`
        if isinstance(q, cst.BinaryOperation) and isinstance(q.operator, (cst.Multiply, cst.Divide)) \
                and _FloatLike(self.rule).check(q.right) and not _FloatLike(self.rule).check(q.left):
            t.steps.append(_Step("scale", q.right, pos, op="mul" if isinstance(q.operator, cst.Multiply) else "div"))
            t.moved.append((q.right, pos))
            q = q.left
        t.q, t.k, t.qk_pos, t.rank = q, k, pos, rank
        t.moved.extend(((q, pos), (k, pos)))
        _check_order(t)
        return t

    def _is_large_negative(self, node: cst.BaseExpression) -> bool:
        evidence = self.ctx.evidence
        if isinstance(node, cst.Attribute) and node.attr.value == "min" and isinstance(node.value, cst.Call):
            return self.ctx.qualname(node.value.func) == "torch.finfo"
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
            magnitude = evidence.scalar_magnitude(node.expression)
            if magnitude is None:
                inner = node.expression
                return self.ctx.qualname(inner) in ("math.inf", "torch.inf", "numpy.inf") or (
                    isinstance(inner, cst.Call) and isinstance(inner.func, cst.Name) and inner.func.value == "float"
                    and (string_value(inner.args[0].value) or "").strip().lower() in ("inf", "infinity"))
            return magnitude >= _MIN_MASK_MAGNITUDE
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "float" \
                and len(node.args) == 1:
            return (string_value(node.args[0].value) or "").strip().lower() in ("-inf", "-infinity")
        magnitude = evidence.scalar_magnitude(node) if evidence.is_scalar_literal(node) else None
        return magnitude is not None and magnitude <= -_MIN_MASK_MAGNITUDE

    def _is_causal_mask(self, mask: cst.BaseExpression) -> bool:
        """`self.bias[:, :, :T, :T] == 0` with `self.bias` a registered `torch.tril(torch.ones(n, n))` buffer,
        or a local `torch.triu(torch.ones(T, T), diagonal=1)`: masked positions are exactly j > i on an
        L == S square, which is SDPA's `is_causal=True`."""
        if isinstance(mask, cst.Comparison) and len(mask.comparisons) == 1 \
                and isinstance(mask.comparisons[0].operator, cst.Equal) \
                and _int_literal(mask.comparisons[0].comparator) == 0:
            return self._is_tril_slice(mask.left)
        if isinstance(mask, cst.Name):
            bindings = self.ctx.analysis.bindings_of(mask.value, self.ctx.ancestors)
            if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN and bindings[0].value is not None:
                return _is_triu_one(self.ctx, bindings[0].value)
            return False
        return _is_triu_one(self.ctx, mask)

    def _is_tril_slice(self, node: cst.BaseExpression) -> bool:
        if not isinstance(node, cst.Subscript):
            return False
        bound = _square_trailing_slice(self.ctx, node.slice)
        if bound is None:
            return False
        buffer = node.value
        if not (isinstance(buffer, cst.Attribute) and isinstance(buffer.value, cst.Name)
                and buffer.value.value == "self"):
            return False
        info = self.ctx.analysis.enclosing_class(self.ctx.ancestors)
        if info is None:
            return False
        name = buffer.attr.value
        values = [b.value for b in info.attrs.get(name, []) if b.value is not None]
        if len(info.attrs.get(name, [])) != len(values):
            return False
        for call in _walk_calls(info.node):
            if method_name(call) == "register_buffer" and len(call.args) >= 2 \
                    and string_value(call.args[0].value) == name:
                values.append(call.args[1].value)
            elif method_name(call) == "register_buffer" and call.args and string_value(call.args[0].value) is None:
                return False  # a buffer registered under a computed name: cannot tell
        return len(values) == 1 and _is_tril_ones(self.ctx, values[0])

    # -- after the chain is known -------------------------------------------------------------------------

    def check_uses(self, t: _Trace, final: cst.CSTNode, anchor: cst.CSTNode, probs: cst.BaseExpression,
                   ancestors: Sequence[cst.CSTNode]) -> None:
        consumed = set(t.consumed)
        first = min(consumed, default=self.final_index)
        # statements between the chain's statements, not part of it
        for j in range(first, self.final_index):
            if j in consumed:
                continue
            if _names_read(self.stmts[j]) & t.names:
                t.problems.append("the attention weights are used elsewhere")
                break
        # the final statement, outside `probs`
        if _names_read(final, skip=probs) & t.names:
            t.problems.append("the attention weights are used elsewhere")
        # moved expressions: nothing they read may be rebound before the final statement
        for expr, pos in t.moved:
            read = _names_read(expr)
            if read & t.names:
                t.problems.append("a mask or scale reads the attention scores")
                break
            for j in range(pos + 1, self.final_index):
                if j not in consumed and read & _names_bound(self.stmts[j]):
                    t.problems.append("a name the rewrite moves is rebound in between")
                    break
        # later reads
        alive = set(t.names) - _assigned_names(final)
        if alive and _read_later(ancestors, alive, {id(self.stmts[j]) for j in consumed} | {id(final)}):
            t.problems.append("the attention weights are used after the attention")


def _softmax_goal(rule: ManualAttention):
    """The goal of a trace back to a softmax call: (the call, the order of the statement holding it)."""
    return lambda node, order: (node, order) if _softmax_parts(rule, node) is not None else None


def _softmax_parts(rule: ManualAttention, expr: cst.BaseExpression) -> tuple[cst.BaseExpression, int] | None:
    """(input, dim) of `F.softmax(x, dim=d)`, `x.softmax(d)`, `self.softmax(x)` (an `nn.Softmax(dim=d)`)."""
    if not isinstance(expr, cst.Call) or has_star_args(expr):
        return None
    ctx = rule.ctx
    qual = ctx.qualname(expr.func)
    if qual in _SOFTMAX_FUNCTIONS:
        x, dim = call_arg(expr, "input", 0), call_arg(expr, "dim", 1)
        dim_value = dim.value if dim is not None else None
    elif method_name(expr) == "softmax" and qual is None and isinstance(expr.func, cst.Attribute) \
            and dotted_name(expr.func.value) not in ("F", "torch", "nn.functional"):
        x, dim = cst.Arg(expr.func.value), call_arg(expr, "dim", 0)
        dim_value = dim.value if dim is not None else None
    elif len(expr.args) == 1 and expr.args[0].keyword is None:
        dim_value = _softmax_module_dim(ctx, expr.func)
        x = expr.args[0]
    else:
        return None
    number = _int_literal(dim_value) if dim_value is not None else None
    return (x.value, number) if x is not None and number is not None else None


_VIEW_METHODS = {"view", "reshape", "contiguous", "permute", "transpose", "float", "half", "bfloat16", "to", "type",
                 "type_as", "masked_fill", "masked_fill_", "mul", "div", "add", "squeeze", "unsqueeze"}


def _elementwise_operands(ctx, expr: cst.BaseExpression, *, dropout: bool) -> list[cst.BaseExpression]:
    """The tensors an element-wise step (or a view, a cast, a mask; a dropout when `dropout`) applies to."""
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Multiply, cst.Divide, cst.Add,
                                                                             cst.Subtract)):
        return [side for side in (expr.left, expr.right) if _carries_tensor(side)]
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        return [expr.expression]
    if not isinstance(expr, cst.Call) or has_star_args(expr):
        return []
    qual = ctx.qualname(expr.func)
    if qual == "torch.where" and len(expr.args) == 3:
        return [expr.args[1].value, expr.args[2].value]
    if dropout and (qual in _DROPOUT_FUNCTIONS or len(expr.args) == 1 and "drop" in
                    (dotted_name(expr.func) or "").rsplit(".", 1)[-1].lower()):
        return [expr.args[0].value]
    if qual is None and method_name(expr) in _VIEW_METHODS and isinstance(expr.func, cst.Attribute):
        return [expr.func.value]
    return []


def _carries_tensor(node: cst.BaseExpression) -> bool:
    """Could `node` be the chain's tensor rather than its scale (a name, attribute, call or product)?"""
    return isinstance(node, (cst.Name, cst.Call, cst.BinaryOperation, cst.Subscript)) and not (
        isinstance(node, cst.Call) and dotted_name(node.func) in ("math.sqrt", "sqrt", "float", "int"))


_WEIGHT_NAME = re.compile(r"(weight|embedding|embed|codebook|wte|lm_head)$", re.I)


def _activation_product(ctx, expr: cst.BaseExpression) -> tuple[int | None, tuple[int, ...]] | None:
    """(rank when known, positions of the key dimension) of a product of two activations: `a @ b`,
    `torch.matmul` / `bmm` (or the methods), a two-operand `einsum` with a query-only and a key-only index; not
    a product with a layer's weight (`x @ self.weight.t()`, logits over a vocabulary)."""
    operands: Sequence[cst.BaseExpression]
    rank: int | None = None
    keys: tuple[int, ...] = ()
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.MatrixMultiply):
        operands = (expr.left, expr.right)
    elif isinstance(expr, cst.Call) and not has_star_args(expr):
        qual = ctx.qualname(expr.func)
        positional = [a.value for a in expr.args if a.keyword is None]
        if qual in _MATMUL_FUNCTIONS and len(positional) == 2:
            operands, rank = positional, 3 if qual == "torch.bmm" else None
        elif qual is None and method_name(expr) in ("matmul", "bmm") and len(positional) == 1 \
                and isinstance(expr.func, cst.Attribute):
            operands, rank = (expr.func.value, positional[0]), 3 if method_name(expr) == "bmm" else None
        elif qual == "torch.einsum":
            found = _einsum_operands(expr)
            if found is None:
                return None
            (first, second, output), operands = found
            first, second, named = (part.replace("...", "") for part in (first, second, output))
            if not set(first) - set(second) & set(named):
                return None
            # key dimensions counted from the end when a `...` leaves the rank open
            keys = tuple(i - len(named) for i, letter in enumerate(named) if letter in set(second) - set(first))
            if not keys:
                return None
            rank = None if "..." in output else len(output)
            if rank is not None:
                keys += tuple(rank + i for i in keys)
        else:
            return None
    else:
        return None
    for operand in operands:
        while isinstance(operand, cst.Call) and isinstance(operand.func, cst.Attribute) \
                and method_name(operand) in _VIEW_METHODS | {"t"}:
            operand = operand.func.value
        if isinstance(operand, (cst.Integer, cst.Float)) or _WEIGHT_NAME.search(dotted_name(operand) or ""):
            return None
    return rank, keys


def _einsum_operands(call: cst.Call) -> tuple[tuple[str, str, str], tuple[cst.BaseExpression, ...]] | None:
    """((first, second, output) index letters, (a, b)) of `einsum(spec, a, b)` or `einsum(spec, (a, b))` whose
    spec contracts an index (one in both inputs, not in the output); None otherwise."""
    if not call.args or has_star_args(call):
        return None
    spec = string_value(call.args[0].value)
    if spec is None:
        return None
    spec = spec.replace(" ", "")
    if spec.count("->") != 1 or spec.count(",") != 1:
        return None
    inputs, output = spec.split("->")
    first, second = inputs.split(",")
    if len(call.args) == 3:
        operands = (call.args[1].value, call.args[2].value)
    elif len(call.args) == 2 and isinstance(call.args[1].value, (cst.Tuple, cst.List)) \
            and len(call.args[1].value.elements) == 2:
        operands = tuple(e.value for e in call.args[1].value.elements)
    else:
        return None
    if not (set(first) & set(second)) - set(output) - {"."}:  # nothing contracted: an outer product
        return None
    return (first, second, output), operands


def _check_order(t: _Trace) -> None:
    """SDPA computes `q @ k^T * scale + mask`: an additive mask applied before the scaling differs."""
    seen_add = False
    for step in reversed(t.steps):  # innermost first
        if step.kind == "add":
            seen_add = True
        elif step.kind == "scale" and seen_add:
            t.problems.append("the additive mask is applied before the scaling")
            return


# ---------------------------------------------------------------------------------------------------------
# syntax helpers


@dataclass(frozen=True)
class _Einsum:
    kind: str  # "qk": (..., q, d) x (..., k, d) -> (..., q, k);  "pv": (..., q, k) x (..., k, d) -> (..., q, d)
    rank: int | None


def _einsum_spec(spec: str | None) -> _Einsum | None:
    if spec is None:
        return None
    spec = spec.replace(" ", "")
    if spec.count("->") != 1:
        return None
    inputs, output = spec.split("->")
    operands = inputs.split(",")
    if len(operands) != 2:
        return None
    a, b = operands
    if not (len(a) >= 2 and len(b) >= 2 and len(output) >= 2):
        return None
    batch = a[:-2]
    if b[:-2] != batch or output[:-2] != batch:
        return None
    letters = batch.replace("...", "")
    if len(set(letters)) != len(letters) or (letters and not letters.isalpha()):
        return None
    x, y = a[-2:], b[-2:]
    out = output[-2:]
    rank = None if "..." in batch else len(batch) + 2
    if len(set(x + y[0] + out)) < 2:
        return None
    # qk: a = (i, d), b = (j, d), out = (i, j)
    if x[1] == y[1] and out == x[0] + y[0] and len({x[0], y[0], x[1]}) == 3 and not set(x + y) & set(letters):
        return _Einsum("qk", rank)
    # pv: a = (i, j), b = (j, d), out = (i, d)
    if x[1] == y[0] and out == x[0] + y[1] and len({x[0], x[1], y[1]}) == 3 and not set(x + y) & set(letters):
        return _Einsum("pv", rank)
    return None


def _transposed_last_two(ctx, node: cst.BaseExpression) -> tuple[cst.BaseExpression, int | None] | None:
    """`k.transpose(-2, -1)`, `k.transpose(2, 3)`, `k.mT`, `k.permute(0, 1, 3, 2)`, `torch.transpose(k, -2, -1)`:
    (k, rank if the dims pin it)."""
    if isinstance(node, cst.Attribute) and node.attr.value == "mT":
        return node.value, None
    if not isinstance(node, cst.Call) or has_star_args(node):
        return None
    qual = ctx.qualname(node.func)
    if qual == "torch.transpose" and len(node.args) == 3:
        receiver, dims = node.args[0].value, [_int_literal(a.value) for a in node.args[1:]]
    elif method_name(node) == "transpose" and qual is None and len(node.args) == 2:
        assert isinstance(node.func, cst.Attribute)
        receiver, dims = node.func.value, [_int_literal(a.value) for a in node.args]
    elif method_name(node) == "permute" and qual is None and node.args:
        assert isinstance(node.func, cst.Attribute)
        perm = [_int_literal(a.value) for a in node.args]
        n = len(perm)
        if n >= 2 and perm == list(range(n - 2)) + [n - 1, n - 2]:
            return node.func.value, n
        return None
    else:
        return None
    if None in dims or any(a.keyword is not None for a in node.args):
        return None
    pair = sorted(dims)  # type: ignore[type-var]
    if pair == [-2, -1]:
        return receiver, None
    if pair[1] == pair[0] + 1 and pair[0] >= 1:
        return receiver, pair[1] + 1
    return None


def _int_literal(node: cst.BaseExpression | None) -> int | None:
    sign = 1
    while isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        sign = -sign if isinstance(node.operator, cst.Minus) else sign
        node = node.expression
    if isinstance(node, cst.Integer):
        return sign * int(node.evaluated_value)
    return None


def _names_own_method(node: cst.Name | cst.Attribute, scope: cst.FunctionDef | cst.ClassDef) -> bool:
    """The name of a method defined in `scope` (`def _scaled_dot_product_attention(...)` written by hand, or
    `self._scaled_dot_product_attention(...)` calling it): not the fused kernel."""
    name = node.value if isinstance(node, cst.Name) else node.attr.value
    if isinstance(node, cst.Attribute) and dotted_name(node.value) != "self":
        return False
    return any(isinstance(n, cst.FunctionDef) and n.name.value == name for n in _iter_nodes(scope))


def _softmax_module_dim(ctx, func: cst.BaseExpression) -> cst.BaseExpression | None:
    """`self.softmax` built as `nn.Softmax(dim=-1)`: its dim."""
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
        return None
    info = ctx.analysis.enclosing_class(ctx.ancestors)
    bindings = info.attrs.get(func.attr.value, []) if info else []
    dims = set()
    found = None
    for binding in bindings:
        value = binding.value
        if not (isinstance(value, cst.Call) and ctx.qualname(value.func) == "torch.nn.Softmax"):
            return None
        dim = call_arg(value, "dim", 0)
        if dim is None:
            return None
        dims.add(ctx.code(dim.value))
        found = dim.value
    return found if len(dims) == 1 else None


def _is_softmax_call(ctx, node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and (ctx.qualname(node.func) in _SOFTMAX_FUNCTIONS
                                           or (method_name(node) == "softmax" and ctx.qualname(node.func) is None))


def _square_trailing_slice(ctx, elements: Sequence[cst.SubscriptElement]) -> str | None:
    """`[:, :, :T, :T]` / `[..., :T, :T]` / `[:T, :T]`: the code of T, else None."""
    if len(elements) < 2:
        return None
    *lead, a, b = elements
    for element in lead:
        s = element.slice
        if isinstance(s, cst.Index) and isinstance(s.value, cst.Ellipsis):
            continue
        if isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None:
            continue
        return None
    bounds = []
    for element in (a, b):
        s = element.slice
        if not (isinstance(s, cst.Slice) and s.lower is None and s.step is None and s.upper is not None):
            return None
        bounds.append(ctx.code(s.upper))
    return bounds[0] if bounds[0] == bounds[1] else None


def _strip_views(ctx, node: cst.BaseExpression) -> cst.BaseExpression:
    while True:
        if isinstance(node, cst.Call) and method_name(node) in ("view", "reshape", "unsqueeze", "bool", "to",
                                                                 "float", "int", "long", "byte", "contiguous") \
                and isinstance(node.func, cst.Attribute):
            node = node.func.value
        elif isinstance(node, cst.Subscript) and all(
                isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Name) and e.slice.value.value == "None"
                or isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Ellipsis)
                for e in node.slice):
            node = node.value
        else:
            return node


def _ones_square(ctx, node: cst.BaseExpression) -> bool:
    if not (isinstance(node, cst.Call) and ctx.qualname(node.func) == "torch.ones"):
        return False
    positional = [a for a in node.args if a.keyword is None]
    if len(positional) == 1 and isinstance(positional[0].value, (cst.Tuple, cst.List)):
        sizes = [e.value for e in positional[0].value.elements]
    else:
        sizes = [a.value for a in positional]
    return len(sizes) == 2 and ctx.code(sizes[0]) == ctx.code(sizes[1])


def _is_tril_ones(ctx, node: cst.BaseExpression) -> bool:
    node = _strip_views(ctx, node)
    if not (isinstance(node, cst.Call) and ctx.qualname(node.func) == "torch.tril" and node.args):
        return False
    diagonal = call_arg(node, "diagonal", 1)
    if diagonal is not None and _int_literal(diagonal.value) != 0:
        return False
    return _ones_square(ctx, node.args[0].value)


def _is_triu_one(ctx, node: cst.BaseExpression) -> bool:
    node = _strip_views(ctx, node)
    if not (isinstance(node, cst.Call) and ctx.qualname(node.func) == "torch.triu" and node.args):
        return False
    diagonal = call_arg(node, "diagonal", 1)
    if diagonal is None or _int_literal(diagonal.value) != 1:
        return False
    return _ones_square(ctx, node.args[0].value)


def _definition(stmt: cst.CSTNode, name: str) -> tuple[cst.BaseExpression, cst.BaseExpression | None] | None:
    """(value, if-test) when `stmt` gives `name` its next value in the chain."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1 \
                and isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == name:
            return small.value, None
        if isinstance(small, cst.AnnAssign) and small.value is not None \
                and isinstance(small.target, cst.Name) and small.target.value == name:
            return small.value, None
        if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) and small.target.value == name:
            ops = {cst.MultiplyAssign: cst.Multiply, cst.DivideAssign: cst.Divide, cst.AddAssign: cst.Add}
            op = ops.get(type(small.operator))
            if op is None:
                return None
            return cst.BinaryOperation(left=cst.Name(name), operator=op(), right=small.value), None
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) \
                and method_name(small.value) == "masked_fill_" and isinstance(small.value.func, cst.Attribute) \
                and isinstance(small.value.func.value, cst.Name) and small.value.func.value.value == name:
            call = small.value
            return call.with_changes(func=call.func.with_changes(attr=cst.Name("masked_fill"))), None
        return None
    if isinstance(stmt, cst.If) and stmt.orelse is None and _pure_test(stmt.test) \
            and isinstance(stmt.body, cst.IndentedBlock) and len(stmt.body.body) == 1:
        inner = _definition(stmt.body.body[0], name)
        if inner is not None and inner[1] is None and name in _names_read(inner[0]):
            return inner[0], stmt.test
    return None


def _pure_test(test: cst.BaseExpression) -> bool:
    if isinstance(test, (cst.Name, cst.Attribute)):
        return dotted_name(test) is not None
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 \
            and isinstance(test.comparisons[0].operator, (cst.IsNot, cst.Is)):
        return dotted_name(test.left) is not None and isinstance(test.comparisons[0].comparator, cst.Name)
    return False


def _iter_nodes(node: cst.CSTNode, skip: cst.CSTNode | None = None) -> Iterator[cst.CSTNode]:
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if current is skip:
            continue
        yield current
        stack.extend(child_nodes(current))


def _walk_calls(node: cst.CSTNode) -> Iterator[cst.Call]:
    for current in _iter_nodes(node):
        if isinstance(current, cst.Call):
            yield current


def _names_read(node: cst.CSTNode, skip: cst.CSTNode | None = None) -> set[str]:
    """Names that `node` loads (not attribute names, keywords, or plain assignment targets)."""
    found: set[str] = set()
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if current is skip:
            continue
        if isinstance(current, cst.Name):
            found.add(current.value)
            continue
        if isinstance(current, cst.Attribute):
            stack.append(current.value)
            continue
        if isinstance(current, cst.Arg):
            stack.append(current.value)
            continue
        if isinstance(current, cst.AssignTarget):
            if not isinstance(current.target, (cst.Name, cst.Tuple, cst.List)):
                stack.append(current.target)  # `x[i] = ...` / `x.a = ...` read x
            continue
        if isinstance(current, cst.AugAssign):
            stack.extend((current.target, current.value))
            continue
        if isinstance(current, (cst.FunctionDef, cst.ClassDef)):
            stack.extend(current.decorators)
            stack.append(current.body)
            continue
        if isinstance(current, cst.Param):
            if current.default is not None:
                stack.append(current.default)
            continue
        if isinstance(current, (cst.Import, cst.ImportFrom)):
            continue
        stack.extend(child_nodes(current))
    return found


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(e.value) for e in target.elements)) if target.elements else set()
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return set()


def _names_bound(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()
    for current in _iter_nodes(node):
        if isinstance(current, cst.AssignTarget):
            found |= _target_names(current.target)
        elif isinstance(current, (cst.AnnAssign, cst.AugAssign)):
            found |= _target_names(current.target)
        elif isinstance(current, (cst.For, cst.CompFor)):
            found |= _target_names(current.target)
        elif isinstance(current, cst.NamedExpr):
            found |= _target_names(current.target)
        elif isinstance(current, cst.AsName):
            found |= _target_names(current.name) if isinstance(current.name, (cst.Name, cst.Tuple, cst.List)) else set()
        elif isinstance(current, (cst.FunctionDef, cst.ClassDef)):
            found.add(current.name.value)
        elif isinstance(current, (cst.Global, cst.Nonlocal)):
            found |= {n.name.value for n in current.names}
        elif isinstance(current, cst.Import):
            found |= {(dotted_name(a.name) or "").split(".")[0] for a in current.names if a.asname is None}
    return found


def _assigned_names(stmt: cst.CSTNode) -> set[str]:
    """Names a simple assignment statement binds unconditionally."""
    if isinstance(stmt, cst.SimpleStatementLine):
        found: set[str] = set()
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    found |= _target_names(target.target)
            elif isinstance(small, cst.AnnAssign) and small.value is not None:
                found |= _target_names(small.target)
        return found
    return set()


def _statement_position(ancestors: Sequence[cst.CSTNode]) -> tuple[int, cst.CSTNode, int] | None:
    """(index in ancestors of the innermost simple statement, its block, its index in the block)."""
    for i in range(len(ancestors) - 1, 0, -1):
        node = ancestors[i]
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(node, cst.SimpleStatementLine):
            block = ancestors[i - 1]
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                return None
            for index, stmt in enumerate(block.body):
                if stmt is node:
                    return i, block, index
            return None
    return None


def _owner(ancestors: Sequence[cst.CSTNode], stmt_index: int) -> cst.BaseCompoundStatement | None:
    block = ancestors[stmt_index - 1]
    if isinstance(block, cst.Module):
        return None
    for node in reversed(ancestors[:stmt_index - 1]):
        if isinstance(node, cst.BaseCompoundStatement):
            return node
    return None


def _read_later(ancestors: Sequence[cst.CSTNode], names: set[str], skip_ids: set[int]) -> bool:
    """Is one of `names` read after the statement at the end of `ancestors` (in its function), before an
    unconditional reassignment? Loops around the statement count their whole body as 'after'."""
    alive = set(names)
    for i in range(len(ancestors) - 1, 0, -1):
        node, parent = ancestors[i], ancestors[i - 1]
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return False
        if isinstance(node, (cst.For, cst.While)):
            for stmt in _iter_nodes(node.body):
                if id(stmt) in skip_ids:
                    continue
                if isinstance(stmt, cst.SimpleStatementLine) and _names_read(stmt) & alive:
                    return True
        if isinstance(parent, (cst.IndentedBlock, cst.Module)) and isinstance(node, cst.BaseStatement):
            after = False
            for stmt in parent.body:
                if stmt is node:
                    after = True
                    continue
                if not after or id(stmt) in skip_ids:
                    continue
                if _names_read(stmt) & alive:
                    return True
                alive -= _assigned_names(stmt)
                if not alive:
                    return False
    return False


def _rebuild_block(block: cst.CSTNode, consumed: set[int], final_index: int, anchor: cst.CSTNode,
                   call: cst.Call) -> cst.CSTNode:
    """Drop the consumed statements (their own-line comments move to the next kept statement; a trailing
    comment describes the deleted statement and goes with it) and put `call` in place of `anchor`."""
    body = []
    pending: list[cst.EmptyLine] | None = None
    for index, stmt in enumerate(block.body):  # type: ignore[attr-defined]
        if index in consumed:
            if pending is None:  # the first removed statement keeps its blank lines, the others their comments
                pending = list(stmt.leading_lines)
            else:
                pending.extend(line for line in stmt.leading_lines if line.comment is not None)
            continue
        if index == final_index:
            stmt = stmt.deep_replace(anchor, call)
        if pending is not None:
            lines = _collapse_blank_lines([*pending, *stmt.leading_lines])
            if not body:  # nothing left above it in the block: no blank line at the top
                while lines and lines[0].comment is None:
                    lines.pop(0)
            stmt = stmt.with_changes(leading_lines=lines)
            pending = None
        body.append(stmt)
    return block.with_changes(body=body)  # type: ignore[attr-defined]


def _collapse_blank_lines(lines: list[cst.EmptyLine]) -> list[cst.EmptyLine]:
    kept: list[cst.EmptyLine] = []
    for line in lines:
        if line.comment is None and kept and kept[-1].comment is None:
            continue
        kept.append(line)
    return kept


def _invert_mask(mask: cst.BaseExpression) -> cst.BaseExpression:
    """`m == x` -> `m != x`, `~m` -> `m`, `m.logical_not()` -> `m`, else `~m`."""
    if isinstance(mask, cst.Comparison) and len(mask.comparisons) == 1:
        target = mask.comparisons[0]
        flipped = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(target.operator))
        if flipped is not None:
            op = target.operator
            new_op = flipped(whitespace_before=op.whitespace_before, whitespace_after=op.whitespace_after)
            return mask.with_changes(comparisons=[target.with_changes(operator=new_op)])
    if isinstance(mask, cst.UnaryOperation) and isinstance(mask.operator, cst.BitInvert) and not mask.lpar:
        return mask.expression
    if isinstance(mask, cst.Call) and method_name(mask) == "logical_not" and not mask.args:
        return mask.func.value  # type: ignore[attr-defined]
    return cst.UnaryOperation(operator=cst.BitInvert(), expression=_parens_if_needed(mask))


def _tests_not_none(test: cst.BaseExpression, mask: cst.BaseExpression) -> bool:
    """`if m is not None: s = s + m`: passing `attn_mask=m` already means 'no mask' when m is None."""
    return isinstance(test, cst.Comparison) and isinstance(test.comparisons[0].operator, cst.IsNot) \
        and isinstance(test.comparisons[0].comparator, cst.Name) and test.comparisons[0].comparator.value == "None" \
        and dotted_name(test.left) is not None and dotted_name(test.left) == dotted_name(mask)


def _parens_if_needed(node: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)) or node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _strip_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if node.lpar else node


def _join(parts: list[cst.BaseExpression], op: cst.BaseBinaryOp) -> cst.BaseExpression:
    result = _parens_if_needed(parts[0])
    for part in parts[1:]:
        result = cst.BinaryOperation(left=result, operator=op, right=_parens_if_needed(part))
    return result


def _reciprocal(node: cst.BaseExpression) -> cst.BaseExpression:
    right = node
    if not (isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)) or node.lpar
            or (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power))):
        right = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BinaryOperation(left=cst.Integer("1"), operator=cst.Divide(), right=right)


def _arg(value: cst.BaseExpression, keyword: str | None = None) -> cst.Arg:
    if keyword is None:
        return cst.Arg(value=value)
    return cst.Arg(value=value, keyword=cst.Name(keyword),
                   equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def _with_commas(args: list[cst.Arg]) -> list[cst.Arg]:
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [a.with_changes(comma=comma) for a in args[:-1]] + args[-1:]


def _problem_note(problems: list[str]) -> str:
    unique = list(dict.fromkeys(problems))
    return "no automatic rewrite: " + "; ".join(unique) if unique else "no automatic rewrite"


# ---------------------------------------------------------------------------------------------------------
# scale: is it a Python number (SDPA's `scale` is a float), and is it the default 1/sqrt(head_dim)?


class _FloatLike:
    """Python-number evidence for an expression; tensors, parameters and unknown names are not."""

    def __init__(self, rule: ManualAttention) -> None:
        self.ctx = rule.ctx

    def check(self, node: cst.BaseExpression, depth: int = 0, in_class: bool = False) -> bool:
        if depth > 6:
            return False
        if isinstance(node, (cst.Integer, cst.Float)):
            return True
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            return self.check(node.expression, depth + 1, in_class)
        if isinstance(node, cst.BinaryOperation) and isinstance(
                node.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Power)):
            return self.check(node.left, depth + 1, in_class) and self.check(node.right, depth + 1, in_class)
        if isinstance(node, cst.BooleanOperation):
            return self.check(node.left, depth + 1, in_class) and self.check(node.right, depth + 1, in_class)
        if isinstance(node, cst.IfExp):
            return self.check(node.body, depth + 1, in_class) and self.check(node.orelse, depth + 1, in_class)
        if isinstance(node, cst.Call):
            qual = self.ctx.qualname(node.func) or ""
            if qual.startswith("math.") or qual in ("numpy.sqrt", "numpy.power"):
                return True
            if isinstance(node.func, cst.Name) and node.func.value in ("float", "int", "len") and not qual:
                return True
            if method_name(node) in ("size", "dim", "numel") and node.args:
                return True
            return False
        if isinstance(node, cst.Subscript):
            return isinstance(node.value, cst.Attribute) and node.value.attr.value == "shape" or (
                isinstance(node.value, cst.Call) and method_name(node.value) == "size")
        if isinstance(node, cst.Name):
            if in_class:
                return node.value not in ("None",)
            bindings = self.ctx.analysis.bindings_of(node.value, self.ctx.ancestors)
            if not bindings:
                return False
            return all(b.kind is BindingKind.ASSIGN and b.value is not None and self.check(b.value, depth + 1)
                       for b in bindings)
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
            info = self.ctx.analysis.enclosing_class(self.ctx.ancestors)
            bindings = info.attrs.get(node.attr.value, []) if info else []
            if not bindings:
                return False
            return all(b.kind is BindingKind.ASSIGN and b.value is not None
                       and self.check(b.value, depth + 1, in_class=True) for b in bindings)
        return False


def _is_default_scale(step: _Step, t: _Trace, rule: ManualAttention) -> bool:
    """Is the scale exactly SDPA's default `1 / sqrt(q.size(-1))`?"""
    ctx = rule.ctx
    node = step.node
    if step.op == "div":
        return _is_sqrt_of_head_dim(ctx, node, t)
    # mul: `1 / sqrt(d)`, `1.0 / math.sqrt(d)`, `d ** -0.5`
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
        one = node.left
        if isinstance(one, (cst.Integer, cst.Float)) and float(one.evaluated_value) == 1.0:
            return _is_sqrt_of_head_dim(ctx, node.right, t)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power):
        exponent = node.right
        if isinstance(exponent, cst.UnaryOperation) and isinstance(exponent.operator, cst.Minus) \
                and isinstance(exponent.expression, cst.Float) and float(exponent.expression.evaluated_value) == 0.5:
            return _is_head_dim(ctx, node.left, t)
    return False


def _is_sqrt_of_head_dim(ctx, node: cst.BaseExpression, t: _Trace) -> bool:
    if isinstance(node, cst.Call) and ctx.qualname(node.func) in ("math.sqrt", "numpy.sqrt") and len(node.args) == 1:
        return _is_head_dim(ctx, node.args[0].value, t)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power) \
            and isinstance(node.right, cst.Float) and float(node.right.evaluated_value) == 0.5:
        return _is_head_dim(ctx, node.left, t)
    return False


def _is_head_dim(ctx, node: cst.BaseExpression, t: _Trace, depth: int = 0) -> bool:
    """`q.size(-1)`, `k.shape[-1]` (of this q or k), or a local name assigned once from one of them."""
    if depth > 2:
        return False
    if isinstance(node, cst.Name):
        bindings = ctx.analysis.bindings_of(node.value, ctx.ancestors)
        return len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN and bindings[0].value is not None \
            and _is_head_dim(ctx, bindings[0].value, t, depth + 1)
    receiver = None
    if isinstance(node, cst.Call) and method_name(node) == "size" and len(node.args) == 1 \
            and _int_literal(node.args[0].value) == -1:
        receiver = node.func.value  # type: ignore[attr-defined]
    elif isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute) \
            and node.value.attr.value == "shape" and len(node.slice) == 1 \
            and isinstance(node.slice[0].slice, cst.Index) and _int_literal(node.slice[0].slice.value) == -1:
        receiver = node.value.value
    if receiver is None:
        return False
    code = ctx.code(receiver)
    return code in (ctx.code(t.q), ctx.code(t.k))


# ---------------------------------------------------------------------------------------------------------
# do the attention weights leave the function? (SDPA cannot return them: no rewrite is possible there)

# methods that store their argument in the receiver (a list, a dict, a queue, ...)
_STORING_METHODS = {"append", "extend", "insert", "add", "appendleft", "extendleft", "update", "setdefault",
                    "put", "put_nowait", "__setitem__"}
# methods that give a view, copy or reduction of their receiver: the result still holds the weights
_CARRYING_METHODS = {"detach", "cpu", "clone", "float", "half", "double", "to", "numpy", "tolist", "mean",
                     "sum", "max", "view", "reshape", "permute", "transpose", "squeeze", "unsqueeze",
                     "contiguous", "flatten", "unbind", "chunk", "split", "cuda"}
_CONTAINER_CALLS = {"dict", "tuple", "list", "set"}


def _carries(node: cst.BaseExpression, carriers: set[str]) -> bool:
    """Does the value of `node` hold (a view, copy or container of) one of `carriers`?"""
    if isinstance(node, cst.Name):
        return node.value in carriers
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        return any(_carries(e.value, carriers) for e in node.elements)
    if isinstance(node, cst.Dict):
        return any(isinstance(e, cst.StarredDictElement) and _carries(e.value, carriers)
                   or isinstance(e, cst.DictElement) and _carries(e.value, carriers) for e in node.elements)
    if isinstance(node, cst.IfExp):
        return _carries(node.body, carriers) or _carries(node.orelse, carriers)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add) and any(
            isinstance(side, (cst.Tuple, cst.List)) for side in (node.left, node.right)):
        return _carries(node.left, carriers) or _carries(node.right, carriers)  # `outputs + (weights,)`
    if isinstance(node, cst.Subscript):
        return _carries(node.value, carriers)
    if isinstance(node, (cst.StarredElement,)):
        return _carries(node.value, carriers)
    if isinstance(node, cst.Call):
        name = method_name(node)
        if isinstance(node.func, cst.Attribute) and name in _CARRYING_METHODS:
            return _carries(node.func.value, carriers)
        func = dotted_name(node.func) or ""
        last = func.rsplit(".", 1)[-1]
        # a container, or a record built with the weights (`Output(hidden, attentions=w)`)
        if last in _CONTAINER_CALLS or last[:1].isupper():
            return any(_carries(a.value, carriers) for a in node.args)
        return any(a.keyword is not None and _carries(a.value, carriers) for a in node.args)
    return False


def _scope_nodes(roots: Sequence[cst.CSTNode]) -> Iterator[cst.CSTNode]:
    """The nodes under `roots`, not those of functions and classes nested in them."""
    stack: list[cst.CSTNode] = [root.body if isinstance(root, cst.FunctionDef) else root for root in roots]
    while stack:
        current = stack.pop()
        if isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        yield current
        stack.extend(child_nodes(current))


_RETURNED_NOTE = ("no fix: the function returns the attention weights, which SDPA cannot give; where callers drop "
                  "them or only visualise them, return the output alone and call `F.scaled_dot_product_attention`")


def _always_returned(function: cst.FunctionDef, weights: set[str]) -> bool:
    """Does the function end, unconditionally, in `return output, weights` (a tuple naming the weights)?"""
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
    last = body[-1] if body else None
    if not isinstance(last, cst.SimpleStatementLine):
        return False
    returned = last.body[-1]
    return isinstance(returned, cst.Return) and isinstance(returned.value, cst.Tuple) and any(
        isinstance(e.value, cst.Name) and e.value.value in weights for e in returned.value.elements)


def _statement_of_chain(block: cst.CSTNode, trace: "_Trace", anchor: cst.BaseExpression) -> cst.CSTNode:
    """Where the attention starts (its scores' statement), as people point at it."""
    return block.body[min(trace.consumed)] if trace.consumed else anchor  # type: ignore[attr-defined]


def _weights_escape(roots: Sequence[cst.CSTNode], weights: set[str], params: set[str], returns: bool = True) -> bool:
    """Are the names in `weights` (or a container, view or alias of them) returned or yielded (when `returns`),
    stored on an object, in a container that escapes, or appended to a list anywhere under `roots`? `params`
    (the function's parameters) are containers owned by the caller."""
    if not weights:
        return False
    carriers = set(weights)
    nodes = list(_scope_nodes(roots))
    for _ in range(8):  # aliases and containers of the weights, to a fixed point
        before = len(carriers)
        for node in nodes:
            if returns and isinstance(node, (cst.Return, cst.Yield)) and node.value is not None:
                value = node.value.item if isinstance(node.value, cst.From) else node.value
                if _carries(value, carriers):
                    return True
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                    and method_name(node) in _STORING_METHODS and any(_carries(a.value, carriers) for a in node.args):
                return True
            if isinstance(node, cst.Call) and dotted_name(node.func) == "setattr" and len(node.args) == 3 \
                    and _carries(node.args[2].value, carriers):
                return True
            targets: list[cst.BaseExpression] = []
            if isinstance(node, cst.Assign):
                if _carries(node.value, carriers):
                    targets = [t.target for t in node.targets]
            elif isinstance(node, (cst.AnnAssign, cst.AugAssign)) and node.value is not None:
                if _carries(node.value, carriers):
                    targets = [node.target]
            for target in _flat_targets(targets):
                if isinstance(target, cst.Name):
                    carriers.add(target.value)
                    continue
                if isinstance(target, cst.Subscript):  # `d[key] = w`: d holds the weights
                    base = target.value
                    if isinstance(base, cst.Name) and base.value not in params:
                        carriers.add(base.value)
                        continue
                return True  # `self.attn = w`, `obj.maps[i] = w`, `param[k] = w`
        if len(carriers) == before:
            return False
    return False


def _flat_targets(targets: list[cst.BaseExpression]) -> Iterator[cst.BaseExpression]:
    for target in targets:
        if isinstance(target, (cst.Tuple, cst.List)):
            yield from _flat_targets([e.value for e in target.elements])
        elif isinstance(target, cst.StarredElement):
            yield from _flat_targets([target.value])
        else:
            yield target
