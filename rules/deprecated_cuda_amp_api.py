import re
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import child_nodes, dotted_name, has_star_args, walk
from gpulint.pins import torch_admitted_below, torch_pinned_below

# deprecated qualified name -> (new qualified name, device, kind)
_DEPRECATED = {
    "torch.cuda.amp.autocast": ("torch.amp.autocast", "cuda", "autocast"),
    "torch.cuda.amp.autocast_mode.autocast": ("torch.amp.autocast", "cuda", "autocast"),
    "torch.cpu.amp.autocast": ("torch.amp.autocast", "cpu", "autocast"),
    "torch.cpu.amp.autocast_mode.autocast": ("torch.amp.autocast", "cpu", "autocast"),
    "torch.cuda.amp.GradScaler": ("torch.amp.GradScaler", "cuda", "scaler"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("torch.amp.GradScaler", "cuda", "scaler"),
    "torch.cpu.amp.GradScaler": ("torch.amp.GradScaler", "cpu", "scaler"),
    "torch.cpu.amp.grad_scaler.GradScaler": ("torch.amp.GradScaler", "cpu", "scaler"),
    "torch.cuda.amp.custom_fwd": ("torch.amp.custom_fwd", "cuda", "custom_fwd"),
    "torch.cuda.amp.autocast_mode.custom_fwd": ("torch.amp.custom_fwd", "cuda", "custom_fwd"),
    "torch.cuda.amp.custom_bwd": ("torch.amp.custom_bwd", "cuda", "custom_bwd"),
    "torch.cuda.amp.autocast_mode.custom_bwd": ("torch.amp.custom_bwd", "cuda", "custom_bwd"),
}
# old positional parameters, in order (the new signatures put device_type/device first)
_OLD_PARAMS = {
    "autocast": ("enabled", "dtype", "cache_enabled"),
    "scaler": ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"),
    "custom_fwd": ("fwd",),  # stays positional: the new custom_fwd(fwd=None, *, device_type, cast_inputs)
    "custom_bwd": ("bwd",),
}
# `torch.amp.GradScaler` appeared in 2.3, the device-agnostic custom_fwd/custom_bwd in 2.4
_MIN_TORCH = {"autocast": (2, 3), "scaler": (2, 3), "custom_fwd": (2, 4), "custom_bwd": (2, 4)}
_GATE_TEST = re.compile(r"hasattr|getattr|version|TORCH_|is_scripting", re.I)
_GATE_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "AttributeError", "Exception", "BaseException"}
_ISINSTANCE = re.compile(r"\b(isinstance|issubclass)\s*\([^)]*\b(GradScaler|autocast)\b")


