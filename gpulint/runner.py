"""Orchestrates a run: discover files, gather program facts, lint or fix each file, collect results."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gpulint.diagnostics import Diagnostic, Position, Safety, Severity
from gpulint.discovery import discover
from gpulint.engine import ProgramFacts, RuleCrash, lint_text
from gpulint.fixer import FixOutcome, fix_text
from gpulint.registry import META_CODES
from gpulint.rule import Rule
from gpulint.source import SourceError, SourceFile, read_source, write_source_atomically

_CUDA_TEXT = re.compile(r"""["']cuda(?::\d+)?["']|\.cuda\(|f["']cuda""")
_MAYBE_CUDA_TEXT = re.compile(r"torch\.cuda\.is_available\(")
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
        facts.sources[path] = source.text
        facts.cuda_evidence |= bool(_CUDA_TEXT.search(source.text))
        facts.maybe_cuda_evidence |= bool(_MAYBE_CUDA_TEXT.search(source.text))
        for name, bases in _CLASS_TEXT.findall(source.text):
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
    can_fix: Callable[[Diagnostic], bool] = lambda d: True,
    file_filter: Callable[[Path], Sequence[type[Rule]]] | None = None,
    options_for: Callable[[Path], dict[str, dict[str, Any]]] | None = None,  # per-file rule options (config)
    progress: Callable[[str], None] | None = None,  # called after each file (progress bar)
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
    program = program_facts(sources)
    errors: list[str] = []
    for shown, source in sources:
        file_rules = file_filter(source.path) if file_filter else rules
        options = options_for(source.path) if options_for else rule_options
        try:
            reports.append(_run_file(shown, source, file_rules, program, fix, write, min_safety, options, can_fix))
        except RuleCrash as crash:
            errors.append(str(crash))
        if progress:
            progress(shown)
    reports.sort(key=lambda r: r.path)
    return RunResult(reports, errors)


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
    if write and outcome.changed and outcome.text != source.text:
        try:
            write_source_atomically(source, outcome.text)
            report.written = True
        except SourceError as error:
            report.error = str(error)
    return report
