"""The texts of the files of the current file's program, searched by program-level rules."""

from __future__ import annotations

import re

_IMPORT_LINE = re.compile(r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+\(?([\w, \t*]+)|import[ \t]+([\w., \t]+))",
                          re.M)
_SCOPE_CACHE: dict[int, tuple[object, dict[str, set[str]]]] = {}


def _module_names(path: str) -> list[str]:
    parts = path.replace("\\", "/").removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    parts = [p for p in parts if p not in ("", ".")]
    return [".".join(parts[i:]) for i in range(len(parts))]


def _import_graph(program) -> dict[str, set[str]]:
    """path -> paths of the run it imports (a module name with several candidate files resolves to the ones
    closest to the importer)."""
    cached = _SCOPE_CACHE.get(id(program))
    if cached is not None and cached[0] is program:
        return cached[1]
    index: dict[str, list[str]] = {}
    for path in program.sources:
        for name in _module_names(path):
            index.setdefault(name, []).append(path)
    graph: dict[str, set[str]] = {}
    for path, text in program.sources.items():
        here = path.replace("\\", "/").split("/")[:-1]
        wanted: set[str] = set()
        for frm, names, plain in _IMPORT_LINE.findall(text):
            if plain:
                wanted.update(n.split(" as ")[0].strip() for n in plain.split(","))
                continue
            level = len(frm) - len(frm.lstrip("."))
            base = frm.lstrip(".")
            if level:
                base = ".".join([*here[:len(here) - level + 1], base] if base else here[:len(here) - level + 1])
            wanted.add(base)
            wanted.update(f"{base}.{n.split(' as ')[0].strip()}" for n in names.split(",") if n.strip())
        targets: set[str] = set()
        for name in wanted:
            candidates = [c for c in index.get(name.strip("."), []) if c != path]
            if candidates:
                best = max(shared_dirs(path, c) for c in candidates)
                targets.update(c for c in candidates if shared_dirs(path, c) == best)
        graph[path] = targets
    _SCOPE_CACHE.clear()
    _SCOPE_CACHE[id(program)] = (program, graph)
    return graph


def shared_dirs(a: str, b: str) -> int:
    """How many leading folders two paths share (nearest-definition choices)."""
    count = 0
    for x, y in zip(a.replace("\\", "/").split("/")[:-1], b.replace("\\", "/").split("/")[:-1]):
        if x != y:
            break
        count += 1
    return count


def program_texts(ctx) -> list[str]:
    """Texts of this file, the files that import it (up to 3 levels) and everything those import (up to 4
    levels): this file's program. Other scripts of the same repository are other programs."""
    program = ctx.program
    if ctx.path not in program.sources:
        return [ctx.module.code]
    graph = _import_graph(program)
    reverse: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            reverse.setdefault(target, set()).add(source)
    seeds, frontier = {ctx.path}, {ctx.path}
    for _ in range(3):
        frontier = {s for f in frontier for s in reverse.get(f, ())} - seeds
        seeds |= frontier
    scope, frontier = set(seeds), set(seeds)
    for _ in range(4):
        frontier = {t for f in frontier for t in graph.get(f, ())} - scope
        scope |= frontier
    return [program.sources[p] for p in sorted(scope)]


def imported_texts(ctx, levels: int = 2) -> list[str]:
    """Texts of this file and of the files it imports, and those import, `levels` deep (`from utils import
    get_network`, whose `from models.vgg import vgg16_bn` builds the network)."""
    program = ctx.program
    if ctx.path not in program.sources:
        return [ctx.module.code]
    graph = _import_graph(program)
    scope, frontier = {ctx.path}, {ctx.path}
    for _ in range(levels):
        frontier = {t for f in frontier for t in graph.get(f, ())} - scope
        scope |= frontier
    return [program.sources[p] for p in sorted(scope)]
