"""Suppression comments: parse them, drop the findings they cover, report the ones that cover nothing.

Forms (comments only: text inside strings never counts):

* `# noqa: GPU011[, GPU012]` -- the physical line where a finding starts (for a finding inside a multi-line
  string or a backslash-continued line: the line where that string / continuation ends, as in ruff). Codes
  are required: a bare `# noqa` belongs to other linters and is ignored.
* `# gpulint: ignore[GPU011]` (or `fixme[...]`, for debt to be paid later) -- on its own line it covers the
  next logical line (stack several on consecutive lines); as a trailing comment, the logical line it ends.
* `# gpulint: noqa` on its own line anywhere in the file silences the whole file; `# gpulint: noqa: GPU011`
  and `# gpulint: file-ignore[GPU011]` silence those codes in the file.

`apply_suppressions` also reports GPU902 `unused-noqa` for a directive code that suppressed nothing although
its rule ran on the file, or that names an unknown GPU code; its safe fix removes the dead code (or the
whole directive). Setting the environment variable GPULINT_IGNORE_NOQA=1 (`--ignore-noqa`) disables all of
this. `add_noqa` writes `# noqa: CODES` for the findings of a file (`--add-noqa`).
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from gpulint.diagnostics import Diagnostic, Edit, Fix, Position, Safety, Severity

UNUSED_CODE = "GPU902"
UNUSED_NAME = "unused-noqa"
IGNORE_NOQA_ENV = "GPULINT_IGNORE_NOQA"
# Diagnostics of gpulint itself that no comment can hide (a syntax error, an unreadable file).
UNSUPPRESSIBLE = frozenset({"GPU900", "GPU901"})

_CODE = r"[A-Za-z]+[0-9]+"
_CODE_LIST = rf"{_CODE}(?:(?:\s*,\s*|\s+){_CODE})*"
_NOQA = re.compile(rf"#\s*noqa(?::\s*|\s*:\s*)(?P<codes>{_CODE_LIST})", re.I)
_GPULINT = re.compile(
    rf"#\s*gpulint\s*:\s*(?:(?P<verb>ignore|fixme|file-ignore)\s*\[(?P<bracket>[^\]\n]*)\]"
    rf"|(?P<noqa>noqa)(?:\s*:\s*(?P<codes>{_CODE_LIST}))?)",
    re.I,
)
_SPLIT = re.compile(r"[\s,]+")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass
class Directive:
    kind: str  # "noqa" | "ignore" | "fixme" | "file"
    line: int  # 1-based physical line of the comment
    start: int  # 0-based column of the directive's '#'
    end: int  # 0-based column just after the directive (its codes or closing bracket)
    codes: tuple[str, ...]  # upper-case; () only for a blanket file-level `# gpulint: noqa`
    codes_span: tuple[int, int] | None  # columns of the code list (to rewrite it)
    comment_start: int  # column where the comment token starts
    comment_end: int  # column where the comment token ends
    own_line: bool  # nothing but whitespace before the comment
    rows: frozenset[int] = frozenset()  # lines whose findings it covers (unused for file-level)
    used: set[str] = field(default_factory=set)

    @property
    def file_level(self) -> bool:
        return self.kind == "file"

    def covers(self, code: str) -> bool:
        return not self.codes or code in self.codes


def _lines(text: str) -> list[str]:
    """Physical lines with their line breaks, split exactly as positions count them (\\r\\n, \\r, \\n)."""
    lines, start = [], 0
    for match in _LINE_BREAK.finditer(text):
        lines.append(text[start:match.end()])
        start = match.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


@dataclass
class _Layout:
    """What tokenizing tells: comments with the logical line they belong to, and where `# noqa` goes."""

    lines: list[str]
    comments: list[tuple[int, int, str, tuple[int, int] | None, tuple[int, int] | None]] = field(default_factory=list)
    # (row, col, text, logical line (first, last) it trails or None, next logical line for own-line comments)
    noqa_row: dict[int, int] = field(default_factory=dict)  # row -> row whose `# noqa` covers it

    def row_for(self, row: int) -> int:
        seen = set()
        while row in self.noqa_row and row not in seen:
            seen.add(row)
            row = self.noqa_row[row]
        return row


def _layout(text: str) -> _Layout:
    lines = _lines(text)
    layout = _Layout(lines)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO("".join(
            line[:-2] + "\n" if line.endswith("\r\n") else line[:-1] + "\n" if line.endswith("\r") else line
            for line in lines)).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return _fallback_layout(lines)
    logical_start: int | None = None
    trailing: list[tuple[int, int, str]] = []  # comments inside the current logical line
    pending: list[tuple[int, int, str]] = []  # own-line comments waiting for the next logical line
    fstring_starts: list[int] = []
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER, tokenize.COMMENT}
    for token in tokens:
        kind, (srow, scol), (erow, _) = token.type, token.start, token.end
        if kind == tokenize.COMMENT:
            if logical_start is None:
                pending.append((srow, scol, token.string))
            else:
                trailing.append((srow, scol, token.string))
            continue
        if kind == tokenize.NEWLINE or kind == tokenize.ENDMARKER:
            if logical_start is not None:
                span = (logical_start, srow)
                layout.comments.extend((r, c, s, span, None) for r, c, s in trailing)
                layout.comments.extend((r, c, s, None, span) for r, c, s in pending)
                trailing, pending, logical_start = [], [], None
            continue
        if kind not in skip and logical_start is None:
            logical_start = srow
        if kind == tokenize.STRING and erow > srow:
            for row in range(srow, erow):
                layout.noqa_row[row] = erow
        name = tokenize.tok_name.get(kind, "")
        if name == "FSTRING_START":
            fstring_starts.append(srow)
        elif name == "FSTRING_END" and fstring_starts:
            first = fstring_starts.pop()
            for row in range(first, erow):
                layout.noqa_row[row] = erow
    layout.comments.extend((r, c, s, None, None) for r, c, s in pending + trailing)
    in_string = set(layout.noqa_row)
    for index, line in enumerate(lines, start=1):
        body = line.rstrip("\r\n")
        if body.endswith("\\") and index not in in_string and index < len(lines):
            layout.noqa_row.setdefault(index, index + 1)
    return layout


def _fallback_layout(lines: list[str]) -> _Layout:
    """Without tokens (should not happen for parsable code): every `#` directive trails its own line."""
    layout = _Layout(lines)
    for row, line in enumerate(lines, start=1):
        at = line.find("#")
        if at >= 0:
            own = not line[:at].strip()
            layout.comments.append((row, at, line[at:].rstrip("\r\n"), None if own else (row, row), None))
    return layout


def _codes(raw: str) -> tuple[str, ...]:
    return tuple(code.upper() for code in _SPLIT.split(raw.strip()) if code)


def parse_directives(text: str, layout: _Layout | None = None) -> list[Directive]:
    """Every suppression directive in `text`, with the lines it covers."""
    if "noqa" not in text.lower() and "gpulint" not in text.lower():
        return []
    layout = layout or _layout(text)
    found: list[Directive] = []
    for row, col, comment, trails, next_logical in layout.comments:
        own_line = trails is None
        comment_end = col + len(comment)
        for match in _NOQA.finditer(comment):
            found.append(Directive(
                "noqa", row, col + match.start(), col + match.end(), _codes(match.group("codes")),
                (col + match.start("codes"), col + match.end("codes")), col, comment_end, own_line,
                frozenset({row})))
        for match in _GPULINT.finditer(comment):
            if match.group("noqa"):
                if not own_line:
                    continue  # like flake8: a file-level directive only counts on a line of its own
                raw = match.group("codes")
                span = (col + match.start("codes"), col + match.end("codes")) if raw else None
                found.append(Directive("file", row, col + match.start(), col + match.end(), _codes(raw or ""),
                                       span, col, comment_end, own_line))
                continue
            codes = _codes(match.group("bracket"))
            if not codes:
                continue
            span = (col + match.start("bracket"), col + match.end("bracket"))
            verb = match.group("verb").lower()
            if verb == "file-ignore":
                if own_line:
                    found.append(Directive("file", row, col + match.start(), col + match.end(), codes, span, col,
                                           comment_end, own_line))
                continue
            if own_line:
                rows = frozenset(range(next_logical[0], next_logical[1] + 1)) if next_logical else frozenset()
            else:
                rows = frozenset(range(trails[0], trails[1] + 1)) if trails else frozenset({row})
            found.append(Directive(verb, row, col + match.start(), col + match.end(), codes, span, col,
                                   comment_end, own_line, rows))
    found.sort(key=lambda d: (d.line, d.start))
    return found


def suppressed_codes(line: str) -> set[str]:
    """Codes a `# noqa: GPU011` or `# gpulint: ignore[GPU011]` comment in this one line names."""
    return {code for directive in parse_directives(line) for code in directive.codes}


def ignore_noqa() -> bool:
    return os.environ.get(IGNORE_NOQA_ENV, "") not in ("", "0")


def apply_suppressions(diagnostics: Sequence[Diagnostic], text: str, path: str,
                       enabled: Iterable[str] = ()) -> list[Diagnostic]:
    """Drop the findings that suppression comments cover; add GPU902 for directive codes that covered nothing
    although their rule (`enabled` codes) ran on this file, and for unknown GPU codes."""
    if ignore_noqa():
        return list(diagnostics)
    lowered = text.lower()
    if "noqa" not in lowered and "gpulint" not in lowered:
        return list(diagnostics)
    layout = _layout(text)
    directives = parse_directives(text, layout)
    if not directives:
        return list(diagnostics)
    kept = [d for d in diagnostics if not _suppress(d, directives, layout)]
    unused = _unused(directives, text, path, set(enabled), layout)
    kept.extend(d for d in unused if not _suppress(d, directives, layout, count=False))
    return kept


def _suppress(diagnostic: Diagnostic, directives: list[Directive], layout: _Layout, count: bool = True) -> bool:
    if diagnostic.code in UNSUPPRESSIBLE:
        return False
    row = layout.row_for(diagnostic.start.line)
    hit = False
    for directive in directives:
        if not directive.covers(diagnostic.code):
            continue
        if directive.file_level or (diagnostic.start.line in directive.rows if directive.kind != "noqa"
                                    else row in directive.rows):
            hit = True
            if count:
                directive.used.add(diagnostic.code)
    return hit


def _known_codes() -> set[str]:
    from gpulint.registry import META_CODES, all_rules  # late: registry imports the rules

    return {r.code for r in all_rules()} | set(META_CODES)


def _unused(directives: list[Directive], text: str, path: str, enabled: set[str], layout: _Layout) -> list[Diagnostic]:
    known: set[str] | None = None
    found = []
    for directive in directives:
        if not directive.codes:
            continue  # a blanket file-level noqa is never reported
        unused, unknown = [], []
        for code in directive.codes:
            if code in directive.used or code == UNUSED_CODE:
                continue
            if code in enabled:
                unused.append(code)
            elif code.startswith("GPU"):
                known = known if known is not None else _known_codes()
                if code not in known:
                    unknown.append(code)
        if not unused and not unknown:
            continue
        dead = set(unused) | set(unknown)
        parts = [f"unused: {', '.join(unused)}"] if unused else []
        parts += [f"unknown: {', '.join(unknown)}"] if unknown else []
        label = {"noqa": "`noqa`", "file": "file-level", "ignore": "`gpulint: ignore`",
                 "fixme": "`gpulint: fixme`"}[directive.kind]
        message = f"Unused {label} directive ({'; '.join(parts)})"
        start, end = Position(directive.line, directive.start + 1), Position(directive.line, directive.end + 1)
        edits = _removal(directive, dead, layout)
        fix = Fix("Remove unused suppression", Safety.SAFE, edits) if edits else None
        found.append(Diagnostic(path, start, end, UNUSED_CODE, UNUSED_NAME, message, Severity.WARNING, fix))
    return found


def _removal(directive: Directive, dead: set[str], layout: _Layout) -> tuple[Edit, ...]:
    row = directive.line
    line = layout.lines[row - 1]
    body = line.rstrip("\r\n")
    keep = [code for code in directive.codes if code not in dead]
    if keep and directive.codes_span is not None:
        first, last = directive.codes_span
        return (Edit(Position(row, first + 1), Position(row, last + 1), ", ".join(keep)),)
    if keep:
        return ()
    # The directive owns its text up to the next `#` (a chained pragma) or the end of the comment.
    comment = body[directive.comment_start:directive.comment_end]
    next_hash = comment.find("#", directive.end - directive.comment_start)
    tail = directive.comment_start + next_hash if next_hash >= 0 else directive.comment_end
    if directive.start == directive.comment_start and tail == directive.comment_end:
        if directive.own_line and not body[:directive.comment_start].strip():
            if row < len(layout.lines):
                return (Edit(Position(row, 1), Position(row + 1, 1), ""),)
            return (Edit(Position(row, 1), Position(row, len(body) + 1), ""),)
        code_end = len(body[:directive.comment_start].rstrip())
        return (Edit(Position(row, code_end + 1), Position(row, directive.comment_end + 1), ""),)
    if directive.start == directive.comment_start:
        return (Edit(Position(row, directive.start + 1), Position(row, tail + 1), ""),)
    before = len(body[:directive.start].rstrip())
    end = directive.start + len(body[directive.start:tail].rstrip())
    return (Edit(Position(row, before + 1), Position(row, end + 1), ""),)


# -- --add-noqa ---------------------------------------------------------------------------------------------

NOT_NOQA_ABLE = UNSUPPRESSIBLE | {UNUSED_CODE}


def add_noqa(text: str, diagnostics: Sequence[Diagnostic], reason: str | None = None) -> tuple[str, int]:
    """`text` with `# noqa: CODES` on the line of each finding (merged into an existing `# noqa:` comment).
    Returns the new text and the number of lines changed."""
    wanted: dict[int, list[str]] = {}
    layout = _layout(text)
    for diagnostic in diagnostics:
        if diagnostic.code in NOT_NOQA_ABLE:
            continue
        row = layout.row_for(diagnostic.start.line)
        codes = wanted.setdefault(row, [])
        if diagnostic.code not in codes:
            codes.append(diagnostic.code)
    if not wanted:
        return text, 0
    directives = {d.line: d for d in parse_directives(text, layout) if d.kind == "noqa" and not d.own_line}
    lines = list(layout.lines)
    changed = 0
    for row, codes in sorted(wanted.items()):
        if row > len(lines):
            continue
        line = lines[row - 1]
        body = line.rstrip("\r\n")
        ending = line[len(body):]
        existing = directives.get(row)
        if existing is not None and existing.codes_span is not None:
            missing = [c for c in sorted(codes) if c not in existing.codes]
            if not missing:
                continue
            at = existing.codes_span[1]
            body = body[:at] + "".join(f", {c}" for c in missing) + body[at:]
        else:
            suffix = f"  # noqa: {', '.join(sorted(codes))}" + (f" {reason}" if reason else "")
            body = body.rstrip() + suffix
        lines[row - 1] = body + ending
        changed += 1
    return "".join(lines), changed


def noqa_rows(text: str):
    """A function line -> the line where a `# noqa` for a finding starting on that line goes (JSON noqa_row)."""
    layout = _layout(text)
    return layout.row_for
