from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import child_nodes, dotted_name, method_name, string_value, walk
from gpulint.semantic.accumulation import Accumulation, Accumulations
from gpulint.semantic.loaders import LoaderFlow

_MEAN_LOSSES = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss",
                "multilabel_soft_margin_loss", "multi_margin_loss", "cosine_embedding_loss",
                "margin_ranking_loss", "hinge_embedding_loss", "poisson_nll_loss", "gaussian_nll_loss",
                "triplet_margin_loss", "ctc_loss"}
_CRITERION_NAME = re.compile(r"^(criterion|crit|loss_fn|loss_func|lossfn|loss_function|loss_fct|loss_fcn)$")
_MANAGED_BACKWARD = re.compile(r"(^|\.)(accelerator|fabric|engine|model_engine|trainer|manual_backward)$")
_SUM_REDUCTION = re.compile(r"""reduction\s*=\s*['"]sum['"]|size_average\s*=\s*False""")


class GradAccumLossNotNormalized(Rule):
    """
    ## What it does
    Finds gradient accumulation (`backward()` on every micro-step, the optimizer step once every N
    micro-steps) where the loss that is backpropagated is a mean-reduced loss that is not divided by N.

    ## Why is this slow
    Gradients add up over the N micro-steps, so with mean losses the accumulated gradient is N times the
    gradient of one large batch: the effective learning rate is N times larger (and gradient-clipping
    thresholds and Adam's `eps` act on N-times larger values). The run then needs a different learning rate
    than the large-batch run it is supposed to reproduce, or diverges.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
        loss = F.cross_entropy(model(x), y) / accum_steps
    ```
    With equal micro-batch sizes, the accumulated gradient then equals the large-batch gradient.

    ## Fix safety
    No automatic fix: dividing changes the effective learning rate, which a tuned recipe may already
    account for. The rule only fires when the loss is visibly mean-reduced (a `torch.nn.functional` loss or an
    `nn.*Loss` criterion with the default reduction, `.mean()`, a model output's `.loss`), no division or
    scaling of the loss or of the gradients is in sight, and no `reduction="sum"` is used in the file. It
    leaves accumulation managed by Accelerate, Lightning or DeepSpeed alone (they normalise).
    """

    code = "GPU062"
    name = "grad-accum-loss-not-normalized"
    message = ("Gradient accumulation backpropagates a mean loss that is not divided by the number of "
               "micro-steps{steps}; the accumulated gradient is that many times a large-batch gradient")
    severity = Severity.WARNING
    safety = Safety.SUGGEST
    priority = "P2"
    triggers = ("backward",)
    examples = [
        Valid(
            """
            import torch.nn.functional as F
            for i, (x, y) in enumerate(loader):
                loss = F.cross_entropy(model(x), y) / accum_steps
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
        Valid(  # summed on purpose
            """
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss(reduction="sum")
            for i, (x, y) in enumerate(loader):
                loss = criterion(model(x), y)
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
        Invalid(
            """
            import torch.nn.functional as F
            for i, (x, y) in enumerate(loader):
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                if (i + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        source = self.ctx.program.sources.get(self.ctx.path) or node.code
        if ".step(" not in source or _SUM_REDUCTION.search(source):
            return
        for accumulation in Accumulations.of(self.ctx.analysis).items:
            if _grads_rescaled(accumulation):
                continue
            for call in accumulation.backward_calls:
                loss = self._loss_of(call)
                if loss is None or self._normalized(loss, accumulation, top=True):
                    continue
                if not self._mean(loss, accumulation):
                    continue
                steps = accumulation.steps
                text = f" (`{self.ctx.code(steps).strip()}`)" if steps is not None else ""
                self.report(call, self.message.format(steps=text))

    # -- the backpropagated expression ------------------------------------------------------------

    def _loss_of(self, call: cst.Call) -> cst.BaseExpression | None:
        assert isinstance(call.func, cst.Attribute)
        receiver = call.func.value
        dotted = dotted_name(receiver) or ""
        if _MANAGED_BACKWARD.search(dotted) or self.ctx.analysis.qualname(receiver) is not None:
            return None  # accelerator.backward(loss), torch.autograd.backward(...): managed / not a loss
        if any(a.keyword is None or a.keyword.value in ("gradient", "inputs") for a in call.args):
            return None  # loss.backward(grad): an explicit upstream gradient
        if isinstance(receiver, cst.Call) and method_name(receiver) == "scale" and receiver.args:
            return receiver.args[0].value  # scaler.scale(loss).backward()
        return receiver

    def _assignments(self, name: str, accumulation: Accumulation) -> list[cst.CSTNode]:
        """Assignments and augmented assignments to `name` inside the accumulation region."""
        found: list[cst.CSTNode] = []
        stack: list[cst.CSTNode] = [accumulation.region]
        while stack:
            node = stack.pop()
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                continue
            if isinstance(node, cst.Assign):
                if any(_binds(t.target, name) for t in node.targets):
                    found.append(node)
            elif isinstance(node, cst.AnnAssign) and node.value is not None and _binds(node.target, name):
                found.append(node)
            elif isinstance(node, cst.AugAssign) and _binds(node.target, name):
                found.append(node)
            stack.extend(child_nodes(node))
        return found

    def _normalized(self, expr: cst.BaseExpression | None, accumulation: Accumulation, top: bool,
                    depth: int = 0) -> bool:
        """A division anywhere, or a scaling of the whole loss, on the way to backward()."""
        if expr is None or depth > 4:
            return True  # unknown: stay quiet
        if any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Divide, cst.FloorDivide))
               or isinstance(n, cst.Call) and method_name(n) in ("div", "div_", "true_divide")
               for n in walk(expr, into_functions=True)):
            return True
        if top and isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply):
            return True
        if top and isinstance(expr, cst.Call) and method_name(expr) in ("mul", "mul_"):
            return True
        if isinstance(expr, cst.Name):
            for node in self._assignments(expr.value, accumulation):
                if isinstance(node, cst.AugAssign):
                    if isinstance(node.operator, (cst.DivideAssign, cst.MultiplyAssign, cst.FloorDivideAssign)):
                        return True
                    continue
                value = node.value
                if value is not None and self._normalized(_element_for(node, expr.value), accumulation, True,
                                                          depth + 1):
                    return True
        return False

    def _mean(self, expr: cst.BaseExpression | None, accumulation: Accumulation, depth: int = 0) -> bool:
        """Visibly a mean-reduced loss (all terms of a sum, too)."""
        if expr is None or depth > 4:
            return False
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Subtract)):
            return self._mean(expr.left, accumulation, depth + 1) and self._mean(expr.right, accumulation, depth + 1)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply):
            # a weighted term: `0.5 * mse`
            left, right = expr.left, expr.right
            if isinstance(left, (cst.Integer, cst.Float)):
                return self._mean(right, accumulation, depth + 1)
            if isinstance(right, (cst.Integer, cst.Float)):
                return self._mean(left, accumulation, depth + 1)
            return False
        if isinstance(expr, cst.Attribute) and expr.attr.value == "loss":
            return True  # Hugging Face model outputs: mean over tokens
        if isinstance(expr, cst.Call):
            name = method_name(expr)
            if name == "mean" and not expr.args:
                return True
            qual = self.ctx.analysis.call_qualname(expr) or ""
            if qual.startswith("torch.nn.functional.") and qual.rsplit(".", 1)[-1] in _MEAN_LOSSES:
                return _default_reduction(expr)
            func = expr.func
            if isinstance(func, cst.Name) and _CRITERION_NAME.match(func.value):
                return True
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self" \
                    and _CRITERION_NAME.match(func.attr.value):
                return True
            if isinstance(func, cst.Name):
                assignments = self.ctx.analysis.bindings_of(func.value, LoaderFlow.of(self.ctx.analysis).ancestors(expr))
                values = [b.value for b in assignments if b.value is not None]
                if values and all(_is_mean_criterion(self.ctx, v) for v in values):
                    return True
            return False
        if isinstance(expr, cst.Name):
            assignments = self._assignments(expr.value, accumulation)
            if not assignments:
                return False
            return all(not isinstance(a, cst.AugAssign) and self._mean(_element_for(a, expr.value), accumulation,
                                                                         depth + 1) for a in assignments)
        return False


def _binds(target: cst.BaseExpression, name: str) -> bool:
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_binds(e.value, name) for e in target.elements)
    return False


def _element_for(node: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """The value assigned to `name` by `node` (None when it comes out of a tuple we cannot split)."""
    if isinstance(node, cst.AnnAssign):
        return node.value
    assert isinstance(node, cst.Assign)
    for target in node.targets:
        if isinstance(target.target, cst.Name) and target.target.value == name:
            return node.value
        if isinstance(target.target, (cst.Tuple, cst.List)) and isinstance(node.value, (cst.Tuple, cst.List)):
            for element, value in zip(target.target.elements, node.value.elements):
                if isinstance(element.value, cst.Name) and element.value.value == name:
                    return value.value
    return None


def _default_reduction(call: cst.Call) -> bool:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "reduction":
            return string_value(arg.value) == "mean"
        if arg.keyword is not None and arg.keyword.value in ("size_average", "reduce"):
            return False
    return True


def _is_mean_criterion(ctx, value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        return False
    qual = ctx.analysis.call_qualname(value) or ""
    return qual.startswith("torch.nn.") and qual.endswith("Loss") and _default_reduction(value)


def _grads_rescaled(accumulation: Accumulation) -> bool:
    """`p.grad /= n`, `p.grad.div_(n)` in the region: the gradients are normalised after the fact."""
    for node in walk(accumulation.region, into_functions=True):
        if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Attribute) and \
                node.target.attr.value == "grad":
            return True
        if isinstance(node, cst.Call) and method_name(node) in ("div_", "mul_") and \
                isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Attribute) and \
                node.func.value.attr.value == "grad":
            return True
    return False
