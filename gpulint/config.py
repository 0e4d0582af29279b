"""Configuration: `[tool.gpulint]` in pyproject.toml, or a standalone `gpulint.toml` / `.gpulint.toml`.

The ruff model: each file is linted with the settings of the **nearest** config file above it (in one folder,
`.gpulint.toml` beats `gpulint.toml`, which beats a `pyproject.toml` that has a `[tool.gpulint]` table).
Configs are not merged implicitly; `extend = "../pyproject.toml"` inherits explicitly. Paths in a config
(`exclude`, `per-file-ignores`, `extend`) are relative to the folder of the file that says them. The command
line overrides every config; `--config PATH` uses one file for everything, `--isolated` ignores them all.

Linter keys may sit at the top of the table or under `[tool.gpulint.lint]`. Rule options go under
`[tool.gpulint.options.GPU053]` (or `[tool.gpulint.lint.options.GPU053]`), keys in kebab-case or snake_case.
Any unknown key, rule code, option or value type is a one-line ConfigError (exit code 2).
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from gpulint.cli import OUTPUT_FORMATS  # one list for the command line and the config (cli imports no config)
from gpulint.discovery import DEFAULT_EXCLUDES
from gpulint.registry import META_CODES, RuleMeta, all_rules, matches, rule_infos
from gpulint.rule import Rule

CONFIG_FILES = (".gpulint.toml", "gpulint.toml", "pyproject.toml")
# Meta codes a user may select or ignore like a rule (the others are always on).
SELECTABLE_META = {"GPU902": META_CODES.get("GPU902", "unused-noqa")}

_LIST_KEYS = ("select", "ignore", "extend-select", "fixable", "unfixable", "extend-fixable", "extend-safe-fixes",
              "extend-unsafe-fixes")
_TABLE_KEYS = ("per-file-ignores", "extend-per-file-ignores")
_LINT_KEYS = frozenset(_LIST_KEYS + _TABLE_KEYS + ("options",))
_BOOL_KEYS = ("respect-gitignore", "force-exclude", "unsafe-fixes", "show-fixes")
_TOP_KEYS = frozenset(_LINT_KEYS | {"extend", "exclude", "extend-exclude", "output-format", "cache-dir", "lint"}
                      | set(_BOOL_KEYS))


class ConfigError(ValueError):
    """A configuration problem; the message is one line and names the file."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    hint = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


# -- selectors ----------------------------------------------------------------------------------------------

def _meta_matches(code: str, selector: str) -> bool:
    selector = selector.strip()
    return selector.upper() == "ALL" or code.startswith(selector.upper()) or SELECTABLE_META[code] == selector


# Settings are resolved from the rules' metadata (`registry.rule_infos`): the rules themselves, and libcst, are
# imported only where a rule's class is needed (its options declared in a config, the lint itself).

def _all_codes() -> list[str]:
    return [r.code for r in rule_infos()] + list(SELECTABLE_META)


def selector_matches(code: str, selector: str) -> bool:
    if code in SELECTABLE_META:
        return _meta_matches(code, selector)
    rule = _infos_by_code().get(code)
    return rule is not None and matches(rule, selector)


@lru_cache(maxsize=1)
def _infos_by_code() -> dict[str, RuleMeta]:
    return {r.code: r for r in rule_infos()}


@lru_cache(maxsize=1)
def _rules_by_code() -> dict[str, type[Rule]]:
    return {r.code: r for r in all_rules()}


def validate_selector(selector: str) -> str | None:
    """None if `selector` names at least one rule (code, prefix, name, ALL), else an error message."""
    if not isinstance(selector, str) or not selector.strip():
        return f"invalid rule selector {selector!r}"
    if selector.strip().upper() in META_CODES:
        return None
    if any(selector_matches(code, selector) for code in _all_codes()):
        return None
    known = _all_codes() + [r.name for r in rule_infos()] + list(SELECTABLE_META.values())
    return f"unknown rule selector {selector!r}" + did_you_mean(selector, known)


def _specificity(selector: str) -> int:
    selector = selector.strip()
    if selector.upper() == "ALL":
        return 0
    return 100 if "-" in selector else len(selector)  # a rule name is as specific as a full code


# -- one source of settings ---------------------------------------------------------------------------------

