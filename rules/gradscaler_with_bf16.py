import re

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import BindingKind, call_arg, dotted_name, is_true, method_name, walk
from gpulint.program import related_texts
from gpulint.semantic.precision import autocast_call_of, autocast_dtype

_STEP_KINDS = (HotKind.STEP_LOOP, HotKind.STEP_FUNCTION)
# fp16 anywhere in the program (mixed fp16/bf16 code paths): then the scaler may be needed
_FP16_TEXT = re.compile(r"(?<![bB])float16|\.half\(|\btorch\.half\b|\bfp16\b|['\"]16-mixed['\"]")
_BF16_AUTOCAST_TEXT = re.compile(r"autocast\([^)]*bfloat16")
_SCALER_KEEP = {"state_dict", "load_state_dict"}  # uses of the scaler outside the loop that stay valid


class GradscalerWithBf16(Rule):
    """
    ## What it does
    Finds a `GradScaler` whose `scaler.scale(loss)` is backpropagated in a training loop whose forward runs
    under `autocast(..., dtype=torch.bfloat16)`: in the same loop (inside or before the `with` region), or,
    when the loop has no autocast of its own, a bf16 autocast set up in another file of the program (of the
    files named on the command line: those the training file imports or is imported by, and the library
    modules of its folder; see GPU020). It does not fire when the dtype is a variable (config-driven fp16/bf16), when fp16 appears
    anywhere in the program (mixed code paths), or when the scaler is constructed with an `enabled=` that
    is not literally `True` (nanoGPT's `enabled=(dtype == "float16")` is the right pattern). The finding
    is reported at the `scaler.scale(...)` call of the training loop, where the fix applies.

    ## Why is this slow
    bf16 has fp32's exponent range, so gradients do not underflow and loss scaling does nothing useful
    (the AMP docs pair GradScaler with float16 only). The scaler still multiplies the loss, unscales every
    gradient, checks them for inf/NaN and reads the result on the host: one device-to-host sync per step
    (`GradScaler._maybe_opt_step` calls `.item()`, unless the optimizer is fused). Measured on an H100,
    a small model step: 1686 us with the scaler vs 1420 us without (1.19x).

    ## Example
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    ```

    ## Use instead
    ```python
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).loss
    loss.backward()
    optimizer.step()
    ```

    ## Fix safety
    Unsafe: `scaler.scale(loss)` becomes `loss`, `scaler.step(opt)` becomes `opt.step()`, and
    `scaler.update()` / `scaler.unscale_(opt)` statements are removed (`clip_grad_norm_` stays). The
    behaviour changes when a gradient is inf/NaN: GradScaler skips that optimizer step, plain
    `opt.step()` takes it. When nothing overflows, the parameters are bitwise equal (power-of-two
    scaling is exact; verified on CPU over 20 AdamW steps). The scaler object is kept (checkpoints may
    save its state). No fix when the scaler is used in the loop in any other way (`get_scale()`, ...).
    """

    code = "GPU024"
    name = "gradscaler-with-bf16"
    message = "GradScaler with bf16 autocast: loss scaling is not needed and costs a host sync per step"
    fix_title = "Remove the GradScaler calls from the training step"
    severity = Severity.INFO
    safety = Safety.UNSAFE
    priority = "P2"
    triggers = (".scale(",)
    examples = [
        Valid(  # fp16: the scaler is needed
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
        Valid(  # config-driven dtype, scaler enabled only for fp16
            """
            import torch
            ptdtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
            scaler = torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))
            for x, y in loader:
                with torch.autocast("cuda", dtype=ptdtype):
                    loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """
        ),
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x, y)
                scaler.scale(loss / accum).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            """,
            fixed="""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x, y)
                (loss / accum).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            """,
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ", "SYNC"),
        setup=("model = torch.nn.Linear(64, 64)\n"
               "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\nx = torch.randn(32, 64)"),
        before=("scaler = torch.amp.GradScaler(device)\nfor _ in range(20):\n"
                "    opt.zero_grad()\n    with torch.autocast(device, dtype=torch.bfloat16):\n"
                "        loss = model(x).square().mean()\n    scaler.scale(loss).backward()\n"
                "    scaler.step(opt)\n    scaler.update()\n"
                "w, b = model.weight.detach().clone(), model.bias.detach().clone()"),
        after=("for _ in range(20):\n    opt.zero_grad()\n    with torch.autocast(device, dtype=torch.bfloat16):\n"
               "        loss = model(x).square().mean()\n    loss.backward()\n    opt.step()\n"
               "w, b = model.weight.detach().clone(), model.bias.detach().clone()"),
        compare=("w", "b"),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._done: set[tuple[int, str]] = set()
        # program-wide text facts, searched once per file rather than once per `scaler.scale()` call
        self._texts: dict[str, str] | None = None
        self._fp16: bool | None = None
        self._bf16_elsewhere: tuple[str, int] | None | bool = False  # False: not searched yet
        self._bf16_here: int | None | bool = False

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) != "scale" or len(node.args) != 1 or node.args[0].keyword is not None:
            return
        assert isinstance(node.func, cst.Attribute)
        scaler = dotted_name(node.func.value)
        if scaler is None or self.ctx.hot_kind() not in _STEP_KINDS:
            return
        region = self._region()
        if region is None or (id(region), scaler) in self._done:
            return
        construction = self._construction(node.func.value)
        if construction is None or not self._enabled_always(construction):
            return
        bf16_where = self._bf16_evidence(node, region)
        if bf16_where is None:
            return
        self._done.add((id(region), scaler))
        new_region = _remove_scaler(region, scaler, self.ctx)
        note = None if bf16_where == "here" else f"bf16 autocast is set up in {bf16_where}"
        if new_region is None:
            self.report(node, note=note)
        else:
            self.report(node, replacements=[(region, new_region)], note=note)

    def _region(self) -> cst.CSTNode | None:
        for node in reversed(self.ctx.ancestors):
            if self.ctx.analysis.hot.get(id(node)) in _STEP_KINDS:
                return node
        return None

    def _construction(self, receiver: cst.BaseExpression) -> cst.Call | None:
        """The `GradScaler(...)` call the receiver was (only ever) bound to."""
        analysis = self.ctx.analysis
        if isinstance(receiver, cst.Name):
            bindings = analysis.bindings_of(receiver.value, self.ctx.ancestors)
        elif isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name) \
                and receiver.value.value == "self":
            info = analysis.enclosing_class(self.ctx.ancestors)
            bindings = info.attrs.get(receiver.attr.value, []) if info else []
        else:
            return None
        if len(bindings) != 1 or bindings[0].kind is not BindingKind.ASSIGN:
            return None
        value = bindings[0].value
        if isinstance(value, cst.Call) and (self.ctx.qualname(value.func) or dotted_name(value.func) or "").endswith(
                "GradScaler"):
            return value
        return None

    def _enabled_always(self, construction: cst.Call) -> bool:
        qual = self.ctx.qualname(construction.func) or ""
        old = qual.startswith(("torch.cuda.amp", "torch.cpu.amp"))
        enabled = call_arg(construction, "enabled", 4 if old else 5)
        return enabled is None or is_true(enabled.value)

    def _bf16_evidence(self, scale_call: cst.Call, region: cst.CSTNode) -> str | None:
        """'here' (bf16 autocast in this loop), a file name (bf16 autocast elsewhere), or None."""
        if self._texts is None:
            self._texts = related_texts(self.ctx)
            self._fp16 = any(_FP16_TEXT.search(text) for text in self._texts.values())
        texts = self._texts
        if self._fp16:
            return None
        dtypes = []
        for node in walk(region):
            if isinstance(node, cst.With):
                for item in node.items:
                    call = autocast_call_of(item.item, _At(self.ctx, node))
                    if call is not None:
                        dtypes.append(autocast_dtype(call, _At(self.ctx, node)))
                    elif "autocast" in self.ctx.code(item.item):
                        dtypes.append(None)
        if dtypes:
            return "here" if all(d == "bf16" for d in dtypes) else None
        if "autocast" in self.ctx.code(region):
            return None
        if self._bf16_elsewhere is False:
            self._bf16_elsewhere = _first_match({p: t for p, t in texts.items() if p != self.ctx.path},
                                                _BF16_AUTOCAST_TEXT)
        if self._bf16_elsewhere:
            path, line = self._bf16_elsewhere  # type: ignore[misc]
            return f"{path}:{line}"
        if self._bf16_here is False:
            own = _first_match({self.ctx.path: texts[self.ctx.path]}, _BF16_AUTOCAST_TEXT)
            self._bf16_here = own[1] if own else None
        return f"line {self._bf16_here}" if self._bf16_here else None


def _first_match(texts: dict[str, str], pattern: re.Pattern[str]) -> tuple[str, int] | None:
    """(path, line) of the first match of `pattern` in `texts` (one search per text, stopping at the first)."""
    for path, text in texts.items():
        match = pattern.search(text)
        if match is not None:
            return path, text.count("\n", 0, match.start()) + 1
    return None


class _At:
    """A view of the rule context positioned at another node of the same file (for name resolution)."""

    def __init__(self, ctx, node: cst.CSTNode) -> None:
        self._ctx = ctx
        self.ancestors = list(ctx.ancestors) + [node]
        self.analysis = ctx.analysis
        self.program = ctx.program

    def qualname(self, node):
        return self._ctx.qualname(node)

    def code(self, node):
        return self._ctx.code(node)


def _remove_scaler(region: cst.CSTNode, scaler: str, ctx) -> cst.CSTNode | None:
    """The region without `scaler` (None when the scaler is used in a way the fix does not know)."""
    transformer = _RemoveScaler(scaler)
    new_region = region.visit(transformer)
    if transformer.unknown_use:
        return None
    return new_region


class _RemoveScaler(cst.CSTTransformer):
    def __init__(self, scaler: str) -> None:
        super().__init__()
        self.scaler = scaler
        self.unknown_use = False
        self._handled: set[int] = set()

    def _is_scaler_call(self, node: cst.Call, method: str) -> bool:
        return (method_name(node) == method and isinstance(node.func, cst.Attribute)
                and dotted_name(node.func.value) == self.scaler)

    def visit_Call(self, node: cst.Call) -> None:
        if self._is_scaler_call(node, "scale") or self._is_scaler_call(node, "step"):
            self._handled.add(id(node.func.value))  # type: ignore[union-attr]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        for small in node.body:
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and (
                    self._is_scaler_call(small.value, "update") or self._is_scaler_call(small.value, "unscale_")):
                self._handled.add(id(small.value.func.value))  # type: ignore[union-attr]

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.scaler and id(node) not in self._handled:
            self.unknown_use = True

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if dotted_name(node) == self.scaler and "." in self.scaler:
            if id(node) not in self._handled:
                self.unknown_use = True
            return False
        return True

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self._is_scaler_call(original_node, "scale"):
            value = updated_node.args[0].value
            if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not value.lpar:
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return value
        if self._is_scaler_call(original_node, "step"):
            args = updated_node.args
            if len(args) != 1 or args[0].keyword is not None or not isinstance(args[0].value, (cst.Name,
                                                                                              cst.Attribute)):
                self.unknown_use = True
                return updated_node
            return cst.Call(func=cst.Attribute(value=args[0].value, attr=cst.Name("step")))
        return updated_node

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine):
        kept = [small for small, orig in zip(updated_node.body, original_node.body)
                if not (isinstance(orig, cst.Expr) and isinstance(orig.value, cst.Call)
                        and (self._is_scaler_call(orig.value, "update")
                             or self._is_scaler_call(orig.value, "unscale_")))]
        if len(kept) == len(updated_node.body):
            return updated_node
        if not kept:
            return cst.RemoveFromParent()
        kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(body=kept)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        if not updated_node.body:
            return updated_node.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated_node
