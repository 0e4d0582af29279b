"""Turn command-line paths into the Python files to lint.

Directories are walked recursively; nested `.gitignore` files are honoured; default excludes (VCS folders,
virtualenvs, caches, build outputs, cookiecutter templates) are matched relative to the project root. A file
named on the command line is always linted.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

DEFAULT_EXCLUDES = (
    ".git", ".hg", ".svn", ".bzr", ".venv", "venv", ".env", "env", "__pypackages__", ".tox", ".nox",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".gpulint_cache", "__pycache__", "build", "dist",
    "site-packages", "node_modules", ".eggs", "*.egg-info", ".ipynb_checkpoints",
    # cookiecutter/Jinja templates (`{{cookiecutter.name}}/train.py`): not Python until rendered
    "*{{*", "*{%*",
)


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    negated: bool
    dir_only: bool


def _compile_gitignore_line(line: str) -> _Pattern | None:
    line = line.rstrip("\n").rstrip("\r")
    if not line.strip() or line.startswith("#"):
        return None
    line = line.rstrip() if not line.endswith("\\ ") else line
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    if line.startswith("\\"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    anchored = "/" in line
    line = line.lstrip("/")
    parts = []
    index = 0
    while index < len(line):
        if line.startswith("**/", index):
            parts.append("(?:.*/)?")
            index += 3
        elif line.startswith("/**", index) and index + 3 == len(line):
            parts.append("/.*")
            index += 3
        elif line[index] == "*":
            parts.append("[^/]*")
            index += 1
        elif line[index] == "?":
            parts.append("[^/]")
            index += 1
        elif line[index] == "[":
            end = line.find("]", index)
            if end == -1:
                parts.append(re.escape(line[index]))
                index += 1
            else:
                parts.append(fnmatch.translate(line[index:end + 1])[4:-3])
                index = end + 1
        else:
            parts.append(re.escape(line[index]))
            index += 1
    body = "".join(parts)
    regex = ("^" if anchored else "^(?:.*/)?") + body + "$"
    return _Pattern(re.compile(regex), negated, dir_only)


class _IgnoreStack:
    """Gitignore rules active at one directory: (base directory, patterns) from the root downwards."""

    def __init__(self, layers: tuple[tuple[Path, tuple[_Pattern, ...]], ...] = ()) -> None:
        self.layers = layers

    def with_dir(self, directory: Path) -> "_IgnoreStack":
        gitignore = directory / ".gitignore"
        try:
            lines = gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return self
        patterns = tuple(p for p in map(_compile_gitignore_line, lines) if p is not None)
        return _IgnoreStack(self.layers + ((directory, patterns),)) if patterns else self

    def ignored(self, path: Path, is_dir: bool) -> bool:
        verdict = False
        for base, patterns in self.layers:
            try:
                relative = path.relative_to(base).as_posix()
            except ValueError:
                continue
            for pattern in patterns:
                if pattern.dir_only and not is_dir:
                    continue
                if pattern.regex.match(relative):
                    verdict = not pattern.negated
        return verdict


def find_project_root(start: Path) -> Path:
    """Nearest ancestor holding pyproject.toml, gpulint.toml or .git; else `start` itself."""
    start = start.resolve()
    for directory in (start, *start.parents):
        if any((directory / marker).exists() for marker in ("pyproject.toml", "gpulint.toml", ".git")):
            return directory
    return start


def _excluded(relative: str, name: str, excludes: Iterable[str]) -> bool:
    for pattern in excludes:
        if "/" in pattern.strip("/"):
            if fnmatch.fnmatch(relative, pattern.strip("/")) or relative.startswith(pattern.strip("/") + "/"):
                return True
        elif fnmatch.fnmatch(name, pattern):
            return True
    return False


def link_problem(path: Path) -> str | None:
    """Why a symlink cannot be followed (a loop, a missing target), in the system's words; None otherwise."""
    if not path.is_symlink():
        return None
    try:
        os.stat(path)
    except OSError as exc:
        return f"{exc.strerror or exc} (symbolic link to {os.readlink(path)!r})"
    except RuntimeError:
        return "Too many levels of symbolic links"
    return None