@dataclass
class Layer:
    """Settings from one place: a config file (paths relative to `base`) or the command line (cwd)."""

    source: str
    base: Path
    select: list[str] | None = None
    ignore: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    fixable: list[str] | None = None
    unfixable: list[str] = field(default_factory=list)
    extend_fixable: list[str] = field(default_factory=list)
    extend_safe_fixes: list[str] = field(default_factory=list)  # treat these rules' unsafe fixes as safe
    extend_unsafe_fixes: list[str] = field(default_factory=list)  # and these rules' safe fixes as unsafe
    per_file_ignores: dict[str, list[str]] | None = None
    extend_per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] | None = None
    extend_exclude: list[str] = field(default_factory=list)
    respect_gitignore: bool | None = None
    force_exclude: bool | None = None
    unsafe_fixes: bool | None = None
    show_fixes: bool | None = None
    output_format: str | None = None
    cache_dir: Path | None = None
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def validate(self) -> None:
        where = self.source
        cli = where == "command line"

        def label(key: str) -> str:
            return f"--{key.replace('_', '-')}" if cli else f"{where}: {key.replace('_', '-')}"

        for key in ("select", "ignore", "extend_select", "fixable", "unfixable", "extend_fixable",
                    "extend_safe_fixes", "extend_unsafe_fixes"):
            for selector in getattr(self, key) or ():
                problem = validate_selector(selector)
                if problem:
                    raise ConfigError(f"{label(key)}: {problem}")
        for key in ("per_file_ignores", "extend_per_file_ignores"):
            for pattern, selectors in (getattr(self, key) or {}).items():
                for selector in selectors:
                    problem = validate_selector(selector)
                    if problem:
                        raise ConfigError(f"{label(key)} {pattern!r}: {problem}")
        if self.output_format is not None and self.output_format not in OUTPUT_FORMATS:
            raise ConfigError(f"{where}: output-format: unknown format {self.output_format!r}"
                              + did_you_mean(self.output_format, OUTPUT_FORMATS)
                              + f"; one of {', '.join(OUTPUT_FORMATS)}")
        options: dict[str, dict[str, Any]] = {}
        for code, values in self.options.items():
            rule_code, resolved = _validate_options(where, code, values)
            options.setdefault(rule_code, {}).update(resolved)
        self.options = options


def _validate_options(where: str, code: str, values: Any) -> tuple[str, dict[str, Any]]:
    rule = _rules_by_code().get(str(code).upper())
    if rule is None:
        by_name = {r.name: r for r in all_rules()}
        rule = by_name.get(code)
    if rule is None:
        raise ConfigError(f"{where}: options: unknown rule code {code!r}"
                          + did_you_mean(str(code), [r.code for r in all_rules()]))
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: options.{code} must be a table of option = value")
    declared = dict(rule.options)
    resolved: dict[str, Any] = {}
    for key, value in values.items():
        own = _own_key(key, declared)
        if own is None:
            kebab = [k.replace("_", "-") for k in declared]
            listing = f"; {rule.code} has {', '.join(sorted(kebab))}" if kebab else f"; {rule.code} has no options"
            raise ConfigError(f"{where}: options.{code}: unknown option {key!r}"
                              + did_you_mean(key.replace("_", "-"), kebab) + listing)
        default = declared[own]
        if not _same_type(value, default):
            raise ConfigError(f"{where}: options.{code}.{key}: expected {type(default).__name__}, "
                              f"got {type(value).__name__} {value!r}")
        resolved[own] = value
    return rule.code, resolved


def _own_key(key: str, declared: dict[str, Any]) -> str | None:
    for candidate in (key, key.replace("-", "_"), key.replace("_", "-")):
        if candidate in declared:
            return candidate
    return None


def _same_type(value: Any, default: Any) -> bool:
    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, (list, tuple)):
        return isinstance(value, list)
    return isinstance(value, type(default))


# -- reading files ------------------------------------------------------------------------------------------

def _load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{shown_path(path)}: invalid TOML: {error}") from None
    except UnicodeDecodeError as error:  # TOML is UTF-8 by definition
        raise ConfigError(f"{shown_path(path)}: not valid UTF-8 (byte {error.object[error.start:error.start + 1]!r} "
                          f"at offset {error.start}); TOML files must be UTF-8") from None
    except OSError as error:
        raise ConfigError(f"{shown_path(path)}: cannot read: {error.strerror or error}") from None


def _table_of(path: Path, data: dict[str, Any]) -> dict[str, Any] | None:
    if path.name == "pyproject.toml":
        tool = data.get("tool", {})
        return tool.get("gpulint") if isinstance(tool, dict) else None
    return data


