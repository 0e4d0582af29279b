"""Precision facts of a program: TF32 settings, autocast regions and their dtypes."""

import ast
import bisect
import io
import os
import re
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import libcst as cst

from gpulint import HotKind
from gpulint.analysis import CUDA_TEXT_PATTERN, BindingKind, call_arg, walk
from gpulint.program import MAIN_GUARD_TEXT, PLACEMENT_TEXT, mentions, program_index
from gpulint.semantic import pyast
from gpulint.textscan import quick

_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast", "torch.cuda.amp.autocast",
             "torch.cpu.amp.autocast"}


def autocast_dtype(call: cst.Call, ctx) -> str | None:
    """'bf16', 'fp16' or None (unknown) for an autocast call; `ctx` resolves names and aliases."""
    qual = ctx.qualname(call.func) or ""
    if qual not in _AUTOCAST:
        return None
    old = qual.startswith(("torch.cuda.amp", "torch.cpu.amp"))
    dtype = call_arg(call, "dtype", 1)
    if dtype is None:
        if old:
            return "fp16" if qual.startswith("torch.cuda") else "bf16"
        device = call_arg(call, "device_type", 0)
        text = ctx.code(device.value) if device is not None else ""
        if ctx.program.search(r"set_autocast_dtype\b"):
            return None
        if re.fullmatch(r"""["']cuda(:\d+)?["']""", text.strip()):
            return "fp16"
        if re.fullmatch(r"""["']cpu["']""", text.strip()):
            return "bf16"
        return None
    return dtype_name(dtype.value, ctx)


def dtype_name(node: cst.BaseExpression, ctx, depth: int = 0) -> str | None:
    qual = ctx.qualname(node)
    if qual in ("torch.bfloat16",):
        return "bf16"
    if qual in ("torch.float16", "torch.half"):
        return "fp16"
    if isinstance(node, cst.Name) and depth < 3:
        bindings = ctx.analysis.reaching_bindings(node.value, ctx.ancestors)
        if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN and bindings[0].value is not None:
            return dtype_name(bindings[0].value, ctx, depth + 1)
    return None


def autocast_call_of(expr: cst.BaseExpression, ctx) -> cst.Call | None:
    """The autocast call a `with` item uses: `autocast(...)` itself, or a name bound once to one."""
    if isinstance(expr, cst.Call) and (ctx.qualname(expr.func) or "") in _AUTOCAST:
        return expr
    if isinstance(expr, cst.Name):
        bindings = ctx.analysis.reaching_bindings(expr.value, ctx.ancestors)
        if len(bindings) == 1 and bindings[0].kind is BindingKind.ASSIGN and isinstance(bindings[0].value, cst.Call):
            value = bindings[0].value
            if (ctx.qualname(value.func) or "") in _AUTOCAST:
                return value
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and not expr.args:
        return None
    return None


_TF32_TEXT = re.compile(r"allow_tf32|float32_matmul_precision|fp32_precision")
# CUDA or possibly-CUDA evidence (`torch.accelerator` is CUDA on NVIDIA hosts)
CUDA_TEXT = re.compile(CUDA_TEXT_PATTERN + r"""|f["']cuda|\.to\(\s*0\s*\)|"""
                        r"""torch\.accelerator\.(is_available|current_accelerator)\(""")


def runs_on_cuda(ctx, texts: dict[str, str]) -> bool:
    """Does the program of `texts` (the current file's among them) train on CUDA? CUDA named (or possibly meant)
    and something placed on a device."""
    analysis = ctx.analysis
    named = analysis.cuda_evidence or analysis.maybe_cuda_evidence or any(mentions(CUDA_TEXT, t) for t in texts.values())
    return named and any(mentions(PLACEMENT_TEXT, t) for t in texts.values())


@dataclass(frozen=True)
class _Use:
    line: int
    what: str
    gated: bool  # under a version/feature gate (`if hasattr(...)`, `try:`), so maybe not executed


@dataclass(frozen=True)
class _Facts:
    """What one file's text says, from a cheap `ast` parse (cached by text)."""

    imports: tuple[tuple[int, str, tuple[str, ...]], ...] = ()  # (level, module, imported names)
    is_entry: bool = False  # `if __name__ == "__main__":` or a top-level training loop
    tf32_legacy: tuple[_Use, ...] = ()
    tf32_new: tuple[_Use, ...] = ()


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


