"""Every rule's examples and fixtures run as tests; contract invariants hold for all rules."""

import pytest

from gpulint.registry import all_rules, rule_by_code
from gpulint.rule import Invalid
from gpulint.testing import FIXTURES, check_example, check_fixture, fixture_files

EXAMPLES = [pytest.param(rule, example, id=f"{rule.code}-{index}")
            for rule in all_rules() for index, example in enumerate(rule.examples)]


@pytest.mark.parametrize(("rule", "example"), EXAMPLES)
def test_example(rule, example):
    check_example(rule, example)


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixture(path, update_fixtures):
    check_fixture(path, [rule_by_code(path.parent.name)], update=update_fixtures)


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_has_fixture(rule):
    assert fixture_files(rule.code), f"{rule.code} needs fixtures/{rule.code}/*.py with # expect: comments"


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_fixing_rule_has_golden(rule):
    if rule.fix_title is None:
        return
    goldens = list((FIXTURES / rule.code).glob("*.fixed.py"))
    assert goldens, f"{rule.code} fixes code, so fixtures/{rule.code}/ needs a *.fixed.py golden"
    assert any(isinstance(e, Invalid) and e.fixed is not None for e in rule.examples)


def test_codes_and_names_are_unique():
    rules = all_rules()
    assert len({r.code for r in rules}) == len(rules)
    assert len({r.name for r in rules}) == len(rules)


@pytest.mark.parametrize(("name", "acting"), [
    ("select_action", True), ("get_action", True), ("act", True), ("choose_actions", True),
    ("evaluate_actions", False),  # PPO's scoring of stored actions for the policy loss: training
])
def test_acting_functions_are_told_from_action_scoring(name: str, acting: bool) -> None:
    from gpulint.rules.eval_without_no_grad import _ACTING_FUNCTION
    assert bool(_ACTING_FUNCTION.match(name)) is acting
