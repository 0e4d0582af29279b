"""Human output in ruff's shapes: `concise` (`path:line:col: CODE [*] message`) and `full` (header, code frame,
help, fix preview, notes), `--statistics`, summaries and diffs.

Text is written through a `Writer`: plain `stream.write` unless colour is on (a terminal, or `--color
always`), in which case rich renders styles only -- never markup, never wrapping -- so a message containing
`x[0]` or `[GPU011]` is printed as is.
"""

from __future__ import annotations

import difflib
import json
import os
from collections import Counter
from typing import Callable, Iterable, Sequence, TextIO

from gpulint.diagnostics import Diagnostic, Safety, Severity

_SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow", Severity.INFO: "bold cyan"}
CONTEXT_LINES = 2


def use_color(stream: TextIO, choice: str = "auto") -> bool:
    """`--color always|never|auto`; auto means a terminal, unless NO_COLOR is set (FORCE_COLOR forces it)."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


class Writer:
    """Lines made of plain strings and (text, style) pairs."""

    def __init__(self, stream: TextIO, color: bool = False) -> None:
        self.stream = stream
        self.color = color
        self._console = None
        if color:
            from rich.console import Console

            self._console = Console(file=stream, force_terminal=True, soft_wrap=True, markup=False,
                                    highlight=False, emoji=False, no_color=False)

    def line(self, *segments: str | tuple[str, str]) -> None:
        if self._console is None:
            self.stream.write("".join(s if isinstance(s, str) else s[0] for s in segments) + "\n")
            return
        from rich.text import Text

        text = Text(no_wrap=True, end="\n")
        for segment in segments:
            if isinstance(segment, str):
                text.append(segment)
            else:
                text.append(segment[0], style=segment[1])
        self._console.print(text, soft_wrap=True)

    def raw(self, text: str) -> None:
        self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def fix_marker(applicable: bool) -> str:
    return "[*] " if applicable else ""


def render_concise(writer: Writer, diagnostics: Sequence[Diagnostic],
                   applicable: Callable[[Diagnostic], bool]) -> None:
    for d in diagnostics:
        writer.line((d.path, "bold"), f":{d.start.line}:{d.start.col}: ", (d.code, _SEVERITY_STYLE[d.severity]),
                    " ", fix_marker(applicable(d)), d.message)


def render_full(writer: Writer, diagnostics: Sequence[Diagnostic], applicable: Callable[[Diagnostic], bool],
                sources: dict[str, str], *, preview_fixes: bool = True) -> None:
    lines_of: dict[str, list[str]] = {}  # each file split once, however many findings it has
    for d in diagnostics:
        source = sources.get(d.path)
        if source is not None and d.path not in lines_of:
            lines_of[d.path] = source.splitlines()
        _full_one(writer, d, applicable(d), source, lines_of.get(d.path, []), preview_fixes)


def _expand(text: str) -> str:
    return text.expandtabs(4)


def _full_one(writer: Writer, d: Diagnostic, applicable: bool, source: str | None, lines: list[str],
              preview: bool) -> None:
    style = _SEVERITY_STYLE[d.severity]
    writer.line((d.code, style), " ", fix_marker(applicable), (d.message, "bold"))
    if not lines:
        writer.line(" --> ", f"{d.path}:{d.start.line}:{d.start.col}")
    else:
        first = max(d.start.line - CONTEXT_LINES, 1)
        last = min(d.end.line + CONTEXT_LINES, len(lines))
        if d.end.line - d.start.line > 8:  # long spans: show the head only
            last = min(d.start.line + 3, len(lines))
        width = len(str(last))
        pad = " " * width
        writer.line(pad, ("-->", "blue"), f" {d.path}:{d.start.line}:{d.start.col}")
        writer.line(pad, (" |", "blue"))
        for number in range(first, last + 1):
            raw = lines[number - 1] if number - 1 < len(lines) else ""
            writer.line((f"{number:>{width}} |", "blue"), " " if raw else "", _expand(raw))
            if d.start.line <= number <= d.end.line:
                start = d.start.col - 1 if number == d.start.line else len(raw) - len(raw.lstrip())
                end = d.end.col - 1 if number == d.end.line else len(raw)
                lead = len(_expand(raw[:start]))
                span = max(len(_expand(raw[:end])) - lead, 1)
                if raw or number == d.start.line:
                    writer.line(pad, (" |", "blue"), " " + " " * lead, ("^" * span, style))
        writer.line(pad, (" |", "blue"))
    if d.fix is not None:
        writer.line(("help", "bold cyan"), f": {d.fix.title}")
        if preview and source is not None:
            _fix_preview(writer, d, source, lines)
        if d.fix.safety is not Safety.SAFE:
            writer.line(("note", "bold"), ": This is an unsafe fix and may change runtime behavior"
                        + ("" if applicable else " (applied only with --unsafe-fixes)"))
    if d.note:
        writer.line(("note", "bold"), f": {d.note}")
    writer.line("")


def _fix_preview(writer: Writer, d: Diagnostic, source: str, before_lines: list[str]) -> None:
    from gpulint.edits import apply_edits

    assert d.fix is not None
    try:
        after = apply_edits(source, d.fix.edits)
    except (IndexError, ValueError):
        return
    after_lines = after.splitlines()
    width = len(str(max(len(before_lines), len(after_lines), 1)))
    pad = " " * width
    # The lines the fix changed lie between a common head and a common tail: only they and one line of context
    # either side are diffed (the same hunks as diffing the whole file, without its cost on large files).
    shortest = min(len(before_lines), len(after_lines))
    head = next((i for i in range(shortest) if before_lines[i] != after_lines[i]), shortest)
    tail = next((i for i in range(shortest - head) if before_lines[-1 - i] != after_lines[-1 - i]), shortest - head)
    start, context_after = max(head - 1, 0), max(tail - 1, 0)
    matcher = difflib.SequenceMatcher(a=before_lines[start:len(before_lines) - context_after],
                                      b=after_lines[start:len(after_lines) - context_after], autojunk=False)
    for group in matcher.get_grouped_opcodes(1):
        for tag, a1, a2, b1, b2 in group:
            a1, a2, b1, b2 = a1 + start, a2 + start, b1 + start, b2 + start
            if tag == "equal":
                for offset in range(a2 - a1):
                    writer.line((f"{a1 + offset + 1:>{width}} |", "blue"), " ", _expand(before_lines[a1 + offset]))
                continue
            for index in range(a1, a2):
                writer.line((f"{pad} -", "red"), " ", (_expand(before_lines[index]), "red"))
            for index in range(b1, b2):
                writer.line((f"{index + 1:>{width}} +", "green"), " ", (_expand(after_lines[index]), "green"))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def render_summary(writer: Writer, diagnostics: Sequence[Diagnostic], applicable: Callable[[Diagnostic], bool],
                   *, fixed: int = 0, unsafe_hidden: int = 0, fixing: bool = False,
                   baseline_hidden: int = 0) -> None:
    """`Found N findings (...)`, the fixable hint, or `All checks passed!`."""
    if baseline_hidden:
        writer.line(f"{_plural(baseline_hidden, 'finding')} hidden by the baseline.")
    if not diagnostics:
        if fixed:
            writer.line(f"Found {_plural(fixed, 'finding')} ({fixed} fixed, 0 remaining).")
        else:
            writer.line(("All checks passed!", "bold green"))
        return
    total = len(diagnostics)
    by_severity = Counter(d.severity for d in diagnostics)
    parts = ", ".join(f"{by_severity[s]} {s.value}" for s in (Severity.ERROR, Severity.WARNING, Severity.INFO)
                      if by_severity[s])
    if fixed:
        writer.line(f"Found {_plural(total + fixed, 'finding')} ({fixed} fixed, {total} remaining: {parts}).")
    else:
        writer.line(f"Found {_plural(total, 'finding')} ({parts}).")
    safe = sum(1 for d in diagnostics if applicable(d))
    hidden = f"{unsafe_hidden} hidden fix{'es' if unsafe_hidden != 1 else ''} can be enabled with the " \
             f"`--unsafe-fixes` option" if unsafe_hidden else ""
    if safe and not fixing:
        writer.line(f"[*] {safe} fixable with `gpulint fix --apply`" + (f" ({hidden})." if hidden else "."))
    elif safe:  # fixing, yet fixable findings remain: their file could not be written (read-only, changed, ...)
        writer.line(f"[*] {safe} fixable but not fixed in this run (see the messages above)"
                    + (f"; {hidden}." if hidden else "."))
    elif hidden:
        writer.line(f"No fixes available ({hidden}).")


def render_remaining_hint(writer: Writer, diagnostics: Sequence[Diagnostic], fixed: int, baseline_hidden: int,
                          unsafe_hidden: int) -> None:
    """The last lines of a dry run (`gpulint fix`)."""
    if baseline_hidden:
        writer.line(f"{_plural(baseline_hidden, 'finding')} hidden by the baseline.")
    if unsafe_hidden:
        writer.line(f"{unsafe_hidden} more fix{'es' if unsafe_hidden != 1 else ''} available with "
                    "`--unsafe-fixes`.")
    if not diagnostics and not fixed:
        writer.line(("All checks passed!", "bold green"))
    elif fixed:
        writer.line(f"Run `gpulint fix --apply` to apply {'it' if fixed == 1 else 'them'}.")


def render_fixed(writer: Writer, fixed: dict[str, list[Diagnostic]], *, dry_run: bool, show: bool) -> None:
    """`Fixed N findings:` / `Would fix N findings:` with, under --show-fixes, per-file counts as ruff does."""
    total = sum(len(v) for v in fixed.values())
    if not total:
        if dry_run:
            writer.line("No findings would be fixed.")
        return
    verb = "Would fix" if dry_run else "Fixed"
    writer.line(f"{verb} {_plural(total, 'finding')}" + (":" if show else "."))
    if not show:
        return
    for path in sorted(fixed):
        if not fixed[path]:
            continue
        writer.line("- ", (path, "bold"), ":")
        counts = Counter((d.code, d.name) for d in fixed[path])
        for (code, name), count in sorted(counts.items()):
            writer.line(f"    {count} × ", (code, "bold"), f" ({name})")


def statistics_rows(diagnostics: Sequence[Diagnostic], applicable: Callable[[Diagnostic], bool]) -> list[dict]:
    counts: Counter = Counter()
    fixable: Counter = Counter()
    names: dict[str, str] = {}
    for d in diagnostics:
        counts[d.code] += 1
        names[d.code] = d.name
        fixable[d.code] += applicable(d)
    return [{"code": code, "name": names[code], "count": count, "fixable": fixable[code] > 0,
             "fixable_count": fixable[code]}
            for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def render_statistics(writer: Writer, diagnostics: Sequence[Diagnostic], applicable: Callable[[Diagnostic], bool],
                      as_json: bool = False) -> None:
    rows = statistics_rows(diagnostics, applicable)
    if as_json:
        writer.raw(json.dumps(rows, indent=2) + "\n")
        return
    if not rows:
        return
    count_width = max(len(str(r["count"])) for r in rows)
    code_width = max(len(r["code"]) for r in rows)
    for row in rows:
        writer.raw(f"{row['count']:>{count_width}}\t{row['code']:<{code_width}}\t"
                   f"{'[*]' if row['fixable'] else '[ ]'} {row['name']}\n")


def unified_diff(path: str, before: str, after: str) -> str:
    """`--- a/<path>` / `+++ b/<path>`, so `git apply` places it."""
    path = path.replace(os.sep, "/")
    out = []
    for line in difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                     fromfile=f"a/{path}", tofile=f"b/{path}"):
        out.append(line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def render_diff(writer: Writer, path: str, before: str, after: str) -> None:
    text = unified_diff(path, before, after)
    if not writer.color:
        writer.raw(text)
        return
    for line in text.splitlines():
        if line.startswith(("---", "+++")):
            writer.line((line, "bold"))
        elif line.startswith("@@"):
            writer.line((line, "cyan"))
        elif line.startswith("+"):
            writer.line((line, "green"))
        elif line.startswith("-"):
            writer.line((line, "red"))
        else:
            writer.line(line)


def sort_diagnostics(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    return sorted(diagnostics, key=Diagnostic.sort_key)