def has_gpulint_table(path: Path) -> bool:
    if path.name != "pyproject.toml":
        return True
    try:
        return _table_of(path, _load_toml(path)) is not None
    except ConfigError:
        return True  # broken TOML is reported when it is used


def layer_from_table(table: dict[str, Any], source: str, base: Path) -> tuple[Layer, str | None]:
    """A validated Layer from a `[tool.gpulint]`-shaped table, and its `extend` value."""
    prefix = "tool.gpulint" if source.endswith("pyproject.toml") else ""
    _check_keys(table, _TOP_KEYS, source, prefix)
    lint = table.get("lint", {})
    if not isinstance(lint, dict):
        raise ConfigError(f"{source}: `lint` must be a table")
    _check_keys(lint, _LINT_KEYS, source, f"{prefix}.lint" if prefix else "lint")
    merged = {k: v for k, v in table.items() if k in _LINT_KEYS}
    for key, value in lint.items():
        if key in merged:
            raise ConfigError(f"{source}: {key!r} is set both at the top level and under `lint`")
        merged[key] = value
    layer = Layer(source, base)
    for key in _LIST_KEYS:
        if key in merged:
            setattr(layer, key.replace("-", "_"), _string_list(merged[key], source, key))
    for key in _TABLE_KEYS:
        if key in merged:
            setattr(layer, key.replace("-", "_"), _pattern_table(merged[key], source, key))
    if "options" in merged:
        if not isinstance(merged["options"], dict):
            raise ConfigError(f"{source}: options must be a table of rule code -> table")
        layer.options = dict(merged["options"])
    if "exclude" in table:
        layer.exclude = _string_list(table["exclude"], source, "exclude")
    if "extend-exclude" in table:
        layer.extend_exclude = _string_list(table["extend-exclude"], source, "extend-exclude")
    for key in _BOOL_KEYS:
        if key in table:
            if not isinstance(table[key], bool):
                raise ConfigError(f"{source}: {key} must be true or false, got {table[key]!r}")
            setattr(layer, key.replace("-", "_"), table[key])
    if "output-format" in table:
        if not isinstance(table["output-format"], str):
            raise ConfigError(f"{source}: output-format must be a string")
        layer.output_format = table["output-format"]
    if "cache-dir" in table:
        if not isinstance(table["cache-dir"], str):
            raise ConfigError(f"{source}: cache-dir must be a path string")
        layer.cache_dir = base / os.path.expanduser(table["cache-dir"])
    extend = table.get("extend")
    if extend is not None and not isinstance(extend, str):
        raise ConfigError(f"{source}: extend must be a path string")
    layer.validate()
    return layer, extend


def _check_keys(table: dict[str, Any], allowed: frozenset[str], source: str, prefix: str) -> None:
    for key in table:
        if key not in allowed:
            where = f"[{prefix}]" if prefix else "the top level"
            raise ConfigError(f"{source}: unknown key {key!r} in {where}" + did_you_mean(key, allowed))


def _string_list(value: Any, source: str, key: str) -> list[str]:
    if isinstance(value, str):
        raise ConfigError(f"{source}: {key} must be a list of strings, e.g. {key} = [{value!r}]")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: {key} must be a list of strings")
    return list(value)


def _pattern_table(value: Any, source: str, key: str) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {key} must be a table of glob -> list of rule selectors")
    return {pattern: _string_list(codes, source, f"{key} {pattern!r}") for pattern, codes in value.items()}


def load_config_file(path: Path, _seen: tuple[Path, ...] = ()) -> list[Layer]:
    """The layers of a config file: what it `extend`s first, then the file itself."""
    path = path.resolve()
    if path in _seen:
        raise ConfigError(f"{shown_path(path)}: circular `extend` chain")
    table = _table_of(path, _load_toml(path))
    if table is None:
        raise ConfigError(f"{shown_path(path)}: no [tool.gpulint] table")
    if not isinstance(table, dict):
        raise ConfigError(f"{shown_path(path)}: [tool.gpulint] must be a table")
    layer, extend = layer_from_table(table, shown_path(path), path.parent)
    layers = [layer]
    if extend:
        parent = (path.parent / os.path.expanduser(extend)).resolve()
        if not parent.is_file():
            raise ConfigError(f"{shown_path(path)}: extend: no such file {extend!r}")
        layers = load_config_file(parent, _seen + (path,)) + layers
    return layers


