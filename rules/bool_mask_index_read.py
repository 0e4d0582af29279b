from __future__ import annotations

import re

import libcst as cst

from gpulint import Confidence, Invalid, Rule, Severity, Valid
from gpulint.analysis import dotted_name, method_name
from gpulint.rule import RuleContext
from gpulint.semantic.masks import (
    consumed_as_tensor,
    mask_confidence,
    mask_index_layout,
    mask_site_evidence,
    same_code,
    tensor_verdict,
)
from gpulint.semantic.placement import Placement, after_init_once_guard, amortised

# ---------------------------------------------------------------------------------------------
# Helpers shared by the bool-mask rules (GPU001-GPU003) and the tensor-branch / dynamic-shape rules
# (GPU006, GPU007). Candidates to move into gpulint.analysis.


# -- tensor evidence --------------------------------------------------------------------------


# -- small syntax helpers -----------------------------------------------------------------------


_NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad")
_EVAL_CLASS = re.compile(r"post_?process|evaluat|metric|predictor", re.I)


def under_no_grad(ctx: RuleContext) -> bool:
    """Evaluation / post-processing code: a `with torch.no_grad()` block, a function decorated with
    `@torch.no_grad()` / `@torch.inference_mode()`, or a method of a `PostProcess*` / `*Evaluator` / `*Metric`
    class (detection post-processing needs data-dependent shapes by design)."""
    if ctx.inside_with(*_NO_GRAD):
        return True
    for node in reversed(ctx.ancestors):
        if isinstance(node, cst.FunctionDef):
            for decorator in node.decorators:
                target = decorator.decorator
                target = target.func if isinstance(target, cst.Call) else target
                if ctx.qualname(target) in _NO_GRAD:
                    return True
        if isinstance(node, cst.ClassDef) and _EVAL_CLASS.search(node.name.value):
            return True
    return False


# ---------------------------------------------------------------------------------------------

_SINK_METHODS = {"item", "tolist", "numpy", "cpu"}
_LOG_CALL = re.compile(r"(^|\.)(print|log|info|debug|warning|add_scalar|add_scalars|add_histogram|set_postfix)$")


