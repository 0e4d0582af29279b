"""Apply fixes as text edits: non-overlapping per pass, re-parse + compile guard, re-lint until converged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import libcst as cst

from gpulint.diagnostics import Diagnostic, Edit, Safety
from gpulint.edits import apply_edits, line_starts, offset
from gpulint.engine import LintResult, ProgramFacts, lint_text
from gpulint.rule import Rule

MAX_PASSES = 10


@dataclass
class FixOutcome:
    text: str
    fixed: list[Diagnostic] = field(default_factory=list)  # findings whose fix was applied
    replaced: list[tuple[str, ...]] = field(default_factory=list)  # per fixed finding: the text each edit replaced
    remaining: list[Diagnostic] = field(default_factory=list)  # findings of the final text
    error: str | None = None  # set when a pass produced invalid code and the file was left untouched
    converged: bool = True

    @property
    def changed(self) -> bool:
        return bool(self.fixed) and self.error is None


def _replaced_texts(text: str, edits: Sequence[Edit]) -> tuple[str, ...]:
    starts = line_starts(text)
    return tuple(text[offset(starts, e.start, len(text)):offset(starts, e.end, len(text))] for e in edits)


def choose_non_overlapping(diagnostics: Sequence[Diagnostic]) -> list[Diagnostic]:
    """Greedy by position: a fix is taken when none of its edits overlaps an edit already taken.
    Identical edits (the same import wanted by two fixes) are shared, not conflicts."""
    taken: list[Diagnostic] = []
    claimed: list[Edit] = []
    for diagnostic in sorted(diagnostics, key=lambda d: (d.fix.edits[0].start if d.fix and d.fix.edits else d.start)):
        assert diagnostic.fix is not None
        new = [e for e in diagnostic.fix.edits if e not in claimed]
        if any(_overlaps(e, c) for e in new for c in claimed):
            continue
        taken.append(diagnostic)
        claimed.extend(new)
    return taken


def _overlaps(a: Edit, b: Edit) -> bool:
    if a.is_insertion and b.is_insertion:
        return a.start == b.start
    if a.is_insertion:
        return b.start < a.start < b.end
    if b.is_insertion:
        return a.start < b.start < a.end
    return a.start < b.end and b.start < a.end


def validate(text: str, path: str) -> str | None:
    """None if `text` parses with libcst and compiles with CPython, else the error."""
    try:
        cst.parse_module(text)
        compile(text, path, "exec", dont_inherit=True)
    except (cst.ParserSyntaxError, SyntaxError, ValueError) as error:
        return " ".join(str(error).split())
    return None


def fix_text(
    text: str,
    path: str,
    rules: Sequence[type[Rule]],
    *,
    min_safety: Safety = Safety.SAFE,
    program: ProgramFacts | None = None,
    rule_options: dict[str, dict[str, Any]] | None = None,
    can_fix: Callable[[Diagnostic], bool] = lambda d: True,
) -> FixOutcome:
    """Fix `text` until nothing more applies (at most MAX_PASSES). On invalid output, return it untouched."""
    outcome = FixOutcome(text)
    current = text
    result: LintResult = lint_text(current, path, rules, program=program, rule_options=rule_options)
    # Later passes judge the program by what the user wrote, not by what earlier fixes inserted
    # (`pin_memory=torch.cuda.is_available()` is not evidence that the file targets CUDA).
    evidence = None
    if result.analysis is not None:
        evidence = (result.analysis.cuda_evidence, result.analysis.maybe_cuda_evidence)
        program = program or ProgramFacts.of_single_file(path, text, result.analysis)
    for _ in range(MAX_PASSES):
        candidates = [d for d in result.diagnostics
                      if d.fix is not None and d.fix.safety >= min_safety and can_fix(d)]
        if not candidates:
            outcome.text, outcome.remaining = current, result.diagnostics
            return outcome
        chosen = choose_non_overlapping(candidates)
        edits = list(dict.fromkeys(e for d in chosen for e in d.fix.edits))  # type: ignore[union-attr]
        new_text = apply_edits(current, edits)
        error = validate(new_text, path) if new_text != current else None
        if error is not None:
            codes = ", ".join(sorted({d.code for d in chosen}))
            original = lint_text(text, path, rules, program=program, rule_options=rule_options)
            return FixOutcome(text, [], original.diagnostics,
                              error=f"fix by {codes} produced invalid code ({error}); file left unchanged")
        if new_text == current:  # fixes that change nothing would loop forever
            outcome.text, outcome.remaining = current, result.diagnostics
            return outcome
        outcome.fixed.extend(chosen)
        outcome.replaced.extend(_replaced_texts(current, d.fix.edits) for d in chosen)  # type: ignore[union-attr]
        current = new_text
        result = lint_text(current, path, rules, program=program, rule_options=rule_options, cuda_evidence=evidence)
    outcome.text, outcome.remaining, outcome.converged = current, result.diagnostics, False
    return outcome
