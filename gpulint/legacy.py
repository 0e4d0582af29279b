"""Old PyTorch spellings that no longer parse, read as what they meant.

Code written for torch <= 0.3 passes `async=True` to `.cuda()` / `.to()`; `async` became a reserved word in
Python 3.7, so such files are syntax errors today although the rest of the file is ordinary training code.
torch 0.4 renamed the argument `non_blocking`. A file that CPython rejects is re-read with each such keyword
argument renamed; when that text parses, it is checked instead (the syntax error is still reported, and no fix
is offered for the file, since fixes would be computed on text the user did not write).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# `async=` as a keyword argument: after `(` or `,` (and whitespace), not `async ==`
_ASYNC_KEYWORD = re.compile(r"(?<=[(,])(\s*)async(\s*=)(?!=)")
_RENAMED = "non_blocking"
_GROWTH = len(_RENAMED) - len("async")


@dataclass(frozen=True)
class Repair:
    text: str  # the text as the old spelling meant it
    first: tuple[int, int]  # (line, 1-based column) of the first old keyword, for the syntax error
    shifts: dict[int, list[int]]  # line -> 0-based columns (in the repaired text) where a rename grew the line

    def original_column(self, line: int, column: int) -> int:
        """A 1-based column of the repaired text, as a column of the text the user wrote."""
        grown = sum(1 for start in self.shifts.get(line, ()) if start + len(_RENAMED) < column)
        return column - grown * _GROWTH


def repair(text: str) -> Repair | None:
    """The text with `async=` keyword arguments renamed, when that alone makes it valid Python; else None."""
    if "async" not in text:
        return None
    pieces: list[str] = []
    shifts: dict[int, list[int]] = {}
    first: tuple[int, int] | None = None
    position = 0
    for match in _ASYNC_KEYWORD.finditer(text):
        start = match.start() + len(match.group(1))  # where `async` begins
        pieces.append(text[position:start])
        line = text.count("\n", 0, start) + 1
        line_start = text.rfind("\n", 0, start) + 1
        repaired_so_far = "".join(pieces)
        column = len(repaired_so_far) - (repaired_so_far.rfind("\n") + 1)
        shifts.setdefault(line, []).append(column)
        if first is None:
            first = (line, start - line_start + 1)
        pieces.append(_RENAMED)
        position = start + len("async")
    if first is None:
        return None
    pieces.append(text[position:])
    repaired = "".join(pieces)
    try:
        ast.parse(repaired)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return Repair(repaired, first, shifts)
