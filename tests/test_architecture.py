"""Layering: rule files hold rule logic; shared analyses live in gpulint/semantic/ and never import rules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
RULE_FILES = sorted(p for p in (ROOT / "rules").glob("*.py") if p.name != "__init__.py")
SEMANTIC_FILES = sorted((ROOT / "gpulint" / "semantic").glob("*.py"))


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.stem)
def test_no_rule_imports_another_rule(path: Path) -> None:
    others = {m for m in _imported_modules(path) if m.startswith(("gpulint.rules", "rules"))}
    assert not others, f"{path.name} imports {sorted(others)}: move the shared analysis into gpulint/semantic/"


@pytest.mark.parametrize("path", SEMANTIC_FILES, ids=lambda p: p.stem)
def test_semantic_layer_does_not_import_rules_or_torch(path: Path) -> None:
    imported = _imported_modules(path)
    assert not {m for m in imported if m.startswith(("gpulint.rules", "rules"))}
    assert not {m for m in imported if m.split(".")[0] == "torch"}