_GATE_TEST = re.compile(r"hasattr|getattr|version|fp32_precision|allow_tf32|float32_matmul|TORCH_", re.I)
_NEW_TAIL = re.compile(r"(^|\.)(backends|matmul|cudnn|conv|rnn)\.fp32_precision$")
_LEGACY_ATTR = re.compile(r"(^|\.)(matmul|cudnn)\.allow_tf32$")
_LEGACY_CALL = re.compile(r"(^|\.)(set|get)_float32_matmul_precision$")


class _FactVisitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.gate = 0
        self.legacy: list[_Use] = []
        self.new: list[_Use] = []
        self.imports: list[tuple[int, str, tuple[str, ...]]] = []

    def _gated(self, node: ast.AST, gated: bool) -> None:
        self.gate += gated
        self.generic_visit(node)
        self.gate -= gated

    def visit_If(self, node: ast.If) -> None:
        self._gated(node, bool(_GATE_TEST.search(ast.unparse(node.test))))

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._gated(node, bool(_GATE_TEST.search(ast.unparse(node.test))))

    def visit_Try(self, node: ast.Try) -> None:
        self._gated(node, True)

    visit_TryStar = visit_Try

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.append((0, alias.name, ()))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.imports.append((node.level, node.module or "", tuple(a.name for a in node.names)))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted(node)
        if _LEGACY_ATTR.search(dotted):
            self.legacy.append(_Use(node.lineno, dotted, self.gate > 0))
        elif _NEW_TAIL.search(dotted) and isinstance(node.ctx, ast.Store) and (
                "backends" in dotted or "matmul" in dotted or "cudnn" in dotted):
            self.new.append(_Use(node.lineno, dotted, self.gate > 0))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        dotted = _dotted(node.func)
        if _LEGACY_CALL.search(dotted):
            self.legacy.append(_Use(node.lineno, dotted.rsplit(".", 1)[-1] + "()", self.gate > 0))
        self.generic_visit(node)


def _is_main_test(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _top_level_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(pyast.child_nodes(node))


def _has_step_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("backward", "step")
               for n in pyast.walk(node))


@lru_cache(maxsize=4096)
def _facts(text: str) -> _Facts:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _Facts(is_entry=bool(MAIN_GUARD_TEXT.search(text)))
    visitor = _FactVisitor()
    visitor.visit(tree)
    is_entry = any(isinstance(s, ast.If) and _is_main_test(s.test) for s in tree.body) or any(
        isinstance(n, (ast.For, ast.While)) and _has_step_call(n) for n in _top_level_nodes(tree))
    return _Facts(tuple(visitor.imports), is_entry, tuple(visitor.legacy), tuple(visitor.new))


def tf32_facts(path: str, text: str) -> _Facts:
    """TF32 API uses of one file (parsed only when its text names a TF32 API)."""
    return _facts(text) if _TF32_TEXT.search(text) else _Facts()


def training_entry_anchor(ctx, *, any_main_guard: bool = False) -> cst.CSTNode | None:
    """Where a program-level finding is reported: the `if __name__ == "__main__":` statement of a file that
    has a training loop (hot region of kind step-loop/step-function) or calls one in another file; in a script without a guard, its
    first top-level training loop, or the first top-level statement that calls a function of the file
    containing one (`for epoch in ...: train()`). None when the current file is not a training entry."""
    analysis = ctx.analysis
    steps = (HotKind.STEP_LOOP, HotKind.STEP_FUNCTION)
    trains = any(kind in steps for kind in analysis.hot.values())
    if analysis.main_guard is not None and not trains:  # `Trainer(cfg, model, data).run()` from another file
        trains = any(key.endswith("#trains") for key in analysis.program_keys)
    if analysis.main_guard is not None and (trains or any_main_guard):
        return analysis.main_guard
    if not trains:
        return None
    training_functions = {name for name, defs in analysis.functions.items()
                          if any(analysis.hot.get(id(n)) in steps for fn in defs for n in walk(fn, into_functions=False)
                                 if n is fn or isinstance(n, (cst.For, cst.While)))}
    for statement in ctx.module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        for node in walk(statement):
            if isinstance(node, (cst.For, cst.While)) and analysis.hot.get(id(node)) is HotKind.STEP_LOOP:
                return node
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) \
                    and node.func.value in training_functions:
                return statement
    return None


def location(ctx, path: str, line: int) -> str:
    return f"line {line}" if path == ctx.path else f"{path}:{line}"


