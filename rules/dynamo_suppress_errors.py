from __future__ import annotations

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg, string_value

_FLAG = "torch._dynamo.config.suppress_errors"
_ENV = "TORCHDYNAMO_SUPPRESS_ERRORS"
_FALSY_STRINGS = ("", "0", "false", "False", "FALSE")


class DynamoSuppressErrors(Rule):
    """
    ## What it does
    Finds `torch._dynamo.config.suppress_errors = True`, `torch._dynamo.config.patch(suppress_errors=True)`
    and the environment variable `TORCHDYNAMO_SUPPRESS_ERRORS` set to a true value from Python.

    ## Why is this slow
    With it, a compiled region that fails to compile silently runs eagerly: the speed-up of `torch.compile` is
    gone without any error. torch's own comment on the flag (`torch/_dynamo/config.py`): "Suppress errors in
    torch._dynamo.optimize, instead forcing a fallback to eager ... you may lose optimization opportunities
    this way. Devs, if your benchmark model is failing this way, you should figure out why instead of
    suppressing it." The default is `False`.

    ## Example
    ```python
    import torch._dynamo
    torch._dynamo.config.suppress_errors = True
    model = torch.compile(model)
    ```

    ## Use instead
    ```python
    model = torch.compile(model)  # let compile errors surface; fix them or disable compile explicitly
    ```

    ## Fix safety
    Suggestion only: removing the flag turns a silent eager fallback into an exception for code that does not
    compile, so the change needs a person to look at why compilation fails.
    """

    code = "GPU040"
    name = "dynamo-suppress-errors"
    message = "`suppress_errors` makes failing torch.compile regions fall back to eager silently"
    severity = Severity.WARNING
    safety = Safety.SUGGEST
    priority = "P2"
    triggers = ("suppress_errors", _ENV)
    examples = [
        Valid(
            """
            import torch
            torch._dynamo.config.suppress_errors = False
            model = torch.compile(model)
            """
        ),
        Valid(
            """
            import os
            os.environ["TORCHDYNAMO_SUPPRESS_ERRORS"] = "0"
            """
        ),
        Invalid(
            """
            import torch._dynamo
            torch._dynamo.config.suppress_errors = True
            """
        ),
        Invalid(
            """
            import os
            os.environ.setdefault("TORCHDYNAMO_SUPPRESS_ERRORS", "1")
            """
        ),
    ]

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            expr = target.target
            if self.ctx.qualname(expr) == _FLAG and _truthy(node.value):
                self.report(node)
            elif self._env_key(expr) and _truthy_env(node.value):
                self.report(node)

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual == "torch._dynamo.config.patch":
            flag = call_arg(node, "suppress_errors")
            if flag is not None and _truthy(flag.value):
                self.report(node)
            elif len(node.args) >= 2 and string_value(node.args[0].value) == "suppress_errors" \
                    and _truthy(node.args[1].value):
                self.report(node)
            return
        if qual in ("os.environ.setdefault", "os.putenv") and len(node.args) >= 2 \
                and string_value(node.args[0].value) == _ENV and _truthy_env(node.args[1].value):
            self.report(node)

    def _env_key(self, expr: cst.BaseExpression) -> bool:
        """`os.environ["TORCHDYNAMO_SUPPRESS_ERRORS"]`."""
        return isinstance(expr, cst.Subscript) and self.ctx.qualname(expr.value) == "os.environ" \
            and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index) \
            and string_value(expr.slice[0].slice.value) == _ENV


def _truthy(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.Name):
        return value.value == "True"
    if isinstance(value, cst.Integer):
        return value.value not in ("0",)
    return False


def _truthy_env(value: cst.BaseExpression) -> bool:
    text = string_value(value)
    return text is not None and text.strip() not in _FALSY_STRINGS
