from __future__ import annotations

import libcst as cst

from gpulint import HotKind, Invalid, Rule, Severity, Valid
from gpulint.analysis import BindingKind, dotted_name, method_name, walk
from gpulint.semantic.masks import numpy_in_file, tensor_verdict
from gpulint.semantic.placement import Placement, after_init_once_guard, amortised

# Python-bool tests that are tensor-valued by construction when their receiver is a tensor.
_TENSOR_TESTS = {"any", "all", "isnan", "isinf", "isfinite", "eq", "ne", "gt", "ge", "lt", "le", "logical_and",
                 "logical_or", "logical_not", "bool", "sum", "mean", "max", "min", "amax", "amin", "count_nonzero"}
_REDUCTIONS = {"sum", "mean", "max", "min", "amax", "amin", "norm", "std", "var"}
_TORCH_TESTS = {"torch.any", "torch.all", "torch.isnan", "torch.isinf", "torch.isfinite", "torch.logical_and",
                "torch.logical_or", "torch.logical_not", "torch.count_nonzero", "torch.eq", "torch.ne", "torch.gt",
                "torch.ge", "torch.lt", "torch.le", "torch.isin"}


class TensorPythonBranch(Rule):
    """
    ## What it does
    Finds Python control flow on tensor values in the training step, the forward pass or compiled code:
    `if (x > 0).any():`, `while err.max() > tol:`, `assert torch.isfinite(loss).all()`, `a if t > 0 else b`,
    and `and` / `or` / `not` on tensors. Tests on metadata (`.shape`, `.size()`, `.dim()`, `.numel()`,
    `.dtype`, `.device`, `.requires_grad`, `self.training`), `is None`, `isinstance` and Python numbers are
    not reported.

    ## Why is this slow
    Python needs a `bool`, so the tensor is copied to the host: the CPU waits for every queued kernel before
    it can choose a branch (one sync per evaluation). Under `torch.compile` a data-dependent branch is a graph
    break (`generic_jump TensorVariable()`; with `fullgraph=True` an error), and it prevents CUDA-graph capture.

    ## Example
    ```python
    def forward(self, x):
        if torch.isnan(x).any():
            x = torch.nan_to_num(x)
        return self.net(x)
    ```

    ## Use instead
    Compute both outcomes and select on the device, or assert asynchronously:
    ```python
    def forward(self, x):
        x = torch.nan_to_num(x)          # a no-op where there is no NaN
        return self.net(x)

    torch._assert_async(torch.isfinite(loss).all())   # instead of `assert torch.isfinite(loss).all()`
    y = torch.where(t > 0, a, b)                       # instead of `a if t > 0 else b`
    ```
    `torch.cond(pred, true_fn, false_fn)` keeps a real branch inside a compiled graph.

    ## Fix safety
    No automatic fix: the replacement computes both branches (cost, side effects) or changes when an error is
    raised.
    """

    code = "GPU006"
    name = "tensor-python-branch"
    message = "Python branch on a tensor value syncs the host (and breaks the graph under torch.compile)"
    severity = Severity.INFO
    priority = "P2"
    triggers = ("if ", "while ", "assert ", " and ", " or ", "not ")
    examples = [
        Valid(  # metadata, None checks and the training flag are static
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x, mask=None):
                    if x.dim() == 3 and x.size(0) > 1 and mask is not None:
                        x = x.flatten(1)
                    if self.training and x.shape[-1] > 4:
                        x = x * 2
                    return x
            """
        ),
        Valid(  # Python numbers after .item()
            """
            for batch in loader:
                loss = model(batch).mean()
                loss.backward()
                optimizer.step()
                value = loss.item()
                if value > 10:
                    print("diverging")
            """
        ),
        Valid(  # random draws from factories without `device=` live on the CPU: reading them is no GPU sync
            """
            import torch
            class RandomFlip(torch.nn.Module):
                def __init__(self, p=0.5):
                    super().__init__()
                    self.p = p
                def forward(self, x):
                    if torch.rand(1) < self.p:
                        x = x.flip(-1)
                    if torch.rand(()) <= 0.5 and torch.empty(1).uniform_(0.0, 1.0)[0] > self.p:
                        x = -x
                    return x
            """
        ),
        Valid(  # a latch: once the test succeeds, `or` never evaluates it again
            """
            import torch
            use_queue = False
            for x in loader:
                out = model(x.cuda())
                if use_queue or not torch.all(queue[-1] == 0):
                    use_queue = True
                    out = torch.cat((queue @ prototypes, out))
                out.sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # inside an `if step % N == 0:` block: runs once every N steps
            """
            import torch
            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda()).mean()
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    if torch.isnan(loss):
                        print("nan at", step)
            """
        ),
        Valid(  # early-exit inference: reading the test decides whether the next layer runs at all
            """
            import torch
            class PatienceNet(torch.nn.Module):
                def forward(self, x):
                    previous, patience = None, 0
                    for i, layer in enumerate(self.layers):
                        x = layer(x)
                        logits = self.heads[i](x)
                        if previous is not None and torch.all(logits.argmax(1).eq(previous.argmax(1))):
                            patience += 1
                        previous = logits
                        if patience == 3:
                            break
                    return previous
            """
        ),
        Valid(  # a test's assertion is its purpose
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    return x * 2
            def test_forward_is_finite():
                for x in loader:
                    y = Net()(x)
                    y.sum().backward()
                    assert not torch.isnan(y).any()
            """
        ),
        Invalid(  # a KL estimate from a network proven by its `.parameters()`, tested in Python every minibatch
            """
            import torch
            class Learner:
                def __init__(self, net, kl_limit):
                    self.net = net.cuda()
                    self.opt = torch.optim.Adam(self.net.parameters())
                    self.kl_limit = kl_limit
                def update(self, minibatches):
                    for obs, act, old_logp, adv in minibatches:
                        out = self.net(obs, act)
                        kl = (old_logp - out["logp"]).mean()
                        loss = -(torch.exp(out["logp"] - old_logp) * adv).mean()
                        if kl <= 1.5 * self.kl_limit:
                            self.opt.zero_grad()
                            loss.backward()
                            self.opt.step()
            """
        ),
        Invalid(  # a pixel-range check on the encoder's input, in every forward
            """
            import torch
            import torch.nn as nn
            class PixelEncoder(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(9, 32, 3, stride=2)
                def forward(self, obs):
                    if obs.max() > 1.:  # error: GPU006
                        obs = obs / 255.
                    return self.conv(obs)
            """
        ),
        Invalid(  # a token count kept on the device (`+=` of a GPU sum), tested for the learning-rate warmup
            """
            import torch
            class Trainer:
                def __init__(self, model, config):
                    self.model = model.cuda()
                    self.config = config
                    self.tokens = 0
                def train(self, loader, optimizer):
                    for x, y in loader:
                        x, y = x.cuda(), y.cuda()
                        logits, loss = self.model(x, y)
                        loss.backward()
                        optimizer.step()
                        self.tokens += (y >= 0).sum()
                        if self.tokens < self.config.warmup_tokens:  # error: GPU006
                            lr_mult = float(self.tokens) / max(1, self.config.warmup_tokens)
            """
        ),
        Invalid(  # the same draw made on the device is read back every call
            """
            import torch
            class RandomFlip(torch.nn.Module):
                def forward(self, x):
                    if torch.rand(1, device=x.device) < 0.5:
                        x = x.flip(-1)
                    return x
            """
        ),
        Invalid(
            """
            import torch
            class Net(torch.nn.Module):
                def forward(self, x):
                    if torch.isnan(x).any():
                        x = torch.nan_to_num(x)
                    return x
            """
        ),
        Invalid(
            """
            import torch
            @torch.compile
            def step(x, t):
                y = torch.sigmoid(x)
                assert (y >= 0).all()
                return y if (t > 0).any() else -y
            """,
            count=2,
        ),
    ]

    def visit_If(self, node: cst.If) -> None:
        self._test(node.test)

    def visit_While(self, node: cst.While) -> None:
        self._test(node.test)

    def visit_Assert(self, node: cst.Assert) -> None:
        self._test(node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._test(node.test)

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        # operands of `and`/`or` in a test position are judged through _test; the value of `a or b`
        # elsewhere calls bool(a) (and maybe bool(b)) as well
        parent = self.ctx.parent()
        if isinstance(parent, (cst.If, cst.While, cst.Assert, cst.IfExp, cst.BooleanOperation)) or (
                isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)):
            return
        self._test(node, value_position=True)

    def _test(self, test: cst.BaseExpression, value_position: bool = False) -> None:
        if not self.ctx.in_hot_region() or amortised(self.ctx) or self.ctx.in_test_code() \
                or self._in_early_exit_loop() or after_init_once_guard(self.ctx) or self._latched(test):
            return
        operands = _operands(test)
        if value_position and not _negated_last(test):
            operands = operands[:-1]  # `x = a and b`: the last operand is returned, not converted to bool
        placement = Placement(self.ctx)
        for operand in operands:
            if self._tensor_valued(operand) and not placement.host_only(operand):
                kind = self.ctx.hot_kind()
                severity = Severity.WARNING if self.ctx.is_compiled() or kind is HotKind.COMPILED else Severity.INFO
                self.report(operand, severity=severity)

    def _latched(self, test: cst.BaseExpression) -> bool:
        """`if seen or tensor_test: seen = True`: once the test succeeds, `or` never evaluates it again."""
        statement = self.ctx.ancestors[-1]  # the `if` being visited
        if not isinstance(statement, cst.If) or statement.test is not test or not isinstance(
                test, cst.BooleanOperation) or not isinstance(test.operator, cst.Or) \
                or not isinstance(test.left, cst.Name):
            return False
        return any(isinstance(n, cst.Assign) and isinstance(n.value, cst.Name) and n.value.value == "True"
                   and any(dotted_name(t.target) == test.left.value for t in n.targets)
                   for n in walk(statement.body))

    def _in_early_exit_loop(self) -> bool:
        """Inside a loop that runs layers and may stop early (`break`/`return`), as early-exit inference does
        (PABEE: stop once successive layers agree): the host must read the tensor to decide whether to run the
        next layer, and a branch-free rewrite would run every layer, losing the point."""
        for node in reversed(self.ctx.ancestors[:-1]):
            if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if isinstance(node, (cst.For, cst.While)):
                inside = list(walk(node.body))
                return any(isinstance(n, (cst.Break, cst.Return)) for n in inside) and any(
                    isinstance(n, cst.Call) and _calls_a_layer(n) for n in inside)
        return False

    def _tensor_valued(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Call):
            if isinstance(node.func, cst.Name) and node.func.value == "bool" and len(node.args) == 1:
                return self._tensor_valued(node.args[0].value)
            qual = self.ctx.qualname(node.func) or ""
            if qual in _TORCH_TESTS:
                return True
            name = method_name(node)
            if name in _TENSOR_TESTS and isinstance(node.func, cst.Attribute):
                receiver = node.func.value
                verdict = tensor_verdict(self.ctx, receiver)
                if verdict is True:
                    return True
                if verdict is None and name in ("any", "all") and self._lenient():
                    return True  # `mask.any()` in forward: tensors are the norm there
                return False
            return False
        if isinstance(node, cst.Comparison):
            if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in node.comparisons):
                return False
            verdict = tensor_verdict(self.ctx, node)
            # `if obs.max() > 1.:` in a forward: a reduction of an input compared in Python (tensors are the norm)
            return verdict is True or verdict is None and self._lenient() and any(
                isinstance(side, cst.Call) and method_name(side) in _REDUCTIONS and isinstance(side.func, cst.Attribute)
                and tensor_verdict(self.ctx, side.func.value) is None
                for side in (node.left, *(c.comparator for c in node.comparisons)))
        if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)):
            return tensor_verdict(self.ctx, node) is True and self._bool_of_tensor_is_meant(node)
        return False

    def _lenient(self) -> bool:
        return self.ctx.hot_kind() in (HotKind.FORWARD, HotKind.COMPILED) and not numpy_in_file(self.ctx)

    def _bool_of_tensor_is_meant(self, node: cst.BaseExpression) -> bool:
        """`if t:` on a tensor name: only for names assigned once from a tensor test (`bad = x.isnan().any()`)."""
        if not isinstance(node, cst.Name):
            return False
        bindings = self.ctx.analysis.reaching_bindings(node.value, self.ctx.ancestors)
        if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN or bindings[0].value is None:
            return False
        value = bindings[0].value
        return not isinstance(value, (cst.Name, cst.Attribute, cst.Subscript)) and self._tensor_valued(value)


def _calls_a_layer(call: cst.Call) -> bool:
    """`self.encoder(h)`, `self.layers[i](h)`, `heads[i](h)`: a submodule call (a method of self counts too)."""
    func = call.func
    if isinstance(func, cst.Subscript):
        return True
    while isinstance(func, (cst.Attribute, cst.Subscript)):
        func = func.value
    return isinstance(func, cst.Name) and func.value == "self"


def _operands(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The expressions Python calls bool() on: operands of and/or, the operand of not."""
    if isinstance(test, cst.BooleanOperation):
        return _operands(test.left) + _operands(test.right)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _operands(test.expression)
    return [test]


def _negated_last(test: cst.BaseExpression) -> bool:
    """Is the last operand of an and/or chain under `not` (then it is converted to bool too)?"""
    while isinstance(test, cst.BooleanOperation):
        test = test.right
    return isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
