"""Plain data the rest of gpulint passes around: severities, fix safety, edits, fixes, findings."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Safety(str, enum.Enum):
    """How far a fix may be trusted. Ordered: SUGGEST < UNSAFE < SAFE."""

    SUGGEST = "suggest"
    UNSAFE = "unsafe"
    SAFE = "safe"

    @property
    def rank(self) -> int:
        return _SAFETY_RANK[self]

    def __ge__(self, other: "Safety") -> bool:  # type: ignore[override]
        return self.rank >= other.rank

    def __lt__(self, other: "Safety") -> bool:  # type: ignore[override]
        return self.rank < other.rank


_SAFETY_RANK = {Safety.SUGGEST: 0, Safety.UNSAFE: 1, Safety.SAFE: 2}


@dataclass(frozen=True, order=True)
class Position:
    """1-based line, 1-based column (in characters)."""

    line: int
    col: int


@dataclass(frozen=True)
class Edit:
    """Replace the text between two positions (end exclusive) with `content`."""

    start: Position
    end: Position
    content: str

    @property
    def is_insertion(self) -> bool:
        return self.start == self.end


@dataclass(frozen=True)
class Fix:
    title: str
    safety: Safety
    edits: tuple[Edit, ...]


@dataclass(frozen=True)
class Diagnostic:
    path: str
    start: Position
    end: Position
    code: str
    name: str
    message: str
    severity: Severity
    fix: Fix | None = None
    # Why a rule reported without a fix at this site (e.g. "BatchNorm in training mode"); shown to users.
    note: str | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def line(self) -> int:
        return self.start.line

    @property
    def col(self) -> int:
        return self.start.col

    def sort_key(self) -> tuple:
        return (self.path, self.start.line, self.start.col, self.code)


def diagnostic_to_dict(d: Diagnostic) -> dict:
    """A plain, JSON-safe form (cache entries, worker results)."""
    fix = None if d.fix is None else {
        "title": d.fix.title, "safety": d.fix.safety.value,
        "edits": [[e.start.line, e.start.col, e.end.line, e.end.col, e.content] for e in d.fix.edits],
    }
    return {"path": d.path, "span": [d.start.line, d.start.col, d.end.line, d.end.col], "code": d.code,
            "name": d.name, "message": d.message, "severity": d.severity.value, "fix": fix, "note": d.note}


def diagnostic_from_dict(data: dict) -> Diagnostic:
    line, col, end_line, end_col = data["span"]
    fix = data["fix"]
    return Diagnostic(
        data["path"], Position(line, col), Position(end_line, end_col), data["code"], data["name"], data["message"],
        Severity(data["severity"]),
        None if fix is None else Fix(fix["title"], Safety(fix["safety"]), tuple(
            Edit(Position(a, b), Position(c, d), content) for a, b, c, d, content in fix["edits"])),
        data["note"])
