import re

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import BindingKind, call_arg, child_nodes, dotted_name, is_true, method_name, walk
from gpulint.builders import add_keyword
from gpulint.program import mentions, related_texts
from gpulint.semantic.precision import autocast_call_of, autocast_dtype

_STEP_KINDS = (HotKind.STEP_LOOP, HotKind.STEP_FUNCTION)
# fp16 anywhere in the program (mixed fp16/bf16 code paths): then the scaler may be needed
_FP16_TEXT = re.compile(r"(?<![bB])float16|\.half\(|\btorch\.half\b|\bfp16\b|['\"]16-mixed['\"]")
_BF16_AUTOCAST_TEXT = re.compile(r"autocast\([^)]*bfloat16")
_SCALER_KEEP = {"state_dict", "load_state_dict"}  # uses of the scaler outside the loop that stay valid
_DEVICE_TEST = re.compile(r"device|cuda|is_available")
_PRECISION_WORD = re.compile(r"dtype|16|half|precision|amp|mixed|bf|fp", re.I)
_FP16_MESSAGE = ("float16 autocast with a GradScaler: bf16 autocast needs no loss scaling, which costs an "
                 "unscale, an inf check and a host sync per step")
_FP16_NOTE = ("unsafe fix: the autocast runs in bfloat16 (fp32's range, fewer mantissa bits: losses move by about "
              "bf16 rounding) and the scaler goes; bf16 needs an Ampere or newer GPU (on older GPUs keep fp16)")


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

    It also finds the older recipe of a CUDA program: float16 autocast (`torch.cuda.amp.autocast()`, or
    `dtype=torch.float16` written out) with a GradScaler that is on whenever it is (`enabled=` absent, `True`,
    or a test of the device), when nothing else in the program uses fp16 (`.half()` weights, fp16 options),
    and offers bf16 autocast without the scaler.

    ## Why is this slow
    bf16 has fp32's exponent range, so gradients do not underflow and loss scaling does nothing useful
    (the AMP docs pair GradScaler with float16 only). The scaler still multiplies the loss, unscales every
    gradient, checks them for inf/NaN and reads the result on the host: one device-to-host sync per step
    (`GradScaler._maybe_opt_step` calls `.item()`, unless the optimizer is fused). Measured on an H100,
    a small model step: 1686 us with the scaler vs 1420 us without (1.19x). On GPUs with bf16 (Ampere and
    newer) float16 autocast buys nothing over bf16 (same tensor-core rate) and needs the scaler.

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
    scaling is exact; verified on CPU over 20 AdamW steps). `scaler = GradScaler(...)` is removed too when
    the function (or the module, for a script) uses the scaler nowhere else; it is kept when anything else
    uses it (a checkpoint saving its state). No fix when the scaler is used in the loop in any other way
    (`get_scale()`, ...). The float16 recipe's fix also sets `dtype=torch.bfloat16` on the loop's autocast
    calls: values change by bf16 rounding (8 mantissa bits instead of 11; fp32's exponent range, so nothing
    underflows), and bf16 needs an Ampere or newer GPU.
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
        Invalid(  # fp16 autocast with its scaler: bf16 without one (unsafe); the unused scaler goes too
            """
            import torch

            def train(model, loader, optimizer, device):
                scaler = torch.cuda.amp.GradScaler(enabled=device.type == "cuda")
                for x, y in loader:
                    with torch.cuda.amp.autocast(enabled=device.type == "cuda"):
                        loss = model(x.to(device), y.to(device))
                    optimizer.zero_grad()
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """,
            fixed="""
            import torch

            def train(model, loader, optimizer, device):
                for x, y in loader:
                    with torch.cuda.amp.autocast(enabled=device.type == "cuda", dtype=torch.bfloat16):
                        loss = model(x.to(device), y.to(device))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Valid(  # fp16 weights elsewhere in the program: the scaler stays
            """
            import torch
            model = Net().cuda().half()
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
        # timed on CUDA: the fp16 path's rewrite (fp16 autocast + GradScaler -> bf16 autocast, no scaler)
        options={
            "perf_setup": ("model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])\n"
                           "opt = torch.optim.AdamW(model.parameters(), lr=1e-4)\nx = torch.randn(256, 1024)"),
            "perf_before": ("scaler = torch.amp.GradScaler(device)\nfor _ in range(20):\n"
                            "    opt.zero_grad()\n    with torch.autocast(device, dtype=torch.float16):\n"
                            "        loss = model(x).square().mean()\n    scaler.scale(loss).backward()\n"
                            "    scaler.step(opt)\n    scaler.update()"),
            "perf_after": ("for _ in range(20):\n    opt.zero_grad()\n"
                           "    with torch.autocast(device, dtype=torch.bfloat16):\n"
                           "        loss = model(x).square().mean()\n    loss.backward()\n    opt.step()"),
        },
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._done: set[tuple[int, str]] = set()
        # program-wide text facts, searched once per file rather than once per `scaler.scale()` call
        self._texts: dict[str, str] | None = None
        self._fp16: bool | None = None
        self._bf16_elsewhere: tuple[str, int] | None | bool = False  # False: not searched yet
        self._bf16_here: int | None | bool = False
        self._fp16_in_autocasts: int | None = None
        self._parents: dict[int, cst.CSTNode] | None = None

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
        if construction is None:
            return
        bf16_where = self._bf16_evidence(node, region) if self._enabled_always(construction) else None
        if bf16_where is not None:
            self._done.add((id(region), scaler))
            new_region = _remove_scaler(region, scaler, self.ctx)
            note = None if bf16_where == "here" else f"bf16 autocast is set up in {bf16_where}"
            if new_region is None:
                self.report(node, note=note)
            else:
                self.report(node, replacements=self._with_dead_scaler_removed(region, new_region, scaler,
                                                                              construction), note=note)
            return
        fp16_calls = self._fp16_autocasts(region, construction)
        if fp16_calls is None:
            return
        self._done.add((id(region), scaler))
        bf16, imports = self.ctx.spell("torch.bfloat16")
        new_region = _remove_scaler(region.visit(_ToBf16(fp16_calls, bf16)), scaler, self.ctx)
        if new_region is None:
            self.report(node, _FP16_MESSAGE, note=_FP16_NOTE)
            return
        self.report(node, _FP16_MESSAGE, replacements=self._with_dead_scaler_removed(region, new_region, scaler,
                                                                                     construction),
                    imports=imports, note=_FP16_NOTE)

    def _fp16_autocasts(self, region: cst.CSTNode, construction: cst.Call) -> list[cst.Call] | None:
        """The autocast calls of the step loop, when all of them are float16 (by default or written out, never
        through a variable), the scaler is on whenever they are, and nothing else in the program uses fp16."""
        if not self.ctx.targets_cuda() or not self._enabled_follows_device(construction):
            return None
        calls: list[cst.Call] = []
        for node in walk(region):
            if not isinstance(node, cst.With):
                continue
            for item in node.items:
                at = _At(self.ctx, node)
                call = autocast_call_of(item.item, at)
                if call is None:
                    if "autocast" in self.ctx.code(item.item):
                        return None
                    continue
                if call is not item.item or autocast_dtype(call, at) != "fp16":
                    return None
                dtype = call_arg(call, "dtype", 1)
                if dtype is not None and self.ctx.qualname(dtype.value) not in ("torch.float16", "torch.half"):
                    return None
                calls.append(call)
        if not calls:
            return None
        if self._texts is None:
            self._texts = related_texts(self.ctx)
            self._fp16 = any(mentions(_FP16_TEXT, text) for text in self._texts.values())
        if self._fp16:
            if self._fp16_in_autocasts is None:  # fp16 written inside this file's autocast calls
                self._fp16_in_autocasts = sum(
                    len(_FP16_TEXT.findall(self.ctx.code(n))) for n in walk(self.ctx.module, into_functions=True)
                    if isinstance(n, cst.Call) and (self.ctx.qualname(n.func) or "").endswith("autocast"))
            if sum(len(_FP16_TEXT.findall(text)) for text in self._texts.values()) > self._fp16_in_autocasts:
                return None  # `.half()` weights, fp16 configs: more than the autocasts rely on fp16
        return calls

    def _enabled_follows_device(self, construction: cst.Call) -> bool:
        """`enabled=` absent, True, or a test of the device (`device.type == "cuda"`), not of the precision."""
        qual = self.ctx.qualname(construction.func) or ""
        old = qual.startswith(("torch.cuda.amp", "torch.cpu.amp"))
        enabled = call_arg(construction, "enabled", 4 if old else 5)
        if enabled is None or is_true(enabled.value):
            return True
        text = self.ctx.code(enabled.value)
        return bool(_DEVICE_TEST.search(text)) and not _PRECISION_WORD.search(text)

    def _with_dead_scaler_removed(self, region: cst.CSTNode, new_region: cst.CSTNode, scaler: str,
                                  construction: cst.Call) -> list[tuple[cst.CSTNode, cst.CSTNode | str]]:
        """The region's replacement, plus the removal of `scaler = GradScaler(...)` when the file uses the scaler
        nowhere else (a checkpoint saving its state keeps it)."""
        plain = [(region, new_region)]
        module = self.ctx.module
        if self._parents is None:  # once per file: the fix is asked for at every scaler.scale() site
            self._parents = {}
            stack: list[cst.CSTNode] = [module]
            while stack:
                current = stack.pop()
                for child in child_nodes(current):
                    self._parents[id(child)] = current
                    stack.append(child)
        parents = self._parents
        assign = parents.get(id(construction))
        line = parents.get(id(assign)) if assign is not None else None
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(
                assign.targets[0].target, cst.Name) and assign.targets[0].target.value == scaler
                and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            return plain
        block = parents.get(id(line))
        scope = parents.get(id(block)) if isinstance(block, cst.IndentedBlock) else module  # its function
        skip = {id(n) for n in walk(region, into_functions=True)} | {id(n) for n in walk(line)}
        if any(isinstance(n, cst.Name) and n.value == scaler and id(n) not in skip
               for n in walk(scope, into_functions=True)):
            return plain
        if isinstance(block, cst.Module):
            return [(region, new_region), (line, "")]
        function = parents.get(id(block)) if isinstance(block, cst.IndentedBlock) else None
        if not isinstance(function, cst.FunctionDef) or function is region:
            return plain
        inside = {id(n) for n in walk(function)}
        if id(region) not in inside:
            return plain
        return [(function, function.visit(_Swap(region, new_region, line)))]

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
            self._fp16 = any(mentions(_FP16_TEXT, text) for text in self._texts.values())
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


class _ToBf16(cst.CSTTransformer):
    """The given autocast calls with `dtype=torch.bfloat16`."""

    def __init__(self, calls: list[cst.Call], bf16: str) -> None:
        super().__init__()
        self.ids = {id(c) for c in calls}
        self.bf16 = bf16

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if id(original_node) not in self.ids:
            return updated_node
        dtype = call_arg(original_node, "dtype", 1)
        if dtype is None:
            return add_keyword(updated_node, "dtype", self.bf16)
        index = next(i for i, a in enumerate(original_node.args) if a is dtype)
        args = list(updated_node.args)
        args[index] = args[index].with_changes(value=cst.parse_expression(self.bf16))
        return updated_node.with_changes(args=args)


class _Swap(cst.CSTTransformer):
    """A function with one node replaced and one statement line removed."""

    def __init__(self, old: cst.CSTNode, new: cst.CSTNode, drop: cst.CSTNode) -> None:
        super().__init__()
        self.old, self.new, self.drop = old, new, drop

    def on_leave(self, original_node, updated_node):  # noqa: ANN001, ANN201 - libcst's generic hook
        if original_node is self.old:
            return self.new
        if original_node is self.drop:
            return cst.RemoveFromParent()
        return updated_node


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
