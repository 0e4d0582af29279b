"""Shared by tests/ and rule authors: run a rule's examples and `fixtures/<CODE>/` files with inline expectations.

A fixture line ending in `# expect: GPU011` (or `# expect: GPU011, GPU010`) must produce exactly those
findings on that line; `# expect[+1]: GPU011` points at the next line (for multi-line statements).
A sibling `name.fixed.py` is the expected result of fixing (unsafe fixes included).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Iterable

from gpulint.diagnostics import Safety
from gpulint.engine import lint_text
from gpulint.fixer import fix_text
from gpulint.rule import Invalid, Rule, Valid

_EXPECT = re.compile(r"#\s*expect(?:\[(?P<offset>[+-]\d+)\])?:\s*(?P<codes>GPU\d{3}(?:\s*,\s*GPU\d{3})*)")
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


class ExampleFailure(AssertionError):
    pass


def expected_findings(text: str) -> Counter:
    """(line, code) pairs the `# expect:` comments ask for."""
    expected: Counter = Counter()
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _EXPECT.finditer(line):
            target = number + int(match.group("offset") or 0)
            for code in re.split(r"\s*,\s*", match.group("codes")):
                expected[(target, code)] += 1
    return expected


def check_example(rule: type[Rule], example: Valid | Invalid) -> None:
    found = lint_text(example.code, "<example>", [rule]).diagnostics
    found = [d for d in found if d.code == rule.code]
    if isinstance(example, Valid):
        if found:
            raise ExampleFailure(f"{rule.code}: valid example produced {[(d.line, d.message) for d in found]}:\n"
                                 f"{example.code}")
        return
    if not found:
        raise ExampleFailure(f"{rule.code}: invalid example produced no finding:\n{example.code}")
    if example.count is not None and len(found) != example.count:
        raise ExampleFailure(f"{rule.code}: expected {example.count} findings, got {len(found)}")
    outcome = fix_text(example.code, "<example>", [rule], min_safety=Safety.UNSAFE)
    if outcome.error:
        raise ExampleFailure(f"{rule.code}: {outcome.error}")
    expected = example.fixed if example.fixed is not None else example.code
    if outcome.text != expected:
        raise ExampleFailure(f"{rule.code}: fixed code differs.\n--- expected\n{expected}\n--- got\n{outcome.text}")
    again = fix_text(outcome.text, "<example>", [rule], min_safety=Safety.UNSAFE)
    if again.text != outcome.text:
        raise ExampleFailure(f"{rule.code}: fixing is not idempotent:\n{again.text}")


def fixture_files(code: str | None = None) -> list[Path]:
    root = FIXTURES / code if code else FIXTURES
    return sorted(p for p in root.rglob("*.py") if not p.name.endswith(".fixed.py"))


def check_fixture(path: Path, rules: Iterable[type[Rule]], *, update: bool = False) -> None:
    """`path` must produce exactly its `# expect:` findings (for the codes of `rules`), and fix to `.fixed.py`."""
    rules = list(rules)
    text = path.read_text(encoding="utf-8")
    codes = {r.code for r in rules}
    found = Counter((d.line, d.code) for d in lint_text(text, str(path), rules).diagnostics if d.code in codes)
    expected = Counter({k: v for k, v in expected_findings(text).items() if k[1] in codes})
    if found != expected:
        missing, extra = expected - found, found - expected
        raise ExampleFailure(f"{path.name}: missing {sorted(missing)}; unexpected {sorted(extra)}")
    outcome = fix_text(text, str(path), rules, min_safety=Safety.UNSAFE)
    if outcome.error:
        raise ExampleFailure(f"{path.name}: {outcome.error}")
    golden = path.with_name(path.stem + ".fixed.py")
    if outcome.text == text:
        if golden.exists():
            raise ExampleFailure(f"{path.name}: nothing was fixed but {golden.name} exists")
        return
    if update:
        golden.write_text(outcome.text, encoding="utf-8")
    if not golden.exists():
        raise ExampleFailure(f"{path.name}: fixes apply but {golden.name} is missing (run pytest --update-fixtures)")
    if golden.read_text(encoding="utf-8") != outcome.text:
        raise ExampleFailure(f"{path.name}: fixed output differs from {golden.name}")
    again = fix_text(outcome.text, str(path), rules, min_safety=Safety.UNSAFE)
    if again.text != outcome.text:
        raise ExampleFailure(f"{path.name}: a second fix pass changed the file again")
