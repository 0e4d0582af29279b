"""Lint one source: one libcst parse, one pre-pass of shared analyses, all rules in one traversal."""

from __future__ import annotations

import ast
import dataclasses
import functools
import gc
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import libcst as cst
from libcst._nodes.internal import CodegenState

from gpulint import legacy
from gpulint.analysis import FileAnalysis, FileStructure, analyze, is_node_type, traverse, walk
from gpulint.diagnostics import Diagnostic, Edit, Fix, Position, Severity
from gpulint.program import hogwild_program
from gpulint.registry import META_CODES
from gpulint.semantic.callgraph import Frequency, ProgramCalls, call_graph_state
from gpulint.rule import DefinitionRequest, ImportRequest, Report, Rule, RuleContext
from gpulint.source import newline_of
from gpulint.suppressions import apply_suppressions
from gpulint.textscan import quick


@dataclass
class ProgramFacts:
    """Facts about all files of one run (the program is what the command line names)."""

    cuda_evidence: bool = False
    maybe_cuda_evidence: bool = False
    module_classes: set[str] = field(default_factory=set)
    sources: dict[str, str] = field(default_factory=dict)  # path -> text of every file in the run
    searched: bool = False  # set when a rule looked at other files (the result then depends on the program)
    # the sources do not change during a run: each pattern is searched once, not once per call site
    _found: dict[tuple[str, int], list[tuple[str, re.Match[str]]]] = field(default_factory=dict, repr=False,
                                                                           compare=False)
    _derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # the program's call graph, reduced to what files need (computed once, in the parent before workers start)
    _frequencies: dict[str, dict[str, Frequency]] | None = field(default=None, repr=False, compare=False)
    _step_names: tuple[frozenset[str], ...] = field(default=(frozenset(), frozenset(), frozenset()), repr=False,
                                                    compare=False)

    def summary(self) -> tuple:
        """The facts every rule may see (cache key)."""
        self._build_call_graph()
        return (self.cuda_evidence, self.maybe_cuda_evidence, sorted(self.module_classes),
                sorted((path, sorted((k, int(f)) for k, f in keys.items())) for path, keys in self._frequencies.items()),
                [sorted(names) for names in self._step_names])

    def _build_call_graph(self) -> None:
        if self._frequencies is None:
            self._frequencies, self._step_names = call_graph_state(self.sources, frozenset(self.module_classes))

    @property
    def has_call_graph(self) -> bool:
        return self._frequencies is not None

    def call_graph_state(self) -> tuple:
        """What the call graph leaves for the files (small; it travels from the process that built it)."""
        self._build_call_graph()
        return self._frequencies, self._step_names

    def set_call_graph_state(self, state: tuple) -> None:
        self._frequencies, self._step_names = state

    def calls_for(self, path: str) -> ProgramCalls:
        """How often the functions of `path` run, as the program's call graph says."""
        self._build_call_graph()
        return ProgramCalls(self._frequencies.get(path, {}), *self._step_names)  # type: ignore[union-attr]

    def search(self, pattern: str | re.Pattern[str]) -> list[tuple[str, re.Match[str]]]:
        """Matches of a regex in all files of the program (program-level rules: TF32 set elsewhere, ...)."""
        self.searched = True
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        key = (regex.pattern, regex.flags)
        if key not in self._found:
            with program_work():
                self._found[key] = [(path, match) for path, text in self.sources.items()
                                    for match in quick(regex).finditer(text)]
        return self._found[key]

    def derived(self, key: str, build: Callable[["ProgramFacts"], Any]) -> Any:
        """A value computed once per run from the program's texts (an index of its definitions, ...), shared by
        every file and call site. Like `search`, reading it makes the file's result depend on the program."""
        self.searched = True
        if key not in self._derived:
            with program_work():
                self._derived[key] = build(self)
        return self._derived[key]

    @classmethod
    def of_single_file(cls, path: str, text: str, analysis: FileAnalysis) -> "ProgramFacts":
        return cls(analysis.cuda_evidence, analysis.maybe_cuda_evidence,
                   {name for name, info in analysis.classes.items() if info.is_module}, {path: text})