class DeprecatedCudaAmpApi(Rule):
    """
    ## What it does
    Finds the deprecated device-specific AMP entry points `torch.cuda.amp.autocast(...)`,
    `torch.cuda.amp.GradScaler(...)`, `torch.cuda.amp.custom_fwd` / `custom_bwd`, `torch.cpu.amp.autocast`
    and `torch.cpu.amp.GradScaler`, also when imported with `from torch.cuda.amp import autocast, GradScaler`
    (then the import and every call site are rewritten together) or through `import torch as t`.

    ## Why is this slow
    It is not slow, but every construction emits `FutureWarning: torch.cuda.amp.autocast(args...) is
    deprecated. Please use torch.amp.autocast('cuda', args...) instead.` (torch 2.4+); an autocast context
    entered every step warns every step, and the aliases will be removed.

    ## Example
    ```python
    scaler = torch.cuda.amp.GradScaler(2.0**14)
    with torch.cuda.amp.autocast(dtype=torch.bfloat16):
        loss = model(x)
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**14)
    with torch.amp.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x)
    ```

    ## Fix safety
    Safe: the deprecated classes and decorators are thin wrappers that call the new API with the device
    filled in (torch source), and positional arguments are turned into keywords because the new signatures
    take the device first. The old `autocast` passes `dtype=torch.float16` (`bfloat16` on CPU) explicitly,
    the new one defaults to `torch.get_autocast_dtype(device)`: the same unless the program calls
    `torch.set_autocast_dtype`, in which case the fix spells the dtype out. Not reported: code under a
    version gate (`if hasattr(torch.amp, "GradScaler")`, `try: ... except ImportError`), and projects whose
    requirements pin torch below 2.3 (2.4 for `custom_fwd`/`custom_bwd`). Where the requirements only admit such
    a torch (`torch>=1.7`), the fix is unsafe (applied with `--unsafe-fixes`). No fix where a name is also used
    as a value (`isinstance(s, GradScaler)` would stop matching) or is bound more than once.
    """

    code = "GPU022"
    name = "deprecated-cuda-amp-api"
    message = "Deprecated `torch.{device}.amp.{name}`: use `torch.amp.{name}(\"{device}\", ...)`"
    fix_title = "Use the device-agnostic `torch.amp` API"
    severity = Severity.INFO
    safety = Safety.SAFE
    priority = "P1"
    triggers = ("cuda.amp", "cpu.amp", "import amp")
    examples = [
        Valid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.amp.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            """
        ),
        Valid(  # version gate
            """
            try:
                from torch.amp import GradScaler
            except ImportError:
                from torch.cuda.amp import GradScaler
            scaler = GradScaler()
            """
        ),
        Invalid(
            """
            import torch
            scaler = torch.cuda.amp.GradScaler(2.0**14, enabled=use_amp)
            with torch.cuda.amp.autocast(True):
                out = model(x)
            """,
            fixed="""
            import torch
            scaler = torch.amp.GradScaler("cuda", init_scale=2.0**14, enabled=use_amp)
            with torch.amp.autocast("cuda", enabled=True):
                out = model(x)
            """,
        ),
        Invalid(
            """
            import torch as t
            from torch.cuda.amp import autocast, GradScaler, custom_fwd

            class Fn(t.autograd.Function):
                @staticmethod
                @custom_fwd(cast_inputs=t.float32)
                def forward(ctx, x):
                    return x

            scaler = GradScaler()
            with autocast(dtype=t.bfloat16):
                out = model(x)
            """,
            fixed="""
            import torch as t
            from torch.amp import autocast, GradScaler, custom_fwd

            class Fn(t.autograd.Function):
                @staticmethod
                @custom_fwd(device_type="cuda", cast_inputs=t.float32)
                def forward(ctx, x):
                    return x

            scaler = GradScaler("cuda")
            with autocast("cuda", dtype=t.bfloat16):
                out = model(x)
            """,
        ),
        Invalid(
            """
            import torch

            class Fn(torch.autograd.Function):
                @staticmethod
                @torch.cuda.amp.custom_bwd
                def backward(ctx, grad):
                    return grad

            with torch.cpu.amp.autocast():
                y = f(x)
            """,
            fixed="""
            import torch

            class Fn(torch.autograd.Function):
                @staticmethod
                @torch.amp.custom_bwd(device_type="cuda")
                def backward(ctx, grad):
                    return grad

            with torch.amp.autocast("cpu"):
                y = f(x)
            """,
        ),
    ]
    micro_check = MicroCheck(
        kinds=("WARN", "EQ"),
        setup="import torch",
        before=("ctx = torch.cuda.amp.autocast(True, torch.bfloat16)\n"
                "scaler = torch.cuda.amp.GradScaler(1024.0, 3.0)\n"
                "state = (ctx.device, ctx.fast_dtype, ctx._enabled, scaler.is_enabled(), scaler._device,\n"
                "         scaler.get_scale(), scaler.state_dict())"),
        after=('ctx = torch.amp.autocast("cuda", enabled=True, dtype=torch.bfloat16)\n'
               'scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, growth_factor=3.0)\n'
               "state = (ctx.device, ctx.fast_dtype, ctx._enabled, scaler.is_enabled(), scaler._device,\n"
               "         scaler.get_scale(), scaler.state_dict())"),
        compare=("state",),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._parents: dict[int, cst.CSTNode] | None = None
        self._groups: dict[int, "_ImportGroup | None"] = {}  # id(ImportFrom) -> group
        # once per file, not once per call site (a file's text or walk per site made the rule quadratic)
        self._isinstance_here: bool | None = None
        self._imports_by_name: dict[str, list[cst.ImportFrom]] | None = None

    # -- module-path uses: torch.cuda.amp.X(...) / amp.X(...) -----------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        target = self._deprecated_target(node.func)
        if target is None:
            return
        qual, via_import = target
        new_qual, device, kind = _DEPRECATED[qual]
        if via_import is not None:
            self._report_group_use(node, via_import, qual)
            return
        if self._skipped(kind):
            return
        message = self._message(qual)
        if self._in_isinstance_program() and kind == "scaler":
            self.report(node, message)
            return
        func, imports = self.ctx.spell(new_qual)
        extra, extra_imports = self._explicit_defaults(node, kind, device)
        new = _convert_call(node, device, kind, extra)
        if new is None:
            self.report(node, message)
            return
        new = new.with_changes(func=cst.parse_expression(func))
        self.report(node, message, replacement=new, imports=imports + extra_imports, **self._fix_policy(kind))

    def visit_Decorator(self, node: cst.Decorator) -> None:
        decorator = node.decorator
        if isinstance(decorator, cst.Call):
            return  # handled as a call
        target = self._deprecated_target(decorator)
        if target is None:
            return
        qual, via_import = target
        _, device, kind = _DEPRECATED[qual]
        if kind not in ("custom_fwd", "custom_bwd"):
            return
        if via_import is not None:
            self._report_group_use(decorator, via_import, qual)
            return
        if self._skipped(kind):
            return
        func, imports = self.ctx.spell(_DEPRECATED[qual][0])
        new = cst.parse_expression(f'{func}(device_type="{device}")')
        self.report(decorator, self._message(qual), replacement=new, imports=imports, **self._fix_policy(kind))

    # -- helpers ---------------------------------------------------------------------------------------

    def _message(self, qual: str) -> str:
        parts = qual.split(".")
        return self.message.format(device=parts[1], name=parts[-1])

    def _deprecated_target(self, func: cst.BaseExpression) -> tuple[str, str | None] | None:
        """(deprecated qualname, local name if the object itself was from-imported) for a deprecated use."""
        qual = self.ctx.qualname(func)
        if qual not in _DEPRECATED:
            return None
        head = (dotted_name(func) or "").split(".")[0]
        from_imported = self.ctx.analysis.aliases.get(head) in _DEPRECATED
        return qual, head if from_imported else None

    def _fix_policy(self, kind: str) -> dict[str, Any]:
        """A project whose requirements admit a torch older than the new API (`torch>=1.7`) gets the fix only
        with --unsafe-fixes: on such a torch the rewritten code would not run."""
        minimum = _MIN_TORCH[kind]
        requirement = torch_admitted_below(self.ctx.path, minimum)
        if requirement is None:
            return {}
        return {"safety": Safety.UNSAFE,
                "note": f"the project's requirements admit older torch (`{requirement}`); the new API needs torch "
                        f"{minimum[0]}.{minimum[1]}: raise the requirement, or apply with --unsafe-fixes"}

    def _skipped(self, kind: str) -> bool:
        return self._gated() or torch_pinned_below(self.ctx.path, _MIN_TORCH[kind])

    def _gated(self) -> bool:
        """Inside `if hasattr(...)` / `if torch.__version__ ...` / `try: ... except ImportError`?"""
        ancestors = self.ctx.ancestors
        for index, node in enumerate(ancestors[:-1]):
            if isinstance(node, (cst.If, cst.IfExp, cst.While)) and _GATE_TEST.search(self.ctx.code(node.test)):
                return True
            if isinstance(node, cst.Try) and ancestors[index + 1] is not node.finalbody:
                for handler in node.handlers:
                    names = {(dotted_name(n) or "").rsplit(".", 1)[-1] for n in _handler_types(handler.type)}
                    if handler.type is None or names & _GATE_EXCEPTIONS:
                        return True
        return False

    def _in_isinstance_program(self) -> bool:
        if self._isinstance_here is None:
            self._isinstance_here = bool(self.ctx.program.search(_ISINSTANCE)) or bool(
                _ISINSTANCE.search(self.ctx.code(self.ctx.module)))
        return self._isinstance_here

    def _explicit_defaults(self, call: cst.Call, kind: str, device: str) -> tuple[list[tuple[str, str]], tuple]:
        """The old autocast passed dtype/cache_enabled explicitly; keep them when the program changes defaults."""
        if kind != "autocast":
            return [], ()
        given = {a.keyword.value for a in call.args if a.keyword is not None}
        given |= set(_OLD_PARAMS["autocast"][:len([a for a in call.args if a.keyword is None])])
        extra: list[tuple[str, str]] = []
        imports: tuple = ()
        if "dtype" not in given and self.ctx.program.search(r"set_autocast_dtype\b"):
            text, imports = self.ctx.spell("torch.float16" if device == "cuda" else "torch.bfloat16")
            extra.append(("dtype", text))
        if "cache_enabled" not in given and self.ctx.program.search(r"set_autocast_cache_enabled\b"):
            extra.append(("cache_enabled", "True"))
        return extra, imports

    # -- from torch.cuda.amp import autocast, GradScaler -----------------------------------------------

    def _report_group_use(self, node: cst.CSTNode, local: str, qual: str) -> None:
        group = self._group_for(local)
        _, _, kind = _DEPRECATED[qual]
        if group is None or group.gated or torch_pinned_below(self.ctx.path, _MIN_TORCH[kind]):
            return
        message = self._message(qual)
        if group.edits is None:
            self.report(node, message)
        else:
            self.report(node, message, replacements=group.edits, imports=group.imports, **self._fix_policy(kind))

    def _group_for(self, local: str) -> "_ImportGroup | None":
        if self._parents is None:
            self._parents = {}
            stack: list[cst.CSTNode] = [self.ctx.module]
            while stack:
                current = stack.pop()
                for child in child_nodes(current):
                    self._parents[id(child)] = current
                    stack.append(child)
        import_from = self._import_for(local)
        if import_from is None:
            return None
        if id(import_from) not in self._groups:
            self._groups[id(import_from)] = self._build_group(import_from)
        return self._groups[id(import_from)]

    def _import_for(self, local: str) -> cst.ImportFrom | None:
        """The single `from torch.{cuda,cpu}.amp[...] import ...` statement binding `local`, if it is the
        only binding of that name in the file."""
        if self._imports_by_name is None:
            self._imports_by_name = {}
            for node in walk(self.ctx.module, into_functions=True):
                if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
                    for alias in node.names:
                        bound = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) \
                            else dotted_name(alias.name)
                        if bound is not None:
                            self._imports_by_name.setdefault(bound, []).append(node)
        found = self._imports_by_name.get(local, [])
        bindings = sum(len(scope.bindings.get(local, [])) for scope in self.ctx.analysis.scopes.values())
        if len(found) != 1 or bindings != 1:
            return None
        module = dotted_name(found[0].module) if found[0].module is not None else None
        return found[0] if module and module.startswith(("torch.cuda.amp", "torch.cpu.amp")) else None

    def _build_group(self, import_from: cst.ImportFrom) -> "_ImportGroup":
        module = dotted_name(import_from.module) or ""
        assert not isinstance(import_from.names, cst.ImportStar)
        gated = self._node_gated(import_from)
        names = {}
        for alias in import_from.names:
            name = dotted_name(alias.name) or ""
            bound = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
            names[bound] = f"{module}.{name}"
        if any(qual not in _DEPRECATED for qual in names.values()) or self._in_isinstance_program():
            return _ImportGroup(None, (), gated)
        wrapper = MetadataWrapper(self.ctx.module, unsafe_skip_copy=True)
        scopes = wrapper.resolve(ScopeProvider)
        global_scope = scopes[self.ctx.module]
        edits: list[tuple[cst.CSTNode, cst.CSTNode]] = [
            (import_from.module, cst.parse_expression("torch.amp"))]  # type: ignore[list-item]
        imports: tuple = ()
        for bound, qual in names.items():
            _, device, kind = _DEPRECATED[qual]
            assignments = list(global_scope.assignments[bound]) if global_scope is not None else []
            if len(assignments) != 1:
                return _ImportGroup(None, (), gated)
            for access in assignments[0].references:
                name_node = access.node
                parent = self._parents.get(id(name_node)) if self._parents else None
                if isinstance(parent, cst.Call) and parent.func is name_node:
                    if kind in ("custom_fwd", "custom_bwd"):
                        new = _add_device_type(parent, device)
                    else:
                        extra, extra_imports = self._explicit_defaults(parent, kind, device)
                        imports += extra_imports
                        new = _convert_call(parent, device, kind, extra)
                    if new is None:
                        return _ImportGroup(None, (), gated)
                    edits.append((parent, new))
                elif isinstance(parent, cst.Decorator) and kind in ("custom_fwd", "custom_bwd"):
                    edits.append((name_node, cst.parse_expression(f'{bound}(device_type="{device}")')))
                elif isinstance(parent, cst.Annotation) or self._in_annotation(name_node):
                    continue  # `scaler: GradScaler`: the new class is the base class of the old one
                else:
                    return _ImportGroup(None, (), gated)  # used as a value: the rewrite could change it
        return _ImportGroup(tuple(edits), imports, gated)

    def _in_annotation(self, node: cst.CSTNode) -> bool:
        current = self._parents.get(id(node)) if self._parents else None
        while current is not None and not isinstance(current, cst.BaseStatement):
            if isinstance(current, cst.Annotation):
                return True
            current = self._parents.get(id(current))
        return False

    def _node_gated(self, node: cst.CSTNode) -> bool:
        chain = []
        current = self._parents.get(id(node)) if self._parents else None
        while current is not None:
            chain.append(current)
            current = self._parents.get(id(current))
        for parent in chain:
            if isinstance(parent, (cst.If, cst.IfExp)) and _GATE_TEST.search(self.ctx.code(parent.test)):
                return True
            if isinstance(parent, cst.Try):
                return True
        return False


class _ImportGroup:
    def __init__(self, edits, imports, gated: bool) -> None:
        self.edits = edits  # None: report without a fix
        self.imports = imports
        self.gated = gated


def _handler_types(node: cst.BaseExpression | None) -> list[cst.BaseExpression]:
    if node is None:
        return []
    if isinstance(node, cst.Tuple):
        return [element.value for element in node.elements]
    return [node]


def _keyword_arg(arg: cst.Arg, keyword: str) -> cst.Arg:
    return arg.with_changes(keyword=cst.Name(keyword),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def _append_keywords(args: list[cst.Arg], extra: list[tuple[str, str]]) -> list[cst.Arg]:
    for keyword, value in extra:
        new = _keyword_arg(cst.Arg(cst.parse_expression(value)), keyword)
        if args:
            last = args[-1]
            if isinstance(last.comma, cst.Comma):
                args.append(new.with_changes(comma=last.comma))
                args[-2] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            else:
                args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                                             whitespace_after_arg=cst.SimpleWhitespace(""))
                args.append(new.with_changes(whitespace_after_arg=last.whitespace_after_arg))
        else:
            args.append(new)
    return args


def _convert_call(call: cst.Call, device: str, kind: str, extra: list[tuple[str, str]] = ()) -> cst.Call | None:
    """`old(a, b, k=v)` -> `new("device", p0=a, p1=b, k=v)` for autocast/GradScaler (function name unchanged)."""
    if kind in ("custom_fwd", "custom_bwd"):
        return _add_device_type(call, device)
    if has_star_args(call):
        return None
    if any(a.keyword is not None and a.keyword.value in ("device_type", "device") for a in call.args):
        # `autocast(device_type="cuda", ...)` through the old name raises TypeError: the author meant the new API
        return call if not any(a.keyword is None for a in call.args) else None
    params = _OLD_PARAMS[kind]
    positional = [a for a in call.args if a.keyword is None]
    if len(positional) > len(params):
        return None
    args = [(_keyword_arg(arg, params[index]) if arg.keyword is None else arg)
            for index, arg in enumerate(call.args)]
    args = _append_keywords(args, list(extra))
    first = cst.Arg(cst.SimpleString(f'"{device}"'))
    if args:
        comma = args[0].comma if isinstance(args[0].comma, cst.Comma) else cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))
        if not isinstance(args[0].comma, cst.Comma) and isinstance(args[0].whitespace_after_arg,
                                                                    cst.ParenthesizedWhitespace):
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        first = first.with_changes(comma=comma)
    return call.with_changes(args=[first, *args])


def _add_device_type(call: cst.Call, device: str) -> cst.Call | None:
    """`custom_fwd(cast_inputs=t)` -> `custom_fwd(device_type="cuda", cast_inputs=t)`; `custom_bwd(f)` ->
    `custom_bwd(f, device_type="cuda")`."""
    if has_star_args(call) or any(a.keyword is not None and a.keyword.value == "device_type" for a in call.args):
        return None
    new = _keyword_arg(cst.Arg(cst.SimpleString(f'"{device}"')), "device_type")
    args = list(call.args)
    first_keyword = next((i for i, a in enumerate(args) if a.keyword is not None), None)
    if first_keyword is None:
        return call.with_changes(args=_append_keywords(args, [("device_type", f'"{device}"')]))
    comma = args[first_keyword - 1].comma if first_keyword > 0 and isinstance(args[first_keyword - 1].comma,
                                                                              cst.Comma) else None
    if comma is None:
        comma = args[first_keyword].comma if isinstance(args[first_keyword].comma, cst.Comma) else cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))
    args.insert(first_keyword, new.with_changes(comma=comma))
    return call.with_changes(args=args)