def shown_path(path: Path) -> str:
    """A config path as messages show it: relative to the cwd when below it."""
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def parse_inline(text: str) -> dict[str, Any]:
    """`--config "lint.select = ['GPU01']"`: one TOML assignment."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {text!r}: not a file and not a valid `key = value` TOML line ({error})") \
            from None


def find_config_file(directory: Path) -> Path | None:
    """Nearest config file at or above `directory` (a pyproject.toml counts only with [tool.gpulint])."""
    directory = directory.resolve()
    for folder in (directory, *directory.parents):
        found = _config_in(folder)
        if found is not None:
            return found
    return None


@lru_cache(maxsize=4096)
def _config_in(folder: Path) -> Path | None:
    for name in CONFIG_FILES:
        candidate = folder / name
        if candidate.is_file() and has_gpulint_table(candidate):
            return candidate
    return None


# -- resolved settings ----------------------------------------------------------------------------------------

_GLOB_CACHE: dict[str, re.Pattern[str]] = {}


def _glob_regex(pattern: str) -> re.Pattern[str]:
    cached = _GLOB_CACHE.get(pattern)
    if cached is not None:
        return cached
    parts, index = [], 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            parts.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            parts.append(".*")
            index += 2
        elif pattern[index] == "*":
            parts.append("[^/]*")
            index += 1
        elif pattern[index] == "?":
            parts.append("[^/]")
            index += 1
        elif pattern[index] == "[" and "]" in pattern[index + 1:]:
            end = pattern.index("]", index + 1)
            parts.append(fnmatch.translate(pattern[index:end + 1])[4:-3])
            index = end + 1
        else:
            parts.append(re.escape(pattern[index]))
            index += 1
    compiled = re.compile("".join(parts) + "$")
    _GLOB_CACHE[pattern] = compiled
    return compiled


@functools.lru_cache(maxsize=8192)
def _resolved(path: Path) -> Path:
    """`path.resolve()`, once per path: every exclude pattern is matched against every discovered file."""
    return path.resolve()


def path_matches(pattern: str, path: Path, base: Path, below: Path | None = None) -> bool:
    """Does a config glob match `path`? A pattern without `/` matches any path component (a file or folder
    name); one with `/` is anchored at `base` and also matches everything below a matching folder. With
    `below` (the folder named on the command line), only components under it count: a folder you name is
    walked even if its own name is excluded, as in ruff."""
    clean = _clean_pattern(pattern)
    if not clean:
        return False
    return _matches_at(clean, path, *_pieces(path, base, below))


def _clean_pattern(pattern: str) -> str:
    pattern = pattern.strip()
    if pattern.startswith("./"):
        pattern = pattern[2:]
    return pattern.strip("/")


def _pieces(path: Path, base: Path, below: Path | None, real: Path | None = None
            ) -> tuple[tuple[str, ...] | None, int]:
    """`path`'s components below `base` (None if it is not below it), and how many of them `below` covers.
    `real`: `path` resolved, if known."""
    resolved_base = _resolved(base)
    try:
        pieces = (real if real is not None else _resolved(path)).relative_to(resolved_base).parts
    except ValueError:
        pieces = None
    start = 0
    if below is not None and pieces is not None:
        try:
            start = len(_resolved(below).relative_to(resolved_base).parts)
        except ValueError:
            start = 0
    return pieces, start


def _matches_at(clean: str, path: Path, pieces: tuple[str, ...] | None, start: int) -> bool:
    regex = _glob_regex(clean)
    if "/" not in clean:
        names = pieces[start:] if pieces is not None else (path.name,)
        return any(regex.match(name) for name in names)
    if pieces is None:
        return False
    return any(regex.match("/".join(pieces[:end])) for end in range(max(start, 0) + 1, len(pieces) + 1))


@dataclass(frozen=True)
class PatternCodes:
    base: Path
    pattern: str
    selectors: tuple[str, ...]

    def applies(self, path: Path) -> bool:
        if self.pattern.startswith("!"):
            return not path_matches(self.pattern[1:], path, self.base)
        return path_matches(self.pattern, path, self.base)


@dataclass
class Settings:
    """Everything resolved for the files governed by one config (or by none)."""

    source: str | None  # config file, or None for built-in defaults
    enabled: frozenset[str]  # rule codes and selectable meta codes
    fixable: frozenset[str]
    per_file_ignores: tuple[PatternCodes, ...]
    excludes: tuple[tuple[Path, str], ...]  # (base, pattern)
    safe_fixes: frozenset[str] = frozenset()  # rule codes whose unsafe fixes count as safe
    unsafe_fixes_of: frozenset[str] = frozenset()  # rule codes whose safe fixes count as unsafe
    respect_gitignore: bool = True
    force_exclude: bool = False
    unsafe_fixes: bool = False
    show_fixes: bool = False
    output_format: str = "full"
    cache_dir: Path | None = None  # None: .gpulint_cache beside the config file (or in the cwd)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def rules(self) -> tuple[type[Rule], ...]:
        """The enabled rules' classes (imports the rules; `infos` does not)."""
        return tuple(r for r in all_rules() if r.code in self.enabled)

    @property
    def infos(self) -> tuple[RuleMeta, ...]:
        return tuple(r for r in rule_infos() if r.code in self.enabled)

    def infos_for(self, path: Path) -> tuple[RuleMeta, ...]:
        ignored = self.ignored_for(path)
        return tuple(r for r in self.infos if r.code not in ignored)

    def ignored_for(self, path: Path) -> frozenset[str]:
        ignored = set()
        for entry in self.per_file_ignores:
            if entry.applies(path):
                ignored.update(code for code in _all_codes()
                               if any(selector_matches(code, s) for s in entry.selectors))
        return frozenset(ignored)

    def rules_for(self, path: Path) -> tuple[type[Rule], ...]:
        ignored = self.ignored_for(path)
        return tuple(r for r in self.rules if r.code not in ignored)

    def code_enabled(self, code: str, path: Path) -> bool:
        if code in META_CODES and code not in SELECTABLE_META:
            return True
        return code in self.enabled and code not in self.ignored_for(path)

    def is_fixable(self, code: str) -> bool:
        return code in self.fixable

    def fix_safety(self, code: str, safety: Any) -> Any:
        """A fix's safety after `extend-safe-fixes` / `extend-unsafe-fixes`."""
        from gpulint.diagnostics import Safety

        if safety is Safety.UNSAFE and code in self.safe_fixes:
            return Safety.SAFE
        if safety is Safety.SAFE and code in self.unsafe_fixes_of:
            return Safety.UNSAFE
        return safety

    def is_excluded(self, path: Path, below: Path | None = None, real: Path | None = None) -> bool:
        """`path_matches` for every exclude pattern, with the path's components found once per base folder.
        `real`: `path` resolved, where the caller has it."""
        pieces: dict[Path, tuple[tuple[str, ...] | None, int]] = {}
        for base, pattern in self.excludes:
            clean = _clean_pattern(pattern)
            if not clean:
                continue
            found = pieces.get(base)
            if found is None:
                found = pieces[base] = _pieces(path, base, below, real)
            if _matches_at(clean, path, *found):
                return True
        return False

    def walk_excludes(self) -> tuple[str, ...]:
        """Name-only patterns, pruned while walking; the anchored ones are checked per file."""
        return tuple(p for _, p in self.excludes if "/" not in p.strip().strip("/"))

    def describe(self) -> dict[str, Any]:
        return {
            "config": self.source,
            "enabled": sorted(self.enabled),
            "fixable": sorted(self.fixable) if self.fixable != frozenset(_all_codes()) else ["ALL"],
            "per-file-ignores": {f"{e.base}/{e.pattern}": list(e.selectors) for e in self.per_file_ignores},
            "exclude": [str(base / p) if "/" in p else p for base, p in self.excludes],
            "respect-gitignore": self.respect_gitignore,
            "force-exclude": self.force_exclude,
            "unsafe-fixes": self.unsafe_fixes,
            "show-fixes": self.show_fixes,
            "output-format": self.output_format,
            "cache-dir": str(self.cache_dir) if self.cache_dir else None,
            "options": self.options,
        }