# Called with True before and False after work done once per run for every file of the program (a search of all
# its texts): a worker tells its parent, so that the time is not charged to the file that happened to ask first.
PROGRAM_WORK_LISTENER: Callable[[bool], None] | None = None


_PROGRAM_WORK_DEPTH = [0]  # nested program work (a derived index that searches) is told once


@contextmanager
def program_work() -> Iterator[None]:
    listener = PROGRAM_WORK_LISTENER if _PROGRAM_WORK_DEPTH[0] == 0 else None
    _PROGRAM_WORK_DEPTH[0] += 1
    if listener is not None:
        listener(True)
    try:
        yield
    finally:
        _PROGRAM_WORK_DEPTH[0] -= 1
        if listener is not None:
            listener(False)


class RuleCrash(Exception):
    """A rule raised while linting a file: a gpulint bug, reported with exit code 2."""

    def __init__(self, code: str, path: str, error: BaseException) -> None:
        super().__init__(f"{path}: rule {code} crashed: {type(error).__name__}: {error}")
        self.code = code


@dataclass
class LintResult:
    path: str
    diagnostics: list[Diagnostic]
    module: cst.Module | None = None
    analysis: FileAnalysis | None = None


def parse(text: str) -> cst.Module:
    """libcst's parser only builds valid nodes, yet each node re-validates itself on construction (17% of
    parse time, measured on timm): that check is off while parsing and stays on for nodes that fixes build.

    Guarded: libcst's native parser crashes the process on some inputs (about 2,000 nested brackets, a
    20,000-term `and` chain) and takes minutes on others. A file that looks unusual (deep brackets, very long
    lines, a large size: a cheap scan) is first given to CPython's parser, and a file CPython rejects raises
    SyntaxError here, like a syntax error, without reaching libcst. A RecursionError inside libcst is re-raised
    as SyntaxError when CPython rejects the file too, else as `TooComplex`."""
    if _looks_unusual(text):
        rejected = _python_syntax_error(text, "<file>")
        if rejected is not None:
            raise rejected
    validate = _NODE_BASE.__dict__.get("__post_init__")
    try:
        if validate is None:  # a libcst without the per-node hook: nothing to skip
            return cst.parse_module(text)
        _NODE_BASE.__post_init__ = _skip_validation  # type: ignore[method-assign]
        try:
            return cst.parse_module(text)
        finally:
            _NODE_BASE.__post_init__ = validate  # type: ignore[method-assign]
    except (RecursionError, MemoryError) as error:
        rejected = _python_syntax_error(text, "<file>")
        if rejected is not None:
            raise rejected from None
        raise TooComplex(f"too deeply nested for gpulint's parser ({type(error).__name__}); not checked") from None


class TooComplex(Exception):
    """A file CPython accepts but gpulint cannot parse (libcst's recursion): reported as the file's GPU901."""


# The guard's thresholds: CPython rejects more than 200 nested brackets and, at the default recursion limit,
# expressions about 3,000 levels deep (a 3,000-term `+` chain, 3,000 chained attributes); libcst crashes or
# slows down sharply well before its own limits on such files. Ordinary code stays far below all three.
_GUARD_DEPTH = 100  # brackets open at once (strings and comments are not told apart: a false alarm only costs
# one CPython parse)
_GUARD_LINE = 4_000  # characters on one line
_GUARD_SIZE = 256_000  # characters in the file
_BRACKETS = re.compile(r"[()\[\]{}]")
_LONG_LINE = re.compile(r"[^\n]{%d}" % _GUARD_LINE)


def _looks_unusual(text: str) -> bool:
    if len(text) > _GUARD_SIZE or _LONG_LINE.search(text) is not None:
        return True
    if text.count("(") + text.count("[") + text.count("{") < _GUARD_DEPTH:
        return False
    depth = 0
    for match in _BRACKETS.finditer(text):
        if match.group() in "([{":
            depth += 1
            if depth > _GUARD_DEPTH:
                return True
        elif depth:
            depth -= 1
    return False


