"""Applying a fix's text edits: plain text work, importable without libcst (the text reporter previews fixes with
it, and a replayed or cache-served `check` must not pay for the parser's import)."""

from __future__ import annotations

import re
from typing import Sequence

from gpulint.diagnostics import Edit, Position

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def line_starts(text: str) -> list[int]:
    return [0] + [match.end() for match in _LINE_BREAK.finditer(text)]


def offset(starts: list[int], position: Position, length: int) -> int:
    """Character offset of a 1-based position; the line after the last one is the end of a text that does not end
    with a line break (where a whole-module replacement ends)."""
    if position.line > len(starts):
        return length
    return min(starts[position.line - 1] + position.col - 1, length)


def apply_edits(text: str, edits: Sequence[Edit]) -> str:
    starts = line_starts(text)
    pieces = []
    cursor = 0
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        begin, end = offset(starts, edit.start, len(text)), offset(starts, edit.end, len(text))
        pieces.append(text[cursor:begin])
        pieces.append(edit.content)
        cursor = end
    pieces.append(text[cursor:])
    return "".join(pieces)
