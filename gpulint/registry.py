"""Finds the rules (every `Rule` subclass in a module of `gpulint.rules`) and resolves selectors."""

from __future__ import annotations

import difflib
import importlib
import json
import os
import pkgutil
import sys
from functools import lru_cache
from typing import Iterable, NamedTuple

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


class RuleMeta(NamedTuple):
    """What settings need of a rule (selectors, defaults), known without importing it."""

    code: str
    name: str
    default_enabled: bool


_META_FORMAT = 1
_META_PREFIX = "gpulint-rules."


@lru_cache(maxsize=1)
def rule_infos() -> tuple[RuleMeta, ...]:
    """Code, name and default of every rule, sorted by code. Importing the rules imports libcst and every
    rule (a third of a second), which resolving settings does not need: their metadata is recorded in a small
    file beside the rules' byte code (`__pycache__/gpulint-rules.<fingerprint>.json`, keyed by gpulint's code
    fingerprint: any edited, added or removed source file gives a new key) when they are imported, and read
    from there when it exists. Like byte code, it is not written under PYTHONDONTWRITEBYTECODE or where the
    folder is read-only; then the rules are imported, as they were before."""
    imported = getattr(all_rules, "cache_info", None)
    if imported is None or imported().currsize:  # imported already (or replaced, e.g. by a test adding a rule)
        return tuple(RuleMeta(r.code, r.name, r.default_enabled) for r in all_rules())
    path = _meta_path()
    if path is not None:
        recorded = _read_meta(path)
        if recorded is not None:
            return recorded
    infos = tuple(RuleMeta(r.code, r.name, r.default_enabled) for r in all_rules())
    if path is not None and not sys.dont_write_bytecode:
        _write_meta(path, infos)
    return infos


def _meta_path() -> str | None:
    from gpulint.cache import _code_folders, code_fingerprint

    folders = _code_folders()[1:]  # the rules' folder(s)
    if not folders:
        return None
    return os.path.join(folders[0], "__pycache__", f"{_META_PREFIX}{code_fingerprint()}.json")


def _read_meta(path: str) -> tuple[RuleMeta, ...] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        if record["format"] != _META_FORMAT:
            return None
        infos = tuple(RuleMeta(code, name, enabled) for code, name, enabled in record["rules"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or damaged: the rules are imported
    if not all(isinstance(i.code, str) and isinstance(i.name, str) and isinstance(i.default_enabled, bool)
               for i in infos):
        return None
    return infos


def _write_meta(path: str, infos: tuple[RuleMeta, ...]) -> None:
    """Write the record atomically and remove the records of earlier code (best effort: a read-only install
    simply imports the rules each time)."""
    import tempfile

    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".gpulint-rules.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"format": _META_FORMAT, "rules": [list(info) for info in infos]}, handle)
        os.replace(temporary, path)
        for entry in os.scandir(folder):
            if entry.name.startswith(_META_PREFIX) and entry.name.endswith(".json") and entry.path != path:
                os.unlink(entry.path)
    except OSError:
        pass


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