# Text markers; the precision rules search them in code only (`in_code`): a comment or docstring that mentions
# bf16 or a commented-out TF32 switch changes nothing the program runs. Apex's data-parallel wrapper, LARC/LARS and
# fused optimizers, and fused norms are no mixed precision (`apex.amp` is).
LOW_PRECISION = re.compile(
    r"autocast|\.half\(|\btorch\.half\b|float16|bfloat16|\bbf16\b|\bfp16\b|mixed_precision|GradScaler|"
    r"\bapex\b(?!\.(parallel|optimizers|normalization)\b)|deepspeed|\baccelerate\b|\bprecision\s*=|set_default_dtype|\bamp\b|_amp\b|\bamp_|"
    r"\.to\(\s*dtype\s*=\s*(?!torch\.(float32|float|long|int64|int32|int|bool|uint8)\b)")  # not fp32 / integer casts
# an fp64 torch program: the default dtype changed, complex math, or a value converted to fp64 and not cast back
# on the same line (`net = MLP().double().cuda()`, `x.to(torch.float64)`). A small fp64 tensor created to sum
# metrics across ranks or a table computed in fp64 and cast back (`.double().log1p_()...float()`) does not make
# the training fp64, nor do `np.float64` arrays of visit counts or returns. Searched in code only (`in_code`).
FP64 = re.compile(r"\bset_default_dtype\(|\bset_default_tensor_type\([^)\n]*Double|\btorch\.(complex128|cdouble)\b|"
                  r"\bnn\.\w+\([^)\n]*dtype\s*=\s*torch\.(float64|double)\b|"
                  r"\.(double\(\)|(to|type)\(\s*(dtype\s*=\s*)?torch\.(float64|double|(cuda\.)?DoubleTensor)\s*\))"
                  r"(?![^\n]*\.float\(\))")


# A command-line switch into mixed precision: `--fp16`, `--use_amp`, `--fp16-precision`, `--mixed_precision`,
# `--deepspeed` (whose config sets the precision) (not `--no_amp`, a switch out of it).
_PRECISION_SWITCH = re.compile(
    r"-{1,2}(?!(?:no|disable)[_-])(?:\w+[_-])?(?:amp|fp16|bf16|half|mixed[_-]precision|deepspeed)(?:[_-]\w+)?")
_BARE_SWITCH = re.compile(r"-{1,2}(?:use[_-])?(?:amp|fp16|bf16|half|mixed[_-]precision|deepspeed)")
_LAUNCH_SUFFIXES = (".sh", ".md", ".rst", ".txt")
_LAUNCH_DEPTH = 3  # folders above the entry script searched for launch scripts, stopping at the project root


@lru_cache(maxsize=512)
def _switches_off_by_default(text: str, switch: re.Pattern = _PRECISION_SWITCH, bare: re.Pattern = _BARE_SWITCH
                             ) -> tuple[str, ...]:
    """The switches matching `switch` that an argument parser in `text` declares off unless passed
    (`action="store_true"`, `default=False`; with neither, a `bare` switch, which is None unless passed)."""
    if "add_argument" not in text:
        return ()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    found = []
    calls = [c for c in pyast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)]
    # `parser.set_defaults(enable_amp=True)` turns a `store_true` switch on by default
    on_by_default = {k.arg for c in calls if c.func.attr == "set_defaults" for k in c.keywords
                     if isinstance(k.value, ast.Constant) and k.value.value not in (False, 0, None, "False", "false")}
    for call in calls:
        if call.func.attr != "add_argument":
            continue
        flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        declared = next((flag for flag in flags if switch.fullmatch(flag)), None)
        if declared is not None and declared.lstrip("-").replace("-", "_") in on_by_default:
            continue
        options = {k.arg: k.value for k in call.keywords}
        action, default = options.get("action"), options.get("default")
        off = (isinstance(action, ast.Constant) and action.value == "store_true" and default is None) or (
            isinstance(default, ast.Constant) and default.value in (False, 0, "False", "false") and action is None) or (
            # `--deepspeed` with neither: None unless passed (not `--amp_level`, a setting with a value)
            action is None and default is None and declared is not None and bare.fullmatch(declared))
        if declared is not None and off:
            found.append(declared)
    return tuple(found)


@lru_cache(maxsize=64)
def _launch_texts(directory: str, top: str) -> str:
    """The shell scripts and documents beside an entry script and in the folders above it, up to the project root
    or `top`, the folder of the files being checked (where the commands that run it are written down)."""
    parts = []
    current = Path(directory)
    for _ in range(_LAUNCH_DEPTH):
        for folder in (current, current / "scripts"):
            try:
                files = sorted(folder.iterdir()) if folder.is_dir() else []
            except OSError:
                continue
            for file in files[:200]:
                if file.suffix.lower() in _LAUNCH_SUFFIXES and file.is_file():
                    try:
                        text = file.read_text(encoding="utf-8", errors="replace")[:200_000]
                    except OSError:
                        continue
                    parts.append(text if file.suffix.lower() == ".sh" else _commands(text))
        if any((current / marker).exists() for marker in (".git", "pyproject.toml", "setup.py")) \
                or str(current) == top or current.parent == current:
            break
        current = current.parent
    return "\n".join(parts)


