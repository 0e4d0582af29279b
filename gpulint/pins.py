"""The torch version a project pins, read from its requirement files: fixes that need a newer API stay off
for projects that say they run an older torch."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

# The version spec after a torch requirement: `torch==1.7.0`, `torch>=1.10,<1.13` (requirements, setup.py,
# PEP 621), conda's `pytorch=1.7.0`, Poetry's `torch = ">=1.10.1, < 1.13.0"`.
_REQUIREMENT = re.compile(r"""(?:^|[\s"'\[,(])(?:py)?torch(?:\[[^\]]*\])?\s*(?:=\s*["'])?([<>=~!][^"'\n;#\]]*)""", re.M)
_UPPER = re.compile(r"(==|<=|~=|<|(?<![<>=!~])=)\s*v?(\d+)\.(\d+)")
_LOWER = re.compile(r"(==|>=|~=|>|(?<![<>=!~])=)\s*v?(\d+)\.(\d+)")
_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "environment.yml", "environment.yaml")
_PARENTS = 6  # how far up from a file to look, stopping at a repository root


@lru_cache(maxsize=256)
def _torch_specs(directory: str) -> tuple[str, ...]:
    """The version specs of torch requirements in requirement files of `directory` and its parents."""
    specs: list[str] = []
    current = Path(directory)
    for _ in range(_PARENTS):
        candidates = sorted(current.glob("requirements*.txt")) + [current / name for name in _FILES]
        for file in candidates:
            try:
                text = file.read_text(encoding="utf-8", errors="replace") if file.is_file() else ""
            except OSError:
                continue
            specs.extend(_REQUIREMENT.findall(text))
        if (current / ".git").exists() or current.parent == current:
            break
        current = current.parent
    return tuple(specs)


def _specs_for(path: str) -> tuple[str, ...]:
    file = Path(path)
    return _torch_specs(str(file.resolve().parent)) if file.is_file() else ()


def torch_pinned_below(path: str, minimum: tuple[int, int]) -> bool:
    """Do the requirement files of the project holding `path` pin torch below `minimum` (major, minor)?"""
    for spec in _specs_for(path):
        for op, major, minor in _UPPER.findall(spec):
            version = (int(major), int(minor))
            if (version if op != "<" else (version[0], version[1] - 1)) < minimum:
                return True
    return False


def torch_admitted_below(path: str, minimum: tuple[int, int]) -> str | None:
    """A torch requirement of the project holding `path` that admits a version below `minimum` (`torch>=1.7`):
    the requirement as written, or None. A bare `torch` says nothing and is not counted."""
    for spec in _specs_for(path):
        floors = [(int(major), int(minor)) for _, major, minor in _LOWER.findall(spec)]
        if max(floors, default=(0, 0)) < minimum:
            return "torch" + spec.strip()
    return None
