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