# In a document, the command lines: fenced or indented code, or a line that starts a command. Prose that mentions an
# option ("You can add `--use_amp true` to train in AMP") describes a choice, not the documented run.
_FENCE = re.compile(r"^[ \t]*(```|~~~)")
_COMMAND_LINE = re.compile(r"^(?:[ \t]{4,}|[ \t]*(?:\$ |>>> |python|torchrun|deepspeed|accelerate |bash |sh |srun |"
                           r"CUDA_VISIBLE_DEVICES|OMP_NUM_THREADS|--))")


def _commands(document: str) -> str:
    """The command lines of a README or a text document (see `_COMMAND_LINE`)."""
    lines, fenced = [], False
    for line in document.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or _COMMAND_LINE.match(line):
            lines.append(line)
    return "\n".join(lines)


_AUTOCAST_CALL = re.compile(r"\bautocast\(")
_GATE_LINES = 3  # an `if args.amp:` this many lines above an autocast gates it


@lru_cache(maxsize=256)
def _ungated_autocast(text: str, switches: frozenset[str]) -> bool:
    """Does `text` enter an autocast that neither takes `enabled=` nor sits under an `if` naming a switch?"""
    if "autocast(" not in text:
        return False
    lines = text.splitlines()
    for match in _AUTOCAST_CALL.finditer(text):
        row = text.count("\n", 0, match.start())
        call = text[match.end():match.end() + 300].split(")", 1)[0]
        above = lines[max(0, row - _GATE_LINES):row + 1]
        gated = "enabled" in call or any(re.match(r"\s*(el)?if\b", line) and any(name in line for name in switches)
                                         for line in above)
        if not gated and in_code(_AUTOCAST_CALL, lines[row] + "\n"):
            return True
    return False


def precision_switched_off(ctx, texts: dict[str, str]) -> str | None:
    """The switch (`--use_amp`) or setting (`fp16_run`) when the program's mixed precision is opt-in: its argument
    parser declares a precision switch off by default and the project's documented run does not pass it, or (with no
    such switch) the code is gated by a setting declared off that nothing turns on. The default run then trains in
    fp32, whatever autocast or `.half()` the code holds behind the switch."""
    switches = [switch for text in texts.values() for switch in _switches_off_by_default(text)]
    if not switches:
        # settings rather than switches: `if hparams.fp16_run:` with `fp16_run=False` and nothing turning it on;
        # every such gate must be off (FSDP's `if cfg.mixed_precision:` on by default, `elif cfg.use_fp16:` off,
        # trains in bf16), and one made a switch by a helper (`add_dict_to_argparser`) may be passed at launch
        settings = sorted({m.group(1) for text in texts.values() for m in _PRECISION_GATE.finditer(text)})
        if not settings or not all(option_off_by_default(ctx, texts, name) and not _passed_at_launch(
                ctx, [f"--{name}"]) for name in settings):
            return None
        if any(_ungated_autocast(text, frozenset(settings)) for text in texts.values()):
            return None
        return settings[0]
    names = {switch.lstrip("-").replace("-", "_") for switch in switches}
    if any(_ungated_autocast(text, frozenset(names)) for text in texts.values()):
        return None  # an autocast the switch does not control: mixed precision whatever the switch says
    return None if _passed_at_launch(ctx, switches) else switches[0]


# `if hparams.fp16_run:` / `if cfg.use_amp:` / `if fp16:`: a setting that gates the mixed-precision code
# (named for the precision, maybe after `use_`/`enable_`: `fp16_run`, `use_amp`; not `warn_on_half`)
_PRECISION_GATE = re.compile(r"^[ \t]*(?:el)?if\s+(?:[\w.]+\.)?((?:use_|enable_)?(?:amp|fp16|bf16|half|mixed_precision)"
                             r"(?:_\w+)?)\s*:", re.M | re.I)