@dataclass(frozen=True)
class DiscoveryProblem:
    path: str
    message: str


def discover(paths: Iterable[str], *, excludes: Iterable[str] = DEFAULT_EXCLUDES, respect_gitignore: bool = True,
             root: Path | None = None) -> tuple[list[Path], list[DiscoveryProblem]]:
    """Files to lint (sorted, unique) and problems such as missing paths."""
    found, problems = discover_resolved(paths, excludes=excludes, respect_gitignore=respect_gitignore, root=root)
    return [path for path, _ in found], problems


def discover_resolved(paths: Iterable[str], *, excludes: Iterable[str] = DEFAULT_EXCLUDES,
                      respect_gitignore: bool = True, root: Path | None = None
                      ) -> tuple[list[tuple[Path, Path]], list[DiscoveryProblem]]:
    """`discover`, each file with its resolved path (found once, here)."""
    files: dict[str, Path] = {}
    problems: list[DiscoveryProblem] = []
    excludes = tuple(excludes)
    for raw in paths:
        path = Path(raw)
        broken = link_problem(path)
        if broken is not None:
            problems.append(DiscoveryProblem(raw, broken))
            continue
        if not path.exists():
            problems.append(DiscoveryProblem(raw, "No such file or directory"))
            continue
        if path.is_file() or (path.is_symlink() and not path.is_dir()):
            files.setdefault(str(path.resolve()), path)  # named explicitly: always linted
            continue
        project = root or find_project_root(path)
        stack = _IgnoreStack()
        if respect_gitignore:
            resolved = path.resolve()
            for parent in reversed([resolved, *resolved.parents]):
                if parent == project or project in parent.parents:
                    stack = stack.with_dir(parent)
        for found, real in _walk(path, project, stack, excludes, respect_gitignore, problems):
            files.setdefault(str(real), found)
    return sorted(((path, Path(real)) for real, path in files.items()), key=lambda pair: pair[0].as_posix()), problems


def _walk(directory: Path, project: Path, stack: _IgnoreStack, excludes: tuple[str, ...], respect_gitignore: bool,
          problems: list[DiscoveryProblem]) -> Iterator[tuple[Path, Path]]:
    """(file, the file resolved) of every Python file to lint under `directory`."""
    seen: set[tuple[int, int]] = set()

    def visit(current: Path, ignores: _IgnoreStack, real: Path) -> Iterator[tuple[Path, Path]]:
        """`real`: `current` resolved (an entry that is no symbolic link resolves to `real / name`)."""
        try:
            info = current.stat()
        except OSError as exc:
            problems.append(DiscoveryProblem(str(current), exc.strerror or str(exc)))
            return
        key = (info.st_dev, info.st_ino)
        if key in seen:  # symlink loop or a directory reached twice
            return
        seen.add(key)
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            problems.append(DiscoveryProblem(str(current), exc.strerror or str(exc)))
            return
        for entry in entries:
            child = Path(entry.path)
            try:
                is_dir = entry.is_dir()
            except OSError as exc:  # a symlink loop
                if entry.name.endswith(".py"):
                    problems.append(DiscoveryProblem(str(child), link_problem(child) or exc.strerror or str(exc)))
                continue
            try:
                child_real: Path | None = child.resolve() if entry.is_symlink() else real / entry.name
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
                child_real = None
            try:
                relative = child_real.relative_to(project).as_posix() if child_real is not None else child.name
            except ValueError:
                relative = child.name
            if _excluded(relative, entry.name, excludes):
                continue
            if respect_gitignore and ignores.ignored(child, is_dir):
                continue
            if is_dir:
                yield from visit(child, ignores.with_dir(child) if respect_gitignore else ignores,
                                 child_real if child_real is not None else child)
            elif entry.name.endswith(".py"):
                broken = link_problem(child) if entry.is_symlink() else None
                if broken is not None:
                    problems.append(DiscoveryProblem(str(child), broken))
                    continue
                yield child, child_real if child_real is not None else child.resolve()

    start = directory.resolve()
    yield from visit(start, stack, start)
