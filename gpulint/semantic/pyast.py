"""Walking Python's own syntax trees (`ast`), for the analyses that read whole programs without libcst (the call
graph, network sizes, precision facts): `ast.walk` and `ast.iter_child_nodes`, in their order, without the
nodes no analysis looks for (a name's load/store context, an operator), which are a third of a tree's nodes and
most of the walking time."""

from __future__ import annotations

import ast
from collections import deque
from functools import lru_cache
from typing import Iterator

# fields that hold no syntax an analysis visits: read them directly (`node.ctx`, `node.op`) where needed; and
# fields that hold plain values (names, flags), never a node
_NOT_WALKED = frozenset({"ctx", "op", "ops", "type_comment", "kind", "type_ignores",
                         "id", "attr", "arg", "name", "module", "level", "conversion", "is_async", "simple"})
_FIELDS: dict[type, tuple[str, ...]] = {}


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """`ast.iter_child_nodes(node)` without contexts and operators."""
    kind = type(node)
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = _FIELDS[kind] = tuple(name for name in kind._fields if name not in _NOT_WALKED)
    found: list[ast.AST] = []
    for name in fields:
        value = getattr(node, name, None)
        if type(value) is list:
            found.extend(item for item in value if isinstance(item, ast.AST))
        elif isinstance(value, ast.AST):
            found.append(value)
    return found


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk(node)`: breadth first, without contexts and operators."""
    pending = deque([node])
    while pending:
        current = pending.popleft()
        pending.extend(child_nodes(current))
        yield current


def dotted(node: ast.AST | None) -> str | None:
    """`a.b.c` for a chain of attributes on a name; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


@lru_cache(maxsize=256)
def top_level_calls(text: str) -> dict[str, frozenset[str]]:
    """Top-level function name -> the last names of the calls in its body (`seed` for `np.random.seed(...)`)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    return {node.name: frozenset((dotted(call.func) or "").rsplit(".", 1)[-1] for call in walk(node)
                                 if isinstance(call, ast.Call))
            for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