def _passed_at_launch(ctx, switches: list[str]) -> bool:
    """Does the project's documented run pass one of `switches` (not as `--x 0` / `--x=False`)? When its launch
    scripts and documents run this script both with and without the switch, the run without it is the default and
    the switch is an option: not passed."""
    folders = [str(Path(path).resolve().parent) for path in program_index(ctx).paths] or [ctx.path]
    launches = _launch_texts(str(Path(ctx.path).resolve().parent), os.path.commonpath(folders))
    passing = [re.compile(re.escape(switch) + r"(?![\w-])(?!\s*[= ]\s*(?:False|false|0)\b)") for switch in switches]
    if not any(pattern.search(launches) for pattern in passing):
        return False
    script = re.compile(rf"(?<![\w.-]){re.escape(Path(ctx.path).name)}\b")
    runs = [command for command in re.sub(r"\\[ \t]*\r?\n", " ", launches).splitlines() if script.search(command)]
    # (a command expanding shell variables, `$MODEL_FLAGS`, may pass the switch through them; `$ python ...` is a
    # prompt)
    return not any(not _SHELL_VARIABLE.search(command) and all(not pattern.search(command) for pattern in passing)
                   for command in runs)


_SHELL_VARIABLE = re.compile(r"\$\{?[A-Za-z_]")


def option_off_by_default(ctx, texts: dict[str, str], name: str) -> bool:
    """Is the option `name` (`flash` of `if self.flash:`) off unless a user turns it on? Declared off as a command-line
    switch (`--flash`, default 0) that no launch script passes, or as a setting (`flash: bool = False`, `FLASH = 0`)
    that nothing in the program sets to True."""
    switch = re.compile(rf"-{{1,2}}{re.escape(name)}", re.I)
    switches = [found for text in texts.values() for found in _switches_off_by_default(text, switch, switch)]
    if switches:
        return not _passed_at_launch(ctx, switches)
    declared_off = re.compile(rf"^[ \t]*(?:self\.)?{re.escape(name)}[ \t]*(?::[ \t]*bool[ \t]*)?=[ \t]*(?:False|0)\b",
                              re.M | re.I)
    turned_on = re.compile(rf"\b{re.escape(name)}[ \t]*=[ \t]*(?:True|1)\b", re.I)
    return any(declared_off.search(text) for text in texts.values()) \
        and not any(turned_on.search(text) for text in texts.values())


@lru_cache(maxsize=1 << 16)
def in_code(pattern: re.Pattern, text: str) -> bool:
    """Does `pattern` match `text` outside its comments and docstrings? (Tokenizes only texts that match;
    remembered, as `mentions` is.)"""
    return bool(_code_matches(pattern, text))


@lru_cache(maxsize=1 << 16)
def uses_low_precision(text: str) -> bool:
    """Does `text` run mixed or low precision (LOW_PRECISION in code)? An import alone runs nothing: `from apex
    import amp` in a `try:` that nothing uses afterwards leaves the training in fp32 (a use, `amp.initialize`,
    `with autocast():`, matches on its own line)."""
    return any(not _IMPORT_LINE.match(text, text.rfind("\n", 0, at) + 1) for at in _code_matches(LOW_PRECISION, text))


@lru_cache(maxsize=1 << 16)
def runs_in_fp64(text: str) -> bool:
    """Does `text` train in fp64 (FP64 in code)? A schedule table built in fp64 (`torch.linspace(b1, bT,
    T).double()`, a diffusion model's betas kept as a buffer and gathered as float) is not the training's precision."""
    return any(not _TABLE_LINE.search(text, start, text.find("\n", at) % (len(text) + 1))
               for at in _code_matches(FP64, text) for start in [text.rfind("\n", 0, at) + 1])


_TABLE_LINE = re.compile(r"\b(?:linspace|arange|logspace|cumprod)\(")
_IMPORT_LINE = re.compile(r"[ \t]*(?:from[ \t]+[\w.]+[ \t]+)?import\b")


def _code_matches(pattern: re.Pattern, text: str) -> list[int]:
    """Where `pattern` matches `text` outside its comments and docstrings."""
    matches = [m.start() for m in quick(pattern).finditer(text)]
    if not matches:
        return []
    spans = _comment_and_docstring_spans(text)
    starts = [start for start, _ in spans]  # in text order: the span that may hold `at` starts last before it
    return [at for at in matches if (index := bisect.bisect_right(starts, at) - 1) < 0 or at >= spans[index][1]]


@lru_cache(maxsize=256)
def _comment_and_docstring_spans(text: str) -> tuple[tuple[int, int], ...]:
    """Character spans of the comments and of the strings that stand alone as statements."""
    line_starts = [0]
    for line in text.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    spans = []
    previous = tokenize.NEWLINE
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT or token.type == tokenize.STRING and previous in (
                    tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL):
                (row, col), (end_row, end_col) = token.start, token.end
                spans.append((line_starts[row - 1] + col, line_starts[end_row - 1] + end_col))
            if token.type not in (tokenize.COMMENT, tokenize.NL):
                previous = token.type
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass  # an unreadable tail: what was read counts
    return tuple(spans)
