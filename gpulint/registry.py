"""Finds the rules (every `Rule` subclass in a module of `gpulint.rules`) and resolves selectors."""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from functools import lru_cache
from typing import Iterable

from gpulint.rule import Rule

# Diagnostics of gpulint itself, not rules: always on and never selectable away.
META_CODES = {"GPU900": "invalid-syntax", "GPU901": "io-error", "GPU902": "unused-noqa"}


class SelectorError(ValueError):
    """An unknown rule code, prefix or name; the message carries a 'did you mean' hint."""


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[Rule], ...]:
    package = importlib.import_module("gpulint.rules")
    found: list[type[Rule]] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"gpulint.rules.{info.name}")
        found.extend(obj for obj in vars(module).values()
                     if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule
                     and obj.__module__ == module.__name__)
    codes: dict[str, type[Rule]] = {}
    for rule in found:
        if rule.code in codes or rule.code in META_CODES:
            raise RuntimeError(f"duplicate rule code {rule.code} ({rule.__module__}, {codes[rule.code].__module__})")
        codes[rule.code] = rule
    names = [r.name for r in found]
    if len(set(names)) != len(names):
        raise RuntimeError("duplicate rule names in gpulint.rules")
    return tuple(sorted(found, key=lambda r: r.code))


def rule_by_code(code: str) -> type[Rule]:
    """The rule with this code (any case) or name."""
    rule = _by_code_or_name().get(code.upper()) or _by_code_or_name().get(code)
    if rule is None:
        raise SelectorError(_unknown(code))
    return rule


@lru_cache(maxsize=1)
def _by_code_or_name() -> dict[str, type[Rule]]:
    """Codes (upper case: GPU011) and names (kebab case: never a code) of every rule."""
    return {key: rule for rule in all_rules() for key in (rule.code, rule.name)}


def _unknown(selector: str) -> str:
    known = [r.code for r in all_rules()] + [r.name for r in all_rules()]
    hint = difflib.get_close_matches(selector, known, n=1)
    return f"unknown rule selector {selector!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")


def matches(rule: type[Rule], selector: str) -> bool:
    selector = selector.strip()
    return selector.upper() == "ALL" or rule.code.startswith(selector.upper()) or rule.name == selector


def validate_selectors(selectors: Iterable[str]) -> None:
    for selector in selectors:
        if selector.upper() in META_CODES:
            continue
        if not any(matches(rule, selector) for rule in all_rules()):
            raise SelectorError(_unknown(selector))


def select_rules(select: Iterable[str] | None = None, ignore: Iterable[str] = (),
                 extend_select: Iterable[str] = ()) -> tuple[type[Rule], ...]:
    """Rules enabled by the selectors: `select` replaces the default set (rules on by default)."""
    select = list(select) if select is not None else None
    ignore, extend_select = list(ignore), list(extend_select)
    validate_selectors([*(select or []), *ignore, *extend_select])
    chosen = []
    for rule in all_rules():
        if select is None:
            on = rule.default_enabled
        else:
            on = any(matches(rule, s) for s in select)
        on = on or any(matches(rule, s) for s in extend_select)
        # the most specific selector wins, as in ruff: `--select GPU01 --ignore GPU0` keeps GPU01x
        if on and ignore:
            best_ignore = max((len(s) for s in ignore if matches(rule, s)), default=-1)
            best_select = max((len(s) for s in [*(select or []), *extend_select] if matches(rule, s)), default=-1)
            on = best_ignore < best_select if best_ignore >= 0 else True
        if on:
            chosen.append(rule)
    return tuple(chosen)
