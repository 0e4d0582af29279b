"""Human output: `path:line:col: CODE [*] message`, a code frame, and a summary (rich, colour only on a tty)."""

from __future__ import annotations

import difflib
from collections import Counter
from typing import Sequence

from rich.console import Console
from rich.markup import escape

from gpulint.diagnostics import Diagnostic, Safety, Severity

_SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def fix_marker(diagnostic: Diagnostic) -> str:
    return "[*] " if diagnostic.fix and diagnostic.fix.safety is Safety.SAFE else ""


class TextReporter:
    def __init__(self, console: Console, *, concise: bool = False) -> None:
        self.console = console
        self.concise = concise

    def diagnostic(self, d: Diagnostic, source: str | None) -> None:
        style = _SEVERITY_STYLE[d.severity]
        head = (f"[bold]{escape(d.path)}[/]:{d.start.line}:{d.start.col}: [{style}]{d.code}[/] "
                f"{escape(fix_marker(d))}{escape(d.message)}")
        self.console.print(head, highlight=False, soft_wrap=True)
        if self.concise:
            return
        if source is not None:
            self._frame(d, source)
        if d.fix is not None:
            note = "" if d.fix.safety is Safety.SAFE else " (unsafe: applied only with --unsafe-fixes)"
            self.console.print(f"  [green]help[/]: {escape(d.fix.title)}{note}", highlight=False, soft_wrap=True)
        if d.note:
            self.console.print(f"  [blue]note[/]: {escape(d.note)}", highlight=False, soft_wrap=True)
        self.console.print()

    def _frame(self, d: Diagnostic, source: str) -> None:
        lines = source.splitlines()
        first, last = max(d.start.line - 1, 1), min(d.end.line + 1, len(lines))
        last = min(last, first + 6)
        width = len(str(last))
        for number in range(first, last + 1):
            text = lines[number - 1].expandtabs(4) if number - 1 < len(lines) else ""
            marker = ">" if d.start.line <= number <= d.end.line else " "
            self.console.print(f"[dim]{marker} {number:>{width}} |[/] {escape(text)}", highlight=False,
                               soft_wrap=True)
            if number == d.start.line == d.end.line:
                raw = lines[number - 1]
                col = len(raw[:d.start.col - 1].expandtabs(4))
                span = max(len(raw[:d.end.col - 1].expandtabs(4)) - col, 1)
                self.console.print(f"  {' ' * width} | {' ' * col}[{_SEVERITY_STYLE[d.severity]}]{'^' * span}[/]",
                                   highlight=False, soft_wrap=True)

    def summary(self, diagnostics: Sequence[Diagnostic], *, fixing: bool = False, unsafe_enabled: bool = False,
                fixed: int = 0) -> None:
        if fixed:
            self.console.print(f"Fixed {fixed} finding{'s' if fixed != 1 else ''}.", highlight=False)
        if not diagnostics:
            if not fixed:
                self.console.print("[green]All checks passed![/]", highlight=False)
            return
        total = len(diagnostics)
        safe = sum(1 for d in diagnostics if d.fix and d.fix.safety is Safety.SAFE)
        unsafe = sum(1 for d in diagnostics if d.fix and d.fix.safety is Safety.UNSAFE)
        by_severity = Counter(d.severity for d in diagnostics)
        parts = ", ".join(f"{by_severity[s]} {s.value}" for s in Severity if by_severity[s])
        self.console.print(f"Found {total} finding{'s' if total != 1 else ''} ({parts}).", highlight=False)
        hints = []
        if safe and not fixing:
            hints.append(f"[*] {safe} fixable with `gpulint fix --apply`")
        if unsafe and not unsafe_enabled:
            hints.append(f"{unsafe} more with --unsafe-fixes")
        if hints:
            self.console.print(escape("; ".join(hints) + "."), highlight=False)

    def statistics(self, diagnostics: Sequence[Diagnostic]) -> None:
        counts = Counter((d.code, d.name, bool(d.fix and d.fix.safety is Safety.SAFE)) for d in diagnostics)
        for (code, name, fixable), count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            self.console.print(f"{count}\t{code}\t{'[*]' if fixable else '[ ]'} {name}", highlight=False,
                               markup=False)


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{path}", tofile=f"b/{path}"))
