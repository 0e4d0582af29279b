"""The guarded patterns of gpulint.textscan find exactly what the patterns themselves find."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import gpulint
import gpulint.rules
from gpulint.textscan import first_characters, quick

ROOT = Path(__file__).parent.parent


def _module_patterns() -> list[re.Pattern[str]]:
    found: dict[tuple[str, int], re.Pattern[str]] = {}
    for package in (gpulint, gpulint.rules):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module.name.endswith(("verify", "__main__")):
                continue
            for value in vars(importlib.import_module(module.name)).values():
                if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                    found[(value.pattern, value.flags)] = value
    return list(found.values())


def _texts() -> list[str]:
    texts = [path.read_text(encoding="utf-8", errors="replace") for path in sorted((ROOT / "fixtures").rglob("*.py"))]
    return texts + [path.read_text() for path in sorted((ROOT / "rules").glob("*.py"))]


def test_guarded_patterns_match_the_same_spans_and_groups() -> None:
    patterns, texts = _module_patterns(), _texts()
    guarded = [p for p in patterns if quick(p) is not p]
    assert len(guarded) > len(patterns) // 2  # most program-level patterns are alternations of known words
    for pattern in guarded:
        fast = quick(pattern)
        for text in texts:
            expected = [(m.span(), m.groups()) for m in pattern.finditer(text)]
            assert [(m.span(), m.groups()) for m in fast.finditer(text)] == expected, pattern.pattern


@pytest.mark.parametrize("pattern, flags, expected", [
    (r"\bamp\b|\.half\(|GradScaler", 0, {"a", ".", "G"}),
    (r"(?:torch\.)?compile", 0, None),  # an optional first item: any of two starts, not read
    (r"x+y|[Bb]f16", 0, {"x", "B", "b"}),
    (r"cuda", re.IGNORECASE, {"c", "C"}),
    (r"\w+\.cuda\(", 0, None),  # a category
    (r"[^#]*cuda", 0, None),  # negated class, optional
    (r"(?=cuda)cu", 0, None),  # a lookahead first
    (r"\b", 0, None),  # empty match
])
def test_first_characters(pattern: str, flags: int, expected: set[str] | None) -> None:
    assert first_characters(pattern, flags) == (frozenset(expected) if expected is not None else None)


def test_unguardable_pattern_is_returned_as_is() -> None:
    pattern = re.compile(r"(?i)\w+_dtype")
    assert quick(pattern) is pattern
