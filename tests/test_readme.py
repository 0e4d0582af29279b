"""The README's rule table lists every rule as the registry defines it (`pytest --update-fixtures` rewrites it)."""

import re
from pathlib import Path

from gpulint.registry import all_rules

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- rules-table:start -->", "<!-- rules-table:end -->"


def rules_table() -> str:
    rows = ["| code | name | family | priority | severity | fix | default |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for rule in all_rules():
        rows.append(f"| {rule.code} | `{rule.name}` | {rule.family()} | {rule.priority} | {rule.severity.value} | "
                    f"{rule.safety.value} | {'on' if rule.default_enabled else 'off'} |")
    return "\n".join(rows)


def test_readme_rule_table_is_current(update_fixtures):
    text = README.read_text(encoding="utf-8")
    expected = f"{START}\n{rules_table()}\n{END}"
    current = re.search(re.escape(START) + ".*?" + re.escape(END), text, re.S).group(0)
    if update_fixtures and current != expected:
        README.write_text(text.replace(current, expected), encoding="utf-8")
        return
    assert current == expected, "README rule table is stale: run `python -m pytest tests --update-fixtures`"
