import re

import libcst as cst

from gpulint import HotKind, Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg, dotted_name, method_name, walk
from gpulint.program import mentions, related_texts
from gpulint.semantic.modules import module_like
from gpulint.semantic.precision import autocast_call_of, autocast_dtype

_STEP_KINDS = (HotKind.STEP_LOOP, HotKind.STEP_FUNCTION)
# a scaler, or a framework that scales the loss itself, anywhere in the program
_SCALING = re.compile(r"GradScaler|\.scale\(|loss_scale|LossScaler|\bapex\b|deepspeed|\baccelerate\b|Accelerator\(|"
                      r"lightning|\bFabric\(|manual_backward|\bprecision\s*=")
_FRAMEWORK_BACKWARD = re.compile(r"accelerator|fabric|engine|trainer|strategy", re.I)


class Fp16WithoutGradscaler(Rule):
    """
    ## What it does
    Finds fp16 mixed-precision training without loss scaling: an `autocast` region with
    `dtype=torch.float16` (or the fp16 default of `torch.autocast("cuda")` / `torch.cuda.amp.autocast()`)
    in a training loop or step function that calls `.backward()`, when no `GradScaler` (nor Accelerate,
    Lightning, DeepSpeed or apex, which scale the loss themselves) appears anywhere in the program (of the
    files named on the command line: those the training file imports or is imported by, and the library
    modules of its folder; see GPU020). Also a model converted with `.half()` before the training loop of the same function.

    ## Why is this slow
    It is a correctness problem: fp16 has a 5-bit exponent, so small gradients flush to zero (AMP docs:
    "Gradient values with small magnitudes may not be representable in float16 ... flush to zero"), and the
    model silently trains worse or not at all. Loss scaling multiplies the loss before backward and
    unscales the gradients before the optimizer step, skipping steps that overflow.

    ## Example
    ```python
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```
    or, on Ampere and newer GPUs, `dtype=torch.bfloat16`, which needs no scaler. For a `.half()` model,
    keep fp32 weights and use autocast instead.

    ## Fix safety
    No automatic fix: adding a scaler touches the backward, the optimizer step and the checkpoint, and
    switching to bf16 depends on the GPU.
    """

    code = "GPU025"
    name = "fp16-without-gradscaler"
    message = "fp16 autocast training without a GradScaler: small gradients underflow to zero"
    severity = Severity.WARNING
    safety = Safety.SUGGEST
    priority = "P2"
    triggers = ("autocast", ".half(")
    examples = [
        Valid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """
        ),
        Valid(  # bf16 needs no scaler
            """
            import torch
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # inference only
            """
            import torch
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
                for x in loader:
                    preds.append(model(x))
            """
        ),
        Invalid(
            """
            import torch
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model(x)
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            from torch.cuda.amp import autocast
            def train_step(model, batch, optimizer):
                with autocast():
                    loss = model(**batch).loss
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            import torchvision
            model = torchvision.models.resnet18().cuda()
            model.half()
            for x, y in loader:
                loss = model(x.half()).float().mean()
                loss.backward()
                optimizer.step()
            """
        ),
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._candidates: list[tuple[cst.CSTNode, cst.CSTNode]] = []  # (report node, training region)
        self._halves: list[tuple[cst.Call, cst.CSTNode | None, int]] = []

    def visit_With(self, node: cst.With) -> None:
        if self.ctx.hot_kind() not in _STEP_KINDS:
            return
        region = next((n for n in reversed(self.ctx.ancestors) if self.ctx.analysis.hot.get(id(n)) in _STEP_KINDS),
                      None)
        for item in node.items:
            call = autocast_call_of(item.item, self.ctx)
            if call is None or autocast_dtype(call, self.ctx) != "fp16":
                continue
            enabled = call_arg(call, "enabled", 0 if (self.ctx.qualname(call.func) or "").startswith("torch.cuda")
                               else 2)
            if enabled is not None and isinstance(enabled.value, cst.Name) and enabled.value.value == "False":
                continue
            self._candidates.append((item.item, region))

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) == "half" and not node.args and isinstance(node.func, cst.Attribute) \
                and module_like(node.func.value, self.ctx):
            self._halves.append((node, self.ctx.enclosing(cst.FunctionDef),
                                 self.ctx.analysis.statement_order(self.ctx.ancestors)))

    def finish(self) -> None:
        if not self._candidates and not self._halves:
            return
        texts = related_texts(self.ctx)
        if any(mentions(_SCALING, text) for text in texts.values()):
            return
        reported: set[int] = set()
        for node, region in self._candidates:
            if region is not None and id(region) not in reported and _plain_backward(region):
                reported.add(id(region))
                self.report(node)
        if any("autocast" in text for text in texts.values()):
            return  # `.half()` with autocast is GPU023's finding
        for call, function, order in self._halves:
            scope = function.body if function is not None else self.ctx.module
            if any(self.ctx.analysis.hot.get(id(n)) is HotKind.STEP_LOOP and self.ctx.analysis.order.get(id(n), 0)
                   > order and _plain_backward(n) for n in walk(scope)):
                self.report(call, "Training a `.half()` model without loss scaling or fp32 master weights: "
                                  "small gradients underflow and updates are lost; keep fp32 weights under autocast")


def _plain_backward(region: cst.CSTNode) -> bool:
    """Does the region call `loss.backward()` itself (not a framework's `accelerator.backward(loss)`)?"""
    for node in walk(region):
        if isinstance(node, cst.Call) and method_name(node) == "backward" and isinstance(node.func, cst.Attribute):
            receiver = dotted_name(node.func.value) or ""
            if not _FRAMEWORK_BACKWARD.search(receiver) and not any(a.keyword is None for a in node.args):
                return True
    return False