def _select(layers: Sequence[Layer]) -> frozenset[str]:
    codes = _all_codes()
    enabled = {r.code for r in rule_infos() if r.default_enabled} | set(SELECTABLE_META)
    for layer in layers:
        chosen = set()
        for code in codes:
            selectors = [*(layer.select or []), *layer.extend_select]
            best_select = max((_specificity(s) for s in selectors if selector_matches(code, s)), default=-1)
            best_ignore = max((_specificity(s) for s in layer.ignore if selector_matches(code, s)), default=-1)
            if layer.select is not None:
                on = best_select >= 0
            else:
                on = code in enabled or best_select >= 0
            if best_ignore >= 0 and best_ignore >= best_select:
                on = False
            if on:
                chosen.add(code)
        enabled = chosen
    return frozenset(enabled)


def _fixable(layers: Sequence[Layer]) -> frozenset[str]:
    codes = _all_codes()
    fixable = set(codes)
    for layer in layers:
        if layer.fixable is not None:
            fixable = {c for c in codes if any(selector_matches(c, s) for s in layer.fixable)}
        fixable |= {c for c in codes if any(selector_matches(c, s) for s in layer.extend_fixable)}
        fixable -= {c for c in codes if any(selector_matches(c, s) for s in layer.unfixable)}
    return frozenset(fixable)


