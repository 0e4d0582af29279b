from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.semantic.masks import hot_mask_assignment, mask_rewrite

_FP16_MAX = 65504.0
_BF16_MAX = 3.3895e38  # also above float32's max: every float dtype's masked_fill_ raises, setitem may write inf
_LOW_PRECISION = re.compile(r"float16|\bhalf\b|\.half\(|bfloat16|autocast|GradScaler|\bfp16\b|\bbf16\b|amp\.")
_SMALL_FINFO = ("torch.float16", "torch.half")


class BoolMaskAssignScalar(Rule):
    """
    ## What it does
    Finds `x[mask] = <scalar literal>` in the training step, the forward pass or compiled code, and rewrites it
    to the in-place `x.masked_fill_(mask, <scalar>)`, with the mask reshaped to broadcast over `x`'s trailing
    dimensions.

    ## Why is this slow
    In eager mode it is not: ATen already turns a boolean-index assignment of a Python scalar into
    `masked_fill_` (no host sync, CUDA-graph capturable; checked on an H200 with torch 2.11). Under `torch.compile` the traced graph keeps
    `aten.index_put`, which made `mode="reduce-overhead"` skip CUDA graphs for the whole graph before
    torch 2.10 (pytorch #169951). `masked_fill_` states the intent and never depends on that lowering.

    ## Example
    ```python
    blocked = tokens == pad_id
    scores[blocked] = float("-inf")
    ```

    ## Use instead
    ```python
    blocked = tokens == pad_id
    scores.masked_fill_(blocked.reshape(blocked.shape + (1,) * (scores.dim() - blocked.dim())), float("-inf"))
    ```
    (The reshape is left out when the mask is a comparison of `scores` itself, e.g. `x[x < 0] = 0`.)

    A compound mask that has to be reshaped is bound to a name first (`mask = a == 0`, then
    `x.masked_fill_(mask.reshape(...), v)`), so it is evaluated once. `x[~legal] = v`, whose mask is known
    only by its name, is rewritten under a dtype guard:
    ```python
    if legal.dtype == torch.bool:
        not_legal = ~legal
        logits.masked_fill_(not_legal.reshape(not_legal.shape + (1,) * (logits.dim() - not_legal.dim())), v)
    else:
        logits[~legal] = v
    ```

    ## Fix safety
    Safe when the receiver is a tensor: `masked_fill_` is in place like the original, so views of `x` see the
    change, and values, gradients and integer truncation are identical. A mask that comes from a comparison,
    `isnan`, `logical_*` or `&`/`|`/`~` of those is boolean by construction and needs no guard; a mask known only
    by its name gets the dtype guard, which runs the original statement for anything but a bool tensor (an
    integer index). A reshape makes a row mask select rows, not columns. Not fixed: literals above the float16
    range when the program uses float16/autocast (`x[m] = -1e9` writes `-inf` silently, `masked_fill_` raises),
    receivers not known to be tensors, and statements that share their line (`if c: x[a == 0] = v`) when the
    rewrite needs a second statement. Masks known only by their name are not reported (`x[mask]` may hold
    integer indices), except `x[~name] = v`.
    """

    code = "GPU003"
    name = "bool-mask-assign-scalar"
    message = "Boolean-mask assignment of a scalar; `masked_fill_` is the capture-safe spelling"
    fix_title = "Rewrite as in-place `masked_fill_`"
    severity = Severity.INFO
    safety = Safety.SAFE
    priority = "P2"
    triggers = ("] =", "]=")
    examples = [
        Valid(  # already masked_fill
            """
            import torch
            class Attn(torch.nn.Module):
                def forward(self, scores, pad):
                    return scores.masked_fill(pad == 0, float("-inf")).softmax(-1)
            """
        ),
        Valid(  # probabilities read back to the CPU (`.cpu()`) and masked there: the nonzero runs on the host
            """
            import torch
            class COMA:
                def get_action_prob(self, batch, epsilon):
                    avail_actions = batch["avail_u"]
                    action_prob = []
                    for t in range(batch["o"].shape[1]):
                        action_prob.append(torch.softmax(self.eval_rnn(batch["o"][:, t].cuda()), dim=-1))
                    action_prob = torch.stack(action_prob, dim=1).cpu()
                    action_num = avail_actions.sum(dim=-1, keepdim=True).float()
                    action_prob = (1 - epsilon) * action_prob + torch.ones_like(action_prob) * epsilon / action_num
                    action_prob[avail_actions == 0] = 0.0
                    return action_prob.cuda()
                def train(self, batch, steps):
                    for _ in range(steps):
                        loss = -self.get_action_prob(batch, 0.1).log().mean()
                        self.optimizer.zero_grad()
                        loss.backward()
                        self.optimizer.step()
            """
        ),
        Valid(  # NumPy array in an RL loop
            """
            import numpy as np
            returns = np.zeros(8)
            for update in range(100):
                returns[returns < 0] = 0.0
                loss = agent.loss(returns)
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            class Head(torch.nn.Module):
                def forward(self, x):
                    logits = self.proj(x)
                    logits = logits.float()
                    logits[logits < -10] = -10.0
                    return logits
            """,
            fixed="""
            import torch
            class Head(torch.nn.Module):
                def forward(self, x):
                    logits = self.proj(x)
                    logits = logits.float()
                    logits.masked_fill_(logits < -10, -10.0)
                    return logits
            """,
        ),
        Invalid(
            """
            import torch
            class Attn(torch.nn.Module):
                def forward(self, q, k, pad):
                    scores = torch.matmul(q, k.transpose(-2, -1))
                    blocked = pad == 0
                    scores[:, blocked] = float("-inf")
                    return scores.softmax(-1)
            """,
            fixed="""
            import torch
            class Attn(torch.nn.Module):
                def forward(self, q, k, pad):
                    scores = torch.matmul(q, k.transpose(-2, -1))
                    blocked = pad == 0
                    scores.masked_fill_(blocked.reshape(blocked.shape + (1,) * (scores.dim() - 1 - blocked.dim())), float("-inf"))
                    return scores.softmax(-1)
            """,
        ),
        Invalid(  # a compound mask is bound to a name first; a name-only mask gets a dtype guard
            """
            import torch
            class Policy(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = torch.nn.Linear(16, 42)

                def forward(self, x, board, legal):
                    logits = self.head(x)
                    logits[board != 0] = float("-inf")
                    logits[~legal] = float("-inf")
                    return logits
            """,
            fixed="""
            import torch
            class Policy(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.head = torch.nn.Linear(16, 42)

                def forward(self, x, board, legal):
                    logits = self.head(x)
                    mask = board != 0
                    logits.masked_fill_(mask.reshape(mask.shape + (1,) * (logits.dim() - mask.dim())), float("-inf"))
                    if legal.dtype == torch.bool:
                        not_legal = ~legal
                        logits.masked_fill_(not_legal.reshape(not_legal.shape + (1,) * (logits.dim() - not_legal.dim())), float("-inf"))
                    else:
                        logits[~legal] = float("-inf")
                    return logits
            """,
            count=2,
        ),
        Invalid(  # -1e9 overflows float16: reported, not rewritten
            """
            import torch
            class Attn(torch.nn.Module):
                def forward(self, scores, pad):
                    scores = scores.half()
                    scores[pad == 0] = -1e9
                    return scores
            """
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ", "ALIAS", "CG"),
        setup=("x = torch.randn(4, 6, 5, requires_grad=True)\n"
               "row = torch.rand(4, 6) > 0.5\n"
               "a = torch.randint(0, 3, (4, 6))\n"
               "legal = torch.rand(4, 6) > 0.3\n"
               "idx = torch.tensor([0, 2])\n"
               "base = (x * 2).detach().clone()\n"
               "view = base[1:]"),
        before=("y = x * 2\n"
                "y[row] = float('-inf')\n"
                "y[y > 1.5] = 1.5\n"
                "y[a == 0] = 2.0\n"
                "y[~legal] = -1.0\n"
                "y[~idx] = 0.5\n"
                "view[view < 0] = 0.0\n"
                "out = y.exp()"),
        after=("y = x * 2\n"
               "y.masked_fill_(row.reshape(row.shape + (1,) * (y.dim() - row.dim())), float('-inf'))\n"
               "y.masked_fill_(y > 1.5, 1.5)\n"
               "mask = a == 0\n"
               "y.masked_fill_(mask.reshape(mask.shape + (1,) * (y.dim() - mask.dim())), 2.0)\n"
               "if legal.dtype == torch.bool:\n"
               "    not_legal = ~legal\n"
               "    y.masked_fill_(not_legal.reshape(not_legal.shape + (1,) * (y.dim() - not_legal.dim())), -1.0)\n"
               "else:\n"
               "    y[~legal] = -1.0\n"
               "if idx.dtype == torch.bool:\n"
               "    not_idx = ~idx\n"
               "    y.masked_fill_(not_idx.reshape(not_idx.shape + (1,) * (y.dim() - not_idx.dim())), 0.5)\n"
               "else:\n"
               "    y[~idx] = 0.5\n"
               "view.masked_fill_(view < 0, 0.0)\n"
               "out = y.exp()"),
        compare=("out", "base", "x.grad"),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._low_precision: bool | None = None

    def visit_Assign(self, node: cst.Assign) -> None:
        if not self.ctx.evidence.is_scalar_literal(node.value):
            return
        site = hot_mask_assignment(self.ctx, node)
        if site is None:
            return
        replacement, imports = None, ()
        note = self._overflow(node.value)
        if note is None:
            receiver, value = self.ctx.code(site.receiver), self.ctx.code(node.value)
            replacement, note, imports = mask_rewrite(self.ctx, node, site, "masked_fill_",
                                                      lambda mask: f"{receiver}.masked_fill_({mask}, {value})")
        self.report(node, replacement=replacement, note=note, imports=imports)

    def _overflow(self, value: cst.BaseExpression) -> str | None:
        magnitude = self.ctx.evidence.scalar_magnitude(value)
        if magnitude is not None:
            size = abs(magnitude)
            if size != float("inf") and size > _BF16_MAX:
                return "the value overflows every reduced-precision float: setitem writes inf, masked_fill_ raises"
            if size != float("inf") and size > _FP16_MAX and self._uses_low_precision():
                return ("the value overflows float16 (max 65504): `x[m] = v` writes -inf/inf silently while "
                        "`masked_fill_` raises; use `torch.finfo(x.dtype).min`")
            return None
        # torch.finfo(<dtype>).min/max: fine for the receiver's own dtype or the narrowest float
        finfo = value.value if isinstance(value, cst.Attribute) else None
        if isinstance(finfo, cst.Call) and finfo.args:
            arg = finfo.args[0].value
            if isinstance(arg, cst.Attribute) and arg.attr.value == "dtype":
                return None
            if self.ctx.qualname(arg) in _SMALL_FINFO or not self._uses_low_precision():
                return None
            return "`torch.finfo` of a wider dtype than the tensor may overflow it; use `torch.finfo(x.dtype)`"
        return None

    def _uses_low_precision(self) -> bool:
        if self._low_precision is None:
            self._low_precision = bool(self.ctx.program.search(_LOW_PRECISION))
        return self._low_precision
