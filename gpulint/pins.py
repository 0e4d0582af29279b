"""The torch version a project pins, read from its requirement files: fixes that need a newer API stay off
for projects that say they run an older torch. A pin older than the APIs the project's own code uses
unconditionally is stale (the code cannot run on it) and is not believed."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

from gpulint.discovery import discover
from gpulint.semantic import pyast

# The version spec after a torch requirement: `torch==1.7.0`, `torch>=1.10,<1.13` (requirements, setup.py,
# PEP 621), conda's `pytorch=1.7.0`, Poetry's `torch = ">=1.10.1, < 1.13.0"`.
_REQUIREMENT = re.compile(r"""(?:^|[\s"'\[,(])(?:py)?torch(?:\[[^\]]*\])?\s*(?:=\s*["'])?([<>=~!][^"'\n;#\]]*)""", re.M)
_UPPER = re.compile(r"(==|<=|~=|<|(?<![<>=!~])=)\s*v?(\d+)\.(\d+)")
_LOWER = re.compile(r"(==|>=|~=|>|(?<![<>=!~])=)\s*v?(\d+)\.(\d+)")
_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "environment.yml", "environment.yaml")
_PARENTS = 6  # how far up from a file to look, stopping at a repository root


@lru_cache(maxsize=256)
def _torch_specs(directory: str) -> tuple[str, ...]:
    """The version specs of torch requirements in requirement files of `directory` and its parents, each
    without the specs that the code under its requirement file's folder proves stale."""
    specs: list[str] = []
    current = Path(directory)
    for _ in range(_PARENTS):
        candidates = sorted(current.glob("requirements*.txt")) + [current / name for name in _FILES]
        for file in candidates:
            try:
                text = file.read_text(encoding="utf-8", errors="replace") if file.is_file() else ""
            except OSError:
                continue
            specs.extend(spec for spec in _REQUIREMENT.findall(text) if not _stale(spec, current))
        if (current / ".git").exists() or current.parent == current:
            break
        current = current.parent
    return tuple(specs)


def _specs_for(path: str) -> tuple[str, ...]:
    file = Path(path)
    return _torch_specs(str(file.resolve().parent)) if file.is_file() else ()


def _ceiling(spec: str) -> tuple[int, int] | None:
    """The newest (major, minor) a spec admits, if it has an upper bound."""
    ceilings = [(int(major), int(minor)) if op != "<" else (int(major), int(minor) - 1)
                for op, major, minor in _UPPER.findall(spec)]
    return min(ceilings, default=None)


def torch_pinned_below(path: str, minimum: tuple[int, int]) -> bool:
    """Do the requirement files of the project holding `path` pin torch below `minimum` (major, minor)?"""
    return any(ceiling is not None and ceiling < minimum for ceiling in map(_ceiling, _specs_for(path)))


def torch_admitted_below(path: str, minimum: tuple[int, int]) -> str | None:
    """A torch requirement of the project holding `path` that admits a version below `minimum` (`torch>=1.7`):
    the requirement as written, or None. A bare `torch` says nothing and is not counted; nor does a requirement
    whose project's own code already needs `minimum`."""
    for spec in _specs_for(path):
        floors = [(int(major), int(minor)) for _, major, minor in _LOWER.findall(spec)]
        if max(floors, default=(0, 0)) < minimum and _code_floor(str(Path(path).resolve().parent)) < minimum:
            return "torch" + spec.strip()
    return None


# -- what the code itself needs ------------------------------------------------------------------------------

# (dotted name or suffix, the torch release that introduced it): APIs whose unguarded use proves a newer torch
_INTRODUCED = {
    "torch.cuda.amp": (1, 6), "torch.cuda.amp.autocast": (1, 6), "torch.cuda.amp.GradScaler": (1, 6),
    "torch.fft": (1, 7), "torch.use_deterministic_algorithms": (1, 8), "torch.linalg": (1, 8),
    "torch.inference_mode": (1, 9), "torch.autocast": (1, 10), "torch.set_float32_matmul_precision": (1, 12),
    "torch.compile": (2, 0), "torch.func": (2, 0), "torch.nn.functional.scaled_dot_product_attention": (2, 0),
    "F.scaled_dot_product_attention": (2, 0), "torch.amp.GradScaler": (2, 3),
}
_INTRODUCED_KEYWORDS = {"persistent_workers": (1, 7)}
_MENTIONS = re.compile("|".join(re.escape(name.rsplit(".", 1)[-1]) for name in [*_INTRODUCED, *_INTRODUCED_KEYWORDS]))
_MOST_FILES = 2000  # read at most this many files of a project (its first ones, in sorted order)


def _stale(spec: str, root: Path) -> bool:
    """Does the code under `root` use an API newer than every torch `spec` admits?"""
    ceiling = _ceiling(spec)
    return ceiling is not None and _code_floor(str(root)) > ceiling


@lru_cache(maxsize=64)
def _code_floor(root: str) -> tuple[int, int]:
    """The newest torch release whose API the Python files under `root` use outside version guards (a `try`
    block, an `if` testing `hasattr` or a version); (0, 0) when none."""
    floor = (0, 0)
    files, _ = discover([root])  # the files `gpulint check` would lint there (virtualenvs, builds left out)
    for file in files[:_MOST_FILES]:
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
            if _MENTIONS.search(text) is None:
                continue
            floor = max(floor, _needs(ast.parse(text)))
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    return floor


def _needs(tree: ast.AST) -> tuple[int, int]:
    found = (0, 0)
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Try) or isinstance(node, ast.If) and re.search(
                r"hasattr|version|getattr", ast.dump(node.test)):
            continue  # guarded: the code also runs without the API
        name = None
        if isinstance(node, ast.ImportFrom) and node.module:
            name = node.module
            found = max([found, *(_INTRODUCED.get(f"{node.module}.{alias.name}", (0, 0)) for alias in node.names)])
        elif isinstance(node, ast.Import):
            found = max([found, *(_INTRODUCED.get(alias.name, (0, 0)) for alias in node.names)])
        elif isinstance(node, ast.Attribute):
            name = pyast.dotted(node)
        elif isinstance(node, ast.keyword) and node.arg in _INTRODUCED_KEYWORDS:
            found = max(found, _INTRODUCED_KEYWORDS[node.arg])
        if name is not None:
            parts = name.split(".")
            found = max([found, *(_INTRODUCED.get(".".join(parts[:end]), (0, 0)) for end in range(2, len(parts) + 1))])
            if isinstance(node, ast.Attribute):
                continue  # (its parts are the prefixes just looked up)
        pending.extend(ast.iter_child_nodes(node))
    return found