def resolve(layers: Sequence[Layer], source: str | None = None) -> Settings:
    per_file: list[PatternCodes] = []
    for layer in layers:
        if layer.per_file_ignores is not None:
            per_file = [PatternCodes(layer.base, p, tuple(c)) for p, c in layer.per_file_ignores.items()]
    for layer in layers:
        per_file += [PatternCodes(layer.base, p, tuple(c)) for p, c in layer.extend_per_file_ignores.items()]
    excludes: list[tuple[Path, str]] = [(Path.cwd(), p) for p in DEFAULT_EXCLUDES]
    for layer in layers:
        if layer.exclude is not None:
            excludes = [(layer.base, p) for p in layer.exclude]
    for layer in layers:
        excludes += [(layer.base, p) for p in layer.extend_exclude]
    options: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for code, values in layer.options.items():
            options.setdefault(code, {}).update(values)
    codes = _all_codes()

    def union(key: str) -> frozenset[str]:
        return frozenset(c for c in codes for layer in layers
                         if any(selector_matches(c, s) for s in getattr(layer, key)))

    settings = Settings(source, _select(layers), _fixable(layers), tuple(per_file), tuple(excludes),
                        union("extend_safe_fixes"), union("extend_unsafe_fixes"), options=options)
    for key in ("respect_gitignore", "force_exclude", "unsafe_fixes", "show_fixes", "output_format", "cache_dir"):
        for layer in layers:
            value = getattr(layer, key)
            if value is not None:
                setattr(settings, key, value)
    return settings


class Resolver:
    """Settings for each linted path: nearest config (cached per folder), then the command-line layer."""

    def __init__(self, cli: Layer, *, config: str | None = None, isolated: bool = False) -> None:
        cli.validate()
        self.cli = cli
        self.isolated = isolated
        self.fixed_layers: list[Layer] | None = None
        self.fixed_source: str | None = None
        self._by_config: dict[str | None, Settings] = {}
        self._by_folder: dict[Path, Settings] = {}
        self.inline: list[Layer] = []
        if config is not None:
            candidate = Path(config)
            if candidate.is_file():
                self.fixed_layers = load_config_file(candidate)
                self.fixed_source = str(candidate.resolve())
            elif "=" in config:
                table = parse_inline(config)
                layer, extend = layer_from_table(table, f"--config {config!r}", Path.cwd())
                if extend:
                    raise ConfigError("--config: `extend` is not allowed inline")
                self.inline = [layer]
            else:
                raise ConfigError(f"--config: no such file {config!r}")

    def settings_for(self, path: Path) -> Settings:
        folder = path.resolve() if path.is_dir() else path.resolve().parent
        return self._settings_in(folder)

    def settings_for_file(self, resolved: Path) -> Settings:
        """`settings_for` a file whose path is resolved already (no folder can be named here)."""
        return self._settings_in(resolved.parent)

    def _settings_in(self, folder: Path) -> Settings:
        cached = self._by_folder.get(folder)
        if cached is not None:
            return cached
        if self.fixed_layers is not None:
            layers, source = self.fixed_layers, self.fixed_source
        elif self.isolated:
            layers, source = [], None
        else:
            found = find_config_file(folder)
            layers, source = (load_config_file(found), str(found)) if found else ([], None)
        settings = self._by_config.get(source)
        if settings is None:
            settings = resolve([*layers, *self.inline, self.cli], source)
            self._by_config[source] = settings
        self._by_folder[folder] = settings
        return settings

    def all_settings(self) -> list[Settings]:
        return list(self._by_config.values())

