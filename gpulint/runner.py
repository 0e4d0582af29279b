"""Orchestrates a run: discover files, gather program facts, lint or fix each file, collect results."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import pickle
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from gpulint.analysis import IS_AVAILABLE_TEXT, PROGRAM_CUDA_TEXT
from gpulint.cache import ResultCache, code_fingerprint, content_hash, digest
from gpulint.diagnostics import Diagnostic, Position, Safety, Severity
from gpulint.discovery import discover, find_project_root
from gpulint.engine import ProgramFacts, RuleCrash, lint_text
from gpulint.fixer import FixOutcome, fix_text
from gpulint.program import imported_files
from gpulint.registry import META_CODES, rule_by_code
from gpulint.rule import Rule
from gpulint.source import SourceError, SourceFile, read_source, write_source_atomically

_MAYBE_CUDA_TEXT = re.compile(IS_AVAILABLE_TEXT)
_CLASS_TEXT = re.compile(r"^\s*class\s+(\w+)\s*\(([^)]*)\)", re.M)


@dataclass
class FileReport:
    path: str  # as shown to the user
    diagnostics: list[Diagnostic] = field(default_factory=list)
    fix: FixOutcome | None = None
    original: str | None = None  # text as read (code frames, diffs)
    written: bool = False
    error: str | None = None  # one-line problem with this file (fix not written, ...)


@dataclass
class RunResult:
    files: list[FileReport]
    errors: list[str]  # internal errors (rule crashes): exit code 2

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return [d for f in self.files for d in f.diagnostics]


def display_path(path: Path) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative


def program_facts(sources: Sequence[tuple[str, SourceFile]]) -> ProgramFacts:
    """Cheap text-level facts about all files of the run, so that no file is parsed twice."""
    facts = ProgramFacts()
    known_bases = {"Module", "LightningModule"}
    classes: dict[str, str] = {}
    for path, source in sources:
        text = facts.sources[path] = source.text
        # the literal tests first: most files name neither, and the regexes have no literal prefix to skip by
        facts.cuda_evidence |= ("cuda" in text or "nccl" in text) and bool(PROGRAM_CUDA_TEXT.search(text))
        facts.maybe_cuda_evidence |= "is_available" in text and bool(_MAYBE_CUDA_TEXT.search(text))
        for name, bases in _CLASS_TEXT.findall(text):
            classes[name] = bases
    changed = True
    while changed:  # a class is a Module if a base's last dotted part is a known Module class
        changed = False
        for name, bases in classes.items():
            if name not in facts.module_classes and any(
                    part.strip().rsplit(".", 1)[-1] in known_bases | facts.module_classes
                    for part in bases.split(",")):
                facts.module_classes.add(name)
                changed = True
    return facts


_CONTEXT_DEPTH = 3  # import levels followed from the files named on the command line
_CONTEXT_LIMIT = 300  # files read for context at most


def _imported_context(sources: Sequence[tuple[str, SourceFile]]) -> list[tuple[str, SourceFile]]:
    """First-party modules the run's files import (transitively) that the run does not lint: read, not linted,
    so that `gpulint check train.py` (or a pre-commit hook given only the changed files) sees the same program
    as `gpulint check .`: TF32 set in an imported config module, the network defined in `models.py`."""
    seen = {str(source.path.resolve()) for _, source in sources}
    roots: dict[Path, Path] = {}
    context: list[tuple[str, SourceFile]] = []
    frontier = list(sources)
    for _ in range(_CONTEXT_DEPTH):
        following: list[tuple[str, SourceFile]] = []
        for _, source in frontier:
            folder = source.path.resolve().parent
            root = roots.setdefault(folder, find_project_root(folder))
            for found in imported_files(source.path, source.text, root):
                key = str(found.resolve())
                if key in seen or len(context) >= _CONTEXT_LIMIT:
                    continue
                seen.add(key)
                try:
                    read = read_source(found)
                except SourceError:
                    continue  # context only: a file the run cannot read is simply not consulted
                following.append((display_path(found), read))
        context.extend(following)
        frontier = following
    return context


def _always(diagnostic: Diagnostic) -> bool:
    return True


def _io_error(path: str, message: str) -> Diagnostic:
    start = Position(1, 1)
    return Diagnostic(path, start, start, "GPU901", META_CODES["GPU901"], message, Severity.ERROR)


def run(
    paths: Sequence[str],
    rules: Sequence[type[Rule]],
    *,
    fix: bool = False,
    write: bool = False,
    min_safety: Safety = Safety.SAFE,
    excludes: Sequence[str] | None = None,
    respect_gitignore: bool = True,
    rule_options: dict[str, dict[str, Any]] | None = None,
    can_fix: Callable[[Diagnostic], bool] = _always,
    file_filter: Callable[[Path], Sequence[type[Rule]]] | None = None,
    options_for: Callable[[Path], dict[str, dict[str, Any]]] | None = None,  # per-file rule options (config)
    progress: Callable[[str], None] | None = None,  # called after each file (progress bar)
    cache_dir: Path | None = None,  # `check` results cache; None disables it
    jobs: int | None = None,  # worker processes; None: automatic
) -> RunResult:
    kwargs = {"excludes": excludes} if excludes is not None else {}
    files, problems = discover(paths, respect_gitignore=respect_gitignore, **kwargs)
    reports: list[FileReport] = [FileReport(p.path, [_io_error(p.path, p.message)]) for p in problems]
    sources: list[tuple[str, SourceFile]] = []
    for path in files:
        shown = display_path(path)
        try:
            sources.append((shown, read_source(path)))
        except SourceError as error:
            reports.append(FileReport(shown, [_io_error(shown, str(error))]))
    program_files = [*sources, *_imported_context(sources)]
    program = program_facts(program_files)
    tasks = [_Task(shown, source, tuple(r.code for r in (file_filter(source.path) if file_filter else rules)),
                   options_for(source.path) if options_for else (rule_options or {}))
             for shown, source in sources]
    settings = _Settings(fix, write, min_safety, can_fix)
    cache = _open_cache(cache_dir, tasks, fix) if cache_dir is not None else None
    program_key = digest(sorted((shown, content_hash(s.raw)) for shown, s in program_files))
    facts_key = digest(program.summary())
    pending: list[_Task] = []
    for task in tasks:
        cached = cache.get(_file_key(task), content_hash(task.source.raw), facts_key, program_key) if cache else None
        if cached is None:
            pending.append(task)
        else:
            reports.append(FileReport(task.shown, cached, original=task.source.text))
            if progress:
                progress(task.shown)
    errors: list[str] = []
    for task, outcome, searched in _execute_all(pending, program, settings, jobs):
        if isinstance(outcome, str):
            errors.append(outcome)
        else:
            reports.append(outcome)
            if cache is not None:
                cache.put(_file_key(task), content_hash(task.source.raw), facts_key,
                          program_key if searched else None, outcome.diagnostics)
        if progress:
            progress(task.shown)
    if cache is not None:
        cache.save()
    reports.sort(key=lambda r: r.path)
    return RunResult(reports, errors)


@dataclass(frozen=True)
class _Task:
    shown: str
    source: SourceFile
    codes: tuple[str, ...]
    options: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class _Settings:
    fix: bool
    write: bool
    min_safety: Safety
    can_fix: Callable[[Diagnostic], bool]


def _file_key(task: _Task) -> str:
    return str(task.source.path.resolve())


def _open_cache(directory: Path, tasks: Sequence[_Task], fix: bool) -> ResultCache | None:
    if fix:
        return None  # fixing re-lints as it goes; the cache serves `check`
    settings = sorted({(t.codes, json.dumps(t.options, sort_keys=True)) for t in tasks})
    return ResultCache(directory, digest(code_fingerprint(), settings))


# Worker state: set once per process by the pool initializer (program facts are large; send them once).
_WORKER: dict[str, Any] = {}


def _init_worker(program: ProgramFacts, settings: _Settings) -> None:
    _WORKER["program"], _WORKER["settings"] = program, settings


def _execute(task: _Task, program: ProgramFacts | None = None, settings: _Settings | None = None
             ) -> tuple[_Task, FileReport | str, bool]:
    program = program or _WORKER["program"]
    settings = settings or _WORKER["settings"]
    program.searched = False
    rules = [rule_by_code(code) for code in task.codes]
    # A syntax tree is millions of objects without reference cycles (freed by reference counting): the cyclic
    # collector's passes over them while one file is linted cost a fifth of the time and free nothing. It runs
    # between files as usual.
    collecting = gc.isenabled()
    gc.disable()
    try:
        report = _run_file(task.shown, task.source, rules, program, settings.fix, settings.write,
                           settings.min_safety, task.options, settings.can_fix)
    except RuleCrash as crash:
        return task, str(crash), False
    finally:
        if collecting:
            gc.enable()
    return task, report, program.searched


def _worker_count(jobs: int | None, pending: int, settings: _Settings) -> int:
    if jobs is not None:
        return max(1, jobs)
    if os.environ.get("PRE_COMMIT") or pending < _PARALLEL_THRESHOLD:
        return 1  # pre-commit already runs hooks in parallel: no nested pools
    try:
        pickle.dumps(settings)
    except (pickle.PicklingError, AttributeError, TypeError):
        return 1  # a per-run callback (e.g. from a test) cannot travel to workers
    return min(os.cpu_count() or 1, 8)


_PARALLEL_THRESHOLD = 40


def _execute_all(tasks: Sequence[_Task], program: ProgramFacts, settings: _Settings, jobs: int | None
                 ) -> Iterator[tuple[_Task, FileReport | str, bool]]:
    workers = _worker_count(jobs, len(tasks), settings)
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield _execute(task, program, settings)
        return
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(program, settings)) as pool:
        yield from pool.map(_execute, tasks, chunksize=max(1, len(tasks) // (workers * 8)))


def _run_file(shown: str, source: SourceFile, rules: Sequence[type[Rule]], program: ProgramFacts, fix: bool,
              write: bool, min_safety: Safety, rule_options: dict[str, dict[str, Any]] | None,
              can_fix: Callable[[Diagnostic], bool]) -> FileReport:
    if not fix:
        result = lint_text(source.text, shown, rules, program=program, rule_options=rule_options)
        return FileReport(shown, result.diagnostics, original=source.text)
    outcome = fix_text(source.text, shown, rules, min_safety=min_safety, program=program,
                       rule_options=rule_options, can_fix=can_fix)
    report = FileReport(shown, outcome.remaining, outcome, source.text, error=outcome.error)
    if not outcome.converged:
        report.error = "fixes did not converge after the maximum number of passes; last result kept"
    if write:
        _write(report, source)
    return report


def _write(report: FileReport, source: SourceFile) -> None:
    outcome = report.fix
    if outcome is None or not outcome.changed or outcome.text == source.text:
        return
    try:
        write_source_atomically(source, outcome.text)
        report.written = True
    except SourceError as error:
        report.error = str(error)


def write_fixed(result: RunResult) -> RunResult:
    """Write the fixes of a run made with write=False. A file whose text changed since that run is left alone."""
    for report in result.files:
        if report.fix is None or not report.fix.changed or report.original is None:
            continue
        try:
            source = read_source(Path(report.path))
        except SourceError as error:
            report.error = str(error)
            continue
        if source.text != report.original:
            report.error = "file changed on disk while gpulint was fixing it; left untouched"
            continue
        _write(report, source)
    return result