class BoolMaskIndexRead(Rule):
    """
    ## What it does
    Finds boolean-mask reads `x[mask]` (and `x[mask] += v`, `torch.masked_select(x, mask)`) in the training
    step, the forward pass or compiled code, where `mask` is a comparison, `isnan`/`logical_*` result or a
    tensor named like a mask.

    ## Why is this slow
    The size of `x[mask]` depends on the data, so the GPU must report how many elements are selected before
    the host can allocate the result: one host synchronization per read (measured on an H100 with
    `torch.cuda.set_sync_debug_mode`). Under `torch.compile` the dynamic shape is a graph break
    ("Dynamic shape operator") and CUDA-graph capture of the region fails.

    ## Example
    ```python
    def forward(self, x, labels):
        valid = labels != -100
        return self.loss(x[valid], labels[valid])
    ```

    ## Use instead
    Keep the full shape and mask arithmetically:
    ```python
    x[m].sum()      ->  x.masked_fill(~m, 0).sum()
    x[m].mean(0)    ->  (x * w).sum(0) / w.sum(0).clamp_min(1)   # w = m[:, None].to(x.dtype)
    x[m].max()      ->  x.masked_fill(~m, float("-inf")).max()
    loss(x[m], y[m])  ->  loss(x, y.masked_fill(~m, ignore_index))   # losses with ignore_index
    ```

    ## Fix safety
    No automatic fix: masked reductions return 0 instead of `nan` for an empty mask, and fp32 sums in a
    different order (differences around 1e-8).
    """

    code = "GPU001"
    name = "bool-mask-index-read"
    message = "Boolean-mask read `x[mask]` has a data-dependent shape: one host sync and a graph break per call"
    severity = Severity.WARNING
    priority = "P1"
    triggers = ("[",)
    examples = [
        Valid(  # read once every 500 steps, for logging: not the step's cost
            """
            import torch

            def train(model, loader, optimizer, writer):
                for step, (x, y) in enumerate(loader):
                    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
                    logits = model(x)
                    loss = torch.nn.functional.cross_entropy(logits, y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    if step % 500 == 0:
                        hard = y != logits.argmax(-1)
                        hard_logits = logits[hard]
                        writer.add_scalar("hard_mean", hard_logits.mean(), step)
            """
        ),
        Valid(  # masked arithmetic keeps the shape static
            """
            import torch
            class Head(torch.nn.Module):
                def forward(self, x, m):
                    return x.masked_fill(~(m > 0), 0).sum()
            """
        ),
        Valid(  # post-processing reached only from the `else:` of `if self.training:` (inference)
            """
            import torch
            class Segmenter(torch.nn.Module):
                def forward(self, x, targets=None):
                    logits = self.head(x)
                    if self.training:
                        return torch.nn.functional.cross_entropy(logits, targets)
                    else:
                        return self.postprocess(logits)
                def postprocess(self, logits):
                    scores, labels = logits.softmax(-1).max(-1)
                    keep = scores > 0.8
                    return scores[keep], labels[keep]
            """
        ),
        Valid(  # lazy initialisation below `if self.initted: return`: runs once per training run
            """
            import torch
            class Codebook(torch.nn.Module):
                def init_embed_(self, data, mask):
                    if self.initted:
                        return
                    data = data[mask > 0]
                    self.embed.data.copy_(data[:4])
                    self.initted.data.copy_(torch.tensor(True))
                def forward(self, x, mask):
                    self.init_embed_(x, mask)
                    return x @ self.embed.t()
            """
        ),
        Valid(  # a mask made on the CPU, and a selection of host data copied to the GPU afterwards
            """
            import torch
            class Quantizer(torch.nn.Module):
                def forward(self, x, codes, targets, keep):
                    dropped = torch.randn(x.shape[0]).argsort() < keep
                    kept = x[dropped]
                    labels = targets.view(-1)[targets.view(-1) > 0].long().cuda()
                    return kept, labels
            """
        ),
        Valid(  # NumPy rollout buffer in an RL update loop
            """
            import numpy as np
            rewards = np.zeros(128)
            for epoch in range(10):
                rewards[rewards > 1] = 1
                adv = rewards[rewards > 0]
                loss = policy(obs).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # outside the hot path
            """
            import torch
            def summarize(x):
                return x[x > 0].mean()
            """
        ),
        Invalid(
            """
            import torch
            class Head(torch.nn.Module):
                def forward(self, x):
                    return x[x > 0].sum()
            """
        ),
        Valid(  # named a mask, but the caller passes integer indexes (`idx_train`): an index gather, no sync
            """
            import torch
            def train_iter(model, optimizer, criterion, features, target, mask_train):
                output = model(features)
                loss = criterion(output[mask_train], target[mask_train])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            def main(model, optimizer, criterion, features, labels, epochs):
                idx = torch.randperm(len(labels)).cuda()
                idx_train = idx[1600:]
                for epoch in range(epochs):
                    train_iter(model, optimizer, criterion, features.cuda(), labels.cuda(), idx_train)
            """
        ),
        Invalid(  # a padding mask kept in the minibatch dict, read in every PPO update
            """
            import torch
            def update(model, optimizer, minibatches):
                for samples in minibatches:
                    policy, value = model(samples["obs"].cuda())
                    actions = samples["actions"].cuda()
                    log_probs = torch.stack([b.log_prob(actions[:, i]) for i, b in enumerate(policy)], dim=1)
                    log_probs = log_probs[samples["loss_mask"]]  # error: GPU001
                    loss = -(log_probs * samples["advantages"].cuda()).mean() + value.pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """
        ),
        Invalid(  # a product of two comparisons is a mask; `l, u = ...` binds tensors (`.floor()`, `.ceil()`)
            """
            import torch
            class Agent:
                def __init__(self, net):
                    self.online_net = net.cuda()
                    self.optimiser = torch.optim.Adam(self.online_net.parameters())
                def learn(self, returns):
                    b = (returns.clamp(-10, 10) + 10) / 0.5
                    l, u = b.floor().to(torch.int64), b.ceil().to(torch.int64)
                    l[(u > 0) * (l == u)] -= 1
                    loss = (self.online_net(b) * l.float()).mean()
                    self.optimiser.zero_grad()
                    loss.backward()
                    self.optimiser.step()
            for t in range(1000):
                if t % 4 == 0:
                    agent.learn(returns)
            """
        ),
        Invalid(
            """
            import torch.nn.functional as F
            for data in loader:
                out = model(data)
                loss = F.nll_loss(out[data.train_mask], data.y[data.train_mask])
                loss.backward()
                optimizer.step()
            """,
            count=2,
        ),
    ]

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if not self.ctx.in_hot_region() or self._is_store(node) or after_init_once_guard(self.ctx) \
                or amortised(self.ctx):
            return
        self._check(node, node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Subscript) and self.ctx.in_hot_region() and not amortised(self.ctx):
            self._check(node.target, node.target)

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.masked_select" or len(node.args) < 2:
            return
        if not self.ctx.in_hot_region() or amortised(self.ctx):
            return
        mask = node.args[1].value
        confidence = mask_confidence(self.ctx, mask) or (
            Confidence.HIGH if tensor_verdict(self.ctx, mask) else None)
        if confidence is None:
            return
        if mask_site_evidence(self.ctx, node.args[0].value, mask) is None or Placement(self.ctx).built_on_host(mask):
            return
        if self._sink(node):
            return
        self.report(node, "`torch.masked_select` has a data-dependent shape: one host sync and a graph break "
                          "per call", severity=self._severity())

    def _check(self, subscript: cst.Subscript, report_node: cst.CSTNode) -> None:
        layout = mask_index_layout(subscript)
        if layout is None:
            return
        confidence = mask_confidence(self.ctx, layout.mask)
        if confidence is None:
            return
        if mask_site_evidence(self.ctx, subscript.value, layout.mask,
                              consumed_as_tensor(self.ctx, subscript)) is None:
            return
        if Placement(self.ctx).built_on_host(layout.mask):
            return  # a mask made on the CPU is resolved on the CPU: no GPU sync (measured on an H200)
        if self._sink(subscript) or self._gpu002_value(subscript):
            return
        self.report(report_node, severity=self._severity())

    def _severity(self) -> Severity:
        return Severity.INFO if under_no_grad(self.ctx) else Severity.WARNING

    def _is_store(self, node: cst.Subscript) -> bool:
        """Assignment / del / for targets (augmented assignment is handled as a read)."""
        child: cst.CSTNode = node
        for parent in reversed(self.ctx.ancestors[:-1]):
            if isinstance(parent, cst.AugAssign):
                return parent.target is child
            if isinstance(parent, (cst.AssignTarget, cst.Del)):
                return True
            if isinstance(parent, (cst.For, cst.CompFor)):
                return parent.target is child
            if isinstance(parent, cst.AnnAssign):
                return parent.target is child
            if not isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
                return False
            child = parent
        return False

    def _sink(self, node: cst.CSTNode) -> bool:
        """The selection only feeds `.item()` / `.tolist()` / `.cpu()` / logging: a sync GPU005 reports."""
        child = node
        for parent in reversed(self.ctx.ancestors[:-1]):
            if isinstance(parent, cst.Attribute) and parent.value is child:
                child = parent
                continue
            if isinstance(parent, cst.Call) and parent.func is child:
                if method_name(parent) in _SINK_METHODS or method_name(parent) == "cuda":
                    return True  # `.cuda()` on the selection: the code selects host data, then copies it
                child = parent
                continue
            if isinstance(parent, cst.Arg):
                child = parent
                continue
            if isinstance(parent, cst.Call) and child in parent.args:
                name = dotted_name(parent.func) or ""
                if (self.ctx.qualname(parent.func) or "").startswith(("torch.", "numpy.", "math.")):
                    return False  # torch.log(x[m]) is math, not logging
                return bool(_LOG_CALL.search(name)) or name in ("float", "int", "bool")
            if isinstance(parent, (cst.FormattedStringExpression,)):
                return True
            return False
        return False

    def _gpu002_value(self, node: cst.Subscript) -> bool:
        """`x[m] = y[m]`: the read is part of the assignment GPU002 rewrites; report it once, there."""
        parent = self.ctx.parent()
        if not isinstance(parent, cst.Assign) or parent.value is not node or len(parent.targets) != 1:
            return False
        target = parent.targets[0].target
        if not isinstance(target, cst.Subscript):
            return False
        mine, theirs = mask_index_layout(node), mask_index_layout(target)
        return mine is not None and theirs is not None and mine.leading == theirs.leading and \
            mine.ellipsis == theirs.ellipsis and same_code(self.ctx, mine.mask, theirs.mask)