_NODE_BASE = cst.CSTNode


def _skip_validation(self: cst.CSTNode) -> None:
    return None


def syntax_error_diagnostic(path: str, error: cst.ParserSyntaxError | SyntaxError | Exception) -> Diagnostic:
    kind = "SyntaxError"
    if isinstance(error, cst.ParserSyntaxError):
        line, col, message = error.raw_line, error.raw_column + 1, error.message
    elif isinstance(error, SyntaxError):
        line, col, message = error.lineno or 1, error.offset or 1, error.msg
        kind = getattr(error, "gpulint_kind", kind)
    else:
        line, col, message = 1, 1, str(error)
    message = " ".join(str(message).split())
    position = Position(max(line, 1), max(col, 1))
    return Diagnostic(path, position, position, "GPU900", META_CODES["GPU900"], f"{kind}: {message}",
                      Severity.ERROR)


def _python_syntax_error(text: str, path: str) -> SyntaxError | None:
    """CPython's own message and location, which are more precise than the libcst parser's. A file too deep or
    too large for CPython's parser (RecursionError, MemoryError) is rejected by Python too: a SyntaxError whose
    message says which limit it hit."""
    try:
        compile(text, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as error:
        return error
    except (RecursionError, MemoryError) as error:
        detail = str(error) or "the parser ran out of memory"
        rejected = SyntaxError(f"{detail} (Python's parser rejects this file: too deeply nested or too complex)")
        rejected.lineno, rejected.offset = 1, 1
        rejected.gpulint_kind = type(error).__name__  # type: ignore[attr-defined]
        return rejected
    except ValueError:
        return None
    return None


python_syntax_error = _python_syntax_error


class _Dispatcher:
    """Runs every rule's visit_/leave_ methods in a single traversal, keeping the ancestor stack. It walks the
    tree with `analysis.traverse` (libcst's visiting order, tokens and whitespace left out)."""

    def __init__(self, rules: Sequence[Rule], ctx: RuleContext, path: str) -> None:
        self.ctx = ctx
        self.path = path
        self.visitors: dict[str, list[tuple[Rule, Callable]]] = {}
        self.leavers: dict[str, list[tuple[Rule, Callable]]] = {}
        for rule in rules:
            for attr in _hooks(type(rule)):
                table = self.visitors if attr.startswith("visit_") else self.leavers
                table.setdefault(attr[6:], []).append((rule, getattr(rule, attr)))

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.ctx.ancestors.append(node)
        hooks = self.visitors.get(type(node).__name__)
        if hooks is not None:  # (the calls are inline: this runs for every node of every file)
            for rule, method in hooks:
                try:
                    method(node)
                except Exception as exc:  # noqa: BLE001 - surfaced as a RuleCrash naming the rule
                    raise RuleCrash(rule.code, self.path, exc) from exc
        return True

    def on_leave(self, node: cst.CSTNode) -> None:
        hooks = self.leavers.get(type(node).__name__)
        if hooks is not None:
            for rule, method in hooks:
                try:
                    method(node)
                except Exception as exc:  # noqa: BLE001
                    raise RuleCrash(rule.code, self.path, exc) from exc
        self.ctx.ancestors.pop()


@functools.lru_cache(maxsize=None)
def _hooks(rule: type[Rule]) -> tuple[str, ...]:
    """The `visit_*` / `leave_*` methods of a rule class, in `dir` order (looked up once per class, not per file)."""
    return tuple(attr for attr in dir(rule) if attr.startswith(("visit_", "leave_")))


def might_match(text: str, rules: Iterable[type[Rule]]) -> list[type[Rule]]:
    """Rules whose cheap text triggers occur in `text` (no trigger: always run). A file that names neither torch
    nor CUDA (nor `Tensor`, `nn.`, the `TORCH*`/`CUBLAS*` settings) and calls no `.to(`, `.item(` or
    `.backward(` (a training helper need not import torch) is no PyTorch code: no built-in rule runs on it but,
    when it is a script (a `__main__` block or a top-level loop), those reported at a program's training entry
    (rules defined elsewhere, e.g. in a plugin, decide by their own triggers)."""
    pytorch = _PYTORCH_TEXT.search(text) is not None
    entry = not pytorch and _ENTRY_TEXT.search(text) is not None
    return [r for r in rules if (pytorch or entry and r.at_training_entry or not r.__module__.startswith(_BUILTIN_RULES))
            and (not r.triggers or any(t in text for t in r.triggers))]


# A script's entry: a `__main__` block or a loop at the top level
_ENTRY_TEXT = re.compile(r"__main__|^(?:for|while)\b", re.M)


_BUILTIN_RULES = "gpulint.rules."


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """No cyclic-collector passes while a file is linted. A syntax tree is millions of objects without reference
    cycles (freed by reference counting); the collector's passes over them cost a fifth to a third of the time,
    free nothing, and grow with the tree (they made lint time superlinear in file size). It runs again after."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


_PYTORCH_TEXT = re.compile(r"torch|cuda|tensor|nn\.|cublas|backward\(|\.to\(|\.item\(", re.I)


@cyclic_gc_paused()
def lint_text(
    text: str,
    path: str,
    rules: Sequence[type[Rule]],
    *,
    program: ProgramFacts | None = None,
    rule_options: dict[str, dict[str, Any]] | None = None,
    module: cst.Module | None = None,
    analysis: FileAnalysis | None = None,
    cuda_evidence: tuple[bool, bool] | None = None,
) -> LintResult:
    """Lint `text`. Syntax errors become a GPU900 diagnostic; a crashing rule raises RuleCrash.

    `cuda_evidence` (certain, maybe) replaces what the file itself shows: the fixer passes the evidence of the
    text the user wrote, so that a fix's own `torch.cuda.is_available()` cannot create findings elsewhere."""
    active = might_match(text, rules)
    if not active and module is None:
        # no rule can match: CPython's parser (fast) still reports syntax errors; libcst is not needed
        error = _python_syntax_error(text, path)
        if error is not None:
            return LintResult(path, [syntax_error_diagnostic(path, error)])
        return LintResult(path, apply_suppressions([], text, path, (r.code for r in rules)))
    if module is None:
        try:
            module = parse(text)
        except cst.ParserSyntaxError as error:
            python_error = _python_syntax_error(text, path)
            if python_error is None:  # valid Python that libcst cannot read: not a syntax error of the user's
                start = Position(1, 1)
                message = " ".join(f"gpulint's parser (libcst) cannot read this file although Python accepts it "
                                   f"({error.message}); not checked".split())
                return LintResult(path, [Diagnostic(path, start, start, "GPU901", META_CODES["GPU901"], message,
                                                    Severity.ERROR)])
            old_spelling = legacy.repair(text)
            if old_spelling is not None:
                return _lint_old_spelling(old_spelling, path, rules, program, rule_options)
            return LintResult(path, [syntax_error_diagnostic(path, python_error)])
        except SyntaxError as error:  # rejected by CPython before libcst was asked (the parse guard)
            return LintResult(path, [syntax_error_diagnostic(path, error)])
        except TooComplex as error:
            start = Position(1, 1)
            return LintResult(path, [Diagnostic(path, start, start, "GPU901", META_CODES["GPU901"], str(error),
                                                Severity.ERROR)])
    if not active:
        return LintResult(path, apply_suppressions([], text, path, (r.code for r in rules)), module, analysis)
    if analysis is None:
        calls = (program if program is not None and path in program.sources
                 else ProgramFacts(sources={path: text})).calls_for(path)
        analysis = analyze(module, program.module_classes if program else None, calls)
    if cuda_evidence is not None:
        analysis.cuda_evidence, analysis.maybe_cuda_evidence = cuda_evidence
    program = program or ProgramFacts.of_single_file(path, text, analysis)
    ctx = RuleContext(path, module, analysis, program, rule_options or {})
    if hogwild_program(ctx):  # CPU workers training a shared-memory network: no GPU in the program
        active = [rule for rule in active if rule.on_cpu_too or not rule.__module__.startswith(_BUILTIN_RULES)]
    instances = [rule(ctx) for rule in active]
    dispatcher = _Dispatcher(instances, ctx, path)
    traverse(module, dispatcher.on_visit, dispatcher.on_leave)
    for rule in instances:
        try:
            rule.finish()
        except Exception as exc:  # noqa: BLE001
            raise RuleCrash(rule.code, path, exc) from exc
    reports = [(rule, report) for rule in instances for report in rule.reports]
    if not reports:
        return LintResult(path, apply_suppressions([], text, path, (r.code for r in rules)), module, analysis)
    positions = _Positions(module, _needed_nodes(reports, module, analysis), text)
    newline = newline_of(text)
    indents = _Indents(module, analysis)
    diagnostics = [_to_diagnostic(path, rule, report, positions, module, analysis, newline, indents, text)
                   for rule, report in reports]
    diagnostics = apply_suppressions(diagnostics, text, path, (r.code for r in rules))
    unique = {(d.start, d.end, d.code, d.message): d for d in diagnostics}
    return LintResult(path, sorted(unique.values(), key=Diagnostic.sort_key), module, analysis)


def _lint_old_spelling(old_spelling: legacy.Repair, path: str, rules: Sequence[type[Rule]],
                       program: "ProgramFacts | None", rule_options: dict[str, dict[str, Any]] | None) -> LintResult:
    """A torch <= 0.3 file (`x.cuda(async=True)`): the syntax error, then the findings of the file read as it
    meant it, at the user's columns and without fixes (they would rewrite text the user did not write)."""
    line, column = old_spelling.first
    error = Diagnostic(path, Position(line, column), Position(line, column + len("async")), "GPU900",
                       META_CODES["GPU900"], "SyntaxError: `async` is a reserved word since Python 3.7; torch "
                       "renamed this argument `non_blocking` (0.4). The rest of the file was checked as if it said "
                       "`non_blocking=`", Severity.ERROR)
    found = lint_text(old_spelling.text, path, rules, program=program, rule_options=rule_options).diagnostics
    moved = [dataclasses.replace(
        d, start=Position(d.start.line, old_spelling.original_column(d.start.line, d.start.col)),
        end=Position(d.end.line, old_spelling.original_column(d.end.line, d.end.col)), fix=None) for d in found]
    return LintResult(path, sorted([error, *moved], key=Diagnostic.sort_key))


def _position(positions: dict[int, tuple[int, int, int, int]], node: cst.CSTNode) -> tuple[Position, Position]:
    start_line, start_column, end_line, end_column = positions[id(node)]
    return Position(start_line, start_column + 1), Position(end_line, end_column + 1)


def node_positions(module: cst.Module, wanted: Iterable[cst.CSTNode] | None = None, text: str | None = None
                   ) -> dict[int, tuple[int, int, int, int]]:
    """id(node) -> (start line, start column, end line, end column) of every node of `module`, as libcst's
    PositionProvider computes them (lines from 1, columns from 0), from one code generation. The provider
    itself costs nearly twice as much: its wrapper walks the tree once more, and each position is an object.

    With `wanted`, the code generation stops once the last of those nodes is done (a node's range is final when
    its own code generation ends): the ranges of the nodes before it are complete, later ones are missing.
    With `wanted` and the module's source `text`, only the top-level statements that hold a wanted node are
    generated (`_positions_by_statement`): the ranges of their nodes, and no others."""
    if wanted is not None and text is not None:
        wanted = list(wanted)
        placed = _positions_by_statement(module, wanted, text)
        if placed is not None:
            return placed
    state = _PositionState(module.default_indent, module.default_newline)
    if wanted is not None:
        state.waiting = {id(node) for node in wanted}
        if not state.waiting:
            return state.ranges
    try:
        module._codegen(state)
    except _AllPlaced:
        pass
    return state.ranges


def _positions_by_statement(module: cst.Module, wanted: list[cst.CSTNode], text: str
                            ) -> dict[int, tuple[int, int, int, int]] | None:
    """The ranges of the nodes in the top-level statements that hold a wanted node, each statement generated on
    its own and placed where its code stands in `text` (lossless: a top-level statement's code is a slice of the
    file that starts a line). Generating the statements between them is what this saves, a third to a half of
    all position time. None (the caller generates the module) when a wanted node is in no statement, a
    statement's code is not found exactly once at the start of a line, or more than `_PLACED_STATEMENTS`
    statements hold wanted nodes (each placement searches the text: many of them would cost more than one
    generation of the whole module, and grow with the square of the file's size)."""
    if not module.has_trailing_newline:
        return None  # the last statement's code ends with a newline the text lacks
    remaining = {id(node) for node in wanted}
    holding: list[cst.BaseStatement] = []
    for full_walk in (False, True):  # syntax nodes first (their children are remembered); tokens if still missing
        for statement in module.body:
            if not remaining:
                break
            inside = remaining.intersection(map(id, _every_node(statement) if full_walk
                                                else walk(statement, into_functions=True)))
            if inside:
                holding.append(statement)
                remaining -= inside
                if len(holding) > _PLACED_STATEMENTS:
                    return None
    if remaining:
        return None
    ranges: dict[int, tuple[int, int, int, int]] = {}
    order = {id(statement): index for index, statement in enumerate(module.body)}
    for statement in sorted(holding, key=lambda s: order[id(s)]):
        state = _PositionState(module.default_indent, module.default_newline)
        statement._codegen(state)
        code = "".join(state.tokens)
        at = text.find(code)
        if at < 0 or (at > 0 and text[at - 1] not in "\r\n") or text.find(code, at + 1) >= 0:
            return None
        lines_before = len(_NEWLINES.findall(text, 0, at))
        ranges.update((key, (start + lines_before, column, end + lines_before, end_column))
                      for key, (start, column, end, end_column) in state.ranges.items())
    return ranges


# Top-level statements placed by their text at most (see `_positions_by_statement`).
_PLACED_STATEMENTS = 16


def _every_node(root: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`root` and every node below it, whitespace and tokens included."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for name in node.__dataclass_fields__:
            value = getattr(node, name)
            if type(value) is list or type(value) is tuple:
                stack.extend(item for item in value if is_node_type(type(item)))
            elif is_node_type(type(value)):
                stack.append(value)


class _AllPlaced(Exception):
    """Raised inside the code generation once every wanted node has its range."""


class _Positions(dict):
    """The ranges `_to_diagnostic` asks for: those of the nodes named up front, from a code generation that
    stops after the last of them; a node not named (none should be) gets the full code generation."""

    def __init__(self, module: cst.Module, wanted: list[cst.CSTNode], text: str) -> None:
        super().__init__(node_positions(module, wanted, text))
        self.module = module
        self.complete = False

    def __missing__(self, key: int) -> tuple[int, int, int, int]:
        if self.complete:
            raise KeyError(key)
        self.update(node_positions(self.module))
        self.complete = True
        return self[key]


def _needed_nodes(reports: Sequence[tuple[Rule, Report]], module: cst.Module, analysis: FileAnalysis
                  ) -> list[cst.CSTNode]:
    """Every node whose position `_to_diagnostic` reads for these reports (see `_build_fix`, `_import_edit`)."""
    needed: list[cst.CSTNode] = []
    for _, report in reports:
        needed.append(report.node)
        if report.safety is None:
            continue
        needed.extend(old for old, _ in report.replacements)
        if any(isinstance(request, DefinitionRequest) for request in report.imports):
            anchor = _definition_anchor(module, analysis)
            needed.extend([anchor] if anchor is not None else module.body[-1:])
        if report.imports:
            if analysis.import_nodes:
                needed.append(analysis.import_nodes[-1])
            else:
                for statement in module.body:
                    needed.append(statement)
                    if not _is_docstring_or_future(statement):
                        break
    return needed


class _PositionState(CodegenState):
    """Code generation that tracks the line and column and records each node's range: the syntactic range
    where a node's code generation records one (hoisted from `start_node`/`end_node` when given), else the
    whitespace-inclusive range around it, as PositionProvider does."""

    def __init__(self, default_indent: str, default_newline: str) -> None:
        super().__init__(default_indent=default_indent, default_newline=default_newline)
        self.line = 1
        self.column = 0
        self.ranges: dict[int, tuple[int, int, int, int]] = {}
        self._starts: list[tuple[int, int]] = []
        self.waiting: set[int] | None = None  # ids of the nodes still to place (None: all nodes)

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        if "\n" in value or "\r" in value:
            segments = _NEWLINES.split(value)
            self.line += len(segments) - 1
            self.column = len(segments[-1])
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        key = id(node)
        self.ranges.setdefault(key, (start[0], start[1], self.line, self.column))
        waiting = self.waiting
        if waiting is not None and key in waiting:
            waiting.discard(key)
            if not waiting:
                raise _AllPlaced

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> "_SyntacticRange":
        return _SyntacticRange(self, node, start_node, end_node)


class _SyntacticRange:
    """The context manager libcst's code generation wraps around a node's syntactic part (a class, not a
    generator: it runs for most nodes)."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _PositionState, node: cst.CSTNode, start_node: cst.CSTNode | None,
                 end_node: cst.CSTNode | None) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node
        self.start = (state.line, state.column)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> bool:
        if exc_info[0] is not None:
            return False  # the code generation stopped (all wanted nodes placed): the ranges left are not needed
        state = self.state
        start = state.ranges[id(self.start_node)][:2] if self.start_node is not None else self.start
        end = state.ranges[id(self.end_node)][2:] if self.end_node is not None else (state.line, state.column)
        state.ranges[id(self.node)] = (*start, *end)
        return False


_NEWLINES = re.compile(r"\r\n?|\n")


class _Indents:
    """Indentation tokens of the blocks around a node, so multi-line replacements keep their indentation."""

    def __init__(self, module: cst.Module, analysis: FileAnalysis) -> None:
        self.module = module
        self.analysis = analysis

    def tokens_for(self, node: cst.CSTNode) -> list[str]:
        parents = FileStructure.of(self.analysis).parents
        tokens = []
        current = parents.get(id(node))
        while current is not None:
            if isinstance(current, cst.IndentedBlock):
                tokens.append(current.indent if current.indent is not None else self.module.default_indent)
            current = parents.get(id(current))
        return tokens[::-1]


def render(node: cst.CSTNode, module: cst.Module, indent_tokens: list[str]) -> str:
    """Code for an expression-level node as it reads at a position nested in `indent_tokens` blocks."""
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    state.indent_tokens.extend(indent_tokens)
    node._codegen(state)
    return "".join(state.tokens)


@functools.lru_cache(maxsize=4)
def _lines(text: str) -> list[str]:
    """`text`'s lines with their ends, split once per file (callers must not change the list): a file with a
    statement fix per function was split again for each, quadratic in its size."""
    return text.splitlines(keepends=True)


def _render_statement(old: cst.CSTNode, new: cst.CSTNode, module: cst.Module, tokens: list[str], text: str,
                      start: Position, end: Position) -> str:
    """Statement replacements: the position range excludes the leading indentation/blank lines and the last
    line's trailing comment and newline, which rendering includes; strip what lies outside the range."""
    rendered_old = render(old, module, tokens)
    lines = _lines(text)
    if start.line == end.line:
        inside = lines[start.line - 1][start.col - 1:end.col - 1]
    else:
        inside = "".join([lines[start.line - 1][start.col - 1:], *lines[start.line:end.line - 1],
                          lines[end.line - 1][:end.col - 1]])
    at = rendered_old.find(inside)
    if at < 0:
        raise ValueError("cannot place a statement replacement")
    prefix, suffix = rendered_old[:at], rendered_old[at + len(inside):]
    rendered_new = render(new, module, tokens)
    if not rendered_new.startswith(prefix) or not rendered_new.endswith(suffix):
        raise ValueError("a statement replacement must keep the statement's leading lines and trailing comment")
    return rendered_new[len(prefix):len(rendered_new) - len(suffix)]


def _build_fix(rule: Rule, report: Report, positions: Any, module: cst.Module, analysis: FileAnalysis,
               newline: str, indents: _Indents, text: str) -> Fix:
    edits = []
    for old, new in report.replacements:
        old_start, old_end = _position(positions, old)
        if isinstance(new, str):
            content = new
        elif isinstance(old, (cst.BaseStatement, cst.BaseSmallStatement)):
            content = _render_statement(old, new, module, indents.tokens_for(old), text, old_start, old_end)
        else:
            content = render(new, module, indents.tokens_for(old))
        if newline != "\n":
            content = content.replace("\r\n", "\n").replace("\n", newline)
        edits.append(Edit(old_start, old_end, content))
    edits.extend(_definition_edit(request, module, analysis, positions, newline)
                 if isinstance(request, DefinitionRequest) else _import_edit(request, module, analysis, positions, newline)
                 for request in report.imports)
    return Fix(rule.fix_title or "", report.safety, tuple(sorted(edits, key=lambda e: (e.start, e.end))))


def _to_diagnostic(path: str, rule: Rule, report: Report, positions: Any, module: cst.Module,
                   analysis: FileAnalysis, newline: str, indents: _Indents, text: str) -> Diagnostic:
    start, end = _position(positions, report.node)
    fix = None
    if report.safety is not None:
        try:
            fix = _build_fix(rule, report, positions, module, analysis, newline, indents, text)
        except ValueError:
            fix = None  # a replacement that cannot be placed faithfully is dropped, the finding stays
    return Diagnostic(path, start, end, rule.code, rule.name, report.message, report.severity, fix, report.note)


def _import_edit(request: ImportRequest, module: cst.Module, analysis: FileAnalysis, positions: Any,
                 newline: str) -> Edit:
    """Insert `import x` after the last top-level import, else after the docstring / __future__ lines."""
    if analysis.import_nodes:
        where = _line_after(positions, analysis.import_nodes[-1])
    else:
        where = Position(1, 1)
        for statement in module.body:
            if _is_docstring_or_future(statement):
                where = _line_after(positions, statement)
            else:
                break
        if where == Position(1, 1) and module.body:
            start, _ = _position(positions, module.body[0])
            where = Position(start.line, 1)
    return Edit(where, where, request.statement() + newline)


def _line_after(positions: Any, statement: cst.CSTNode) -> Position:
    """The start of the line below a statement: where text inserted after it goes."""
    _, end = _position(positions, statement)
    return Position(end.line, 1) if end.col == 1 else Position(end.line + 1, 1)


def _definition_anchor(module: cst.Module, analysis: FileAnalysis) -> cst.CSTNode | None:
    """The first top-level statement after the imports (and the docstring / __future__ lines); None at the end."""
    last_import = analysis.import_nodes[-1] if analysis.import_nodes else None
    after = last_import is None
    for statement in module.body:
        if not after:
            after = statement is last_import
        elif last_import is not None or not _is_docstring_or_future(statement):
            return statement
    return None


def _definition_edit(request: DefinitionRequest, module: cst.Module, analysis: FileAnalysis, positions: Any,
                     newline: str) -> Edit:
    """Insert a definition a fix relies on before the first statement after the imports (at the end of a file of
    imports only), below the blank lines that follow the imports and above the statement's own comments."""
    anchor = _definition_anchor(module, analysis)
    code = request.statement()
    if anchor is not None:
        start, _ = _position(positions, anchor)
        # after the blank lines that follow the imports, above any comment that belongs to the statement
        lines = list(getattr(anchor, "leading_lines", ()))
        blank = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
        where = Position(start.line - len(lines) + blank, 1)
        if not blank:
            code = "\n\n" + code
    else:
        where = _line_after(positions, module.body[-1])
        code = "\n\n" + request.code + "\n"
    return Edit(where, where, code.replace("\n", newline))


def _is_docstring_or_future(statement: cst.CSTNode) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
        return True
    return isinstance(small, cst.ImportFrom) and not small.relative and \
        getattr(small.module, "value", None) == "__future__"
