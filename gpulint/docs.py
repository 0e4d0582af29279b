"""Rule documentation from the rules themselves: `gpulint rule CODE` (text, json) and docs/rules/<CODE>.md.

Everything comes from the rule class: metadata, its docstring (## What it does / ## Why is this slow /
## Example / ## Use instead / ## Fix safety) and its Valid/Invalid examples, so the pages never drift from
the code. Regenerate the pages with `python -m gpulint.docs` (`--check` exits 1 when one is stale).
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gpulint.diagnostics import Safety, Severity
from gpulint.registry import META_CODES, all_rules
from gpulint.rule import Invalid, Rule, Valid

DOCS_DIR = Path(__file__).resolve().parent.parent / "docs" / "rules"
GPU_RESULTS = DOCS_DIR.parent.parent / "benchmarks" / "results" / "gpu_microchecks.md"
GENERATED_NOTE = "<!-- Generated from the rule's source by `python -m gpulint.docs`; do not edit by hand. -->"


@dataclass(frozen=True)
class RuleInfo:
    """A rule, or one of gpulint's own diagnostics, described uniformly for docs, `gpulint rule` and SARIF."""

    code: str
    name: str
    message: str
    severity: Severity
    safety: Safety
    fix_title: str | None
    priority: str | None
    default_enabled: bool
    docs: str
    examples: tuple[Valid | Invalid, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    meta: bool = False
    selectable: bool = True

    @property
    def family(self) -> str:
        return self.code[:5] + "x"

    @property
    def fixes(self) -> bool:
        return self.safety is not Safety.SUGGEST

    def section(self, heading: str) -> str:
        return sections(self.docs).get(heading, "")

    @property
    def summary(self) -> str:
        """One line: the first sentence of "What it does" (or the message)."""
        text = " ".join(self.section("What it does").split())
        if not text:
            return self.message
        match = re.match(r"(.+?[.!?])(\s|$)", text)
        return match.group(1) if match else text

    @property
    def fix_availability(self) -> str:
        if not self.fixes:
            return "None"
        return "Always" if self.safety is Safety.SAFE and not self.meta else "Sometimes"


def sections(doc: str) -> dict[str, str]:
    """`## Heading` -> body (dedented, stripped)."""
    found: dict[str, str] = {}
    current: str | None = None
    body: list[str] = []
    for line in doc.splitlines():
        heading = re.match(r"^##\s+(.*\S)\s*$", line)
        if heading:
            if current is not None:
                found[current] = "\n".join(body).strip()
            current, body = heading.group(1), []
        elif current is not None:
            body.append(line)
    if current is not None:
        found[current] = "\n".join(body).strip()
    return found


def info_for(rule: type[Rule]) -> RuleInfo:
    return RuleInfo(rule.code, rule.name, rule.message, rule.severity, rule.safety, rule.fix_title, rule.priority,
                    rule.default_enabled, rule.docs(), tuple(rule.examples), dict(rule.options))


_META_DOCS = {
    "GPU900": (Severity.ERROR, Safety.SUGGEST, None, False, """
        ## What it does
        Reports a file that does not parse (libcst and CPython agree it is not valid Python), with the line
        and column of the error. One old spelling is read as what it meant: code for torch <= 0.3 passing
        `async=True` to `.cuda()` / `.to()` (a reserved word since Python 3.7; torch 0.4 renamed it
        `non_blocking=`) gets this error at the first `async=` and the rest of the file is still checked, as if
        it said `non_blocking=`, with no fixes offered for that file.

        ## Why is this slow
        It is not a performance finding: gpulint cannot analyse a file it cannot parse, so it says so instead
        of reporting the file as clean. It counts towards exit code 1 and cannot be ignored or suppressed.

        ## Example
        ```python
        def train(:
            pass
        ```

        ## Use instead
        ```python
        def train():
            pass
        ```

        ## Fix safety
        No fix.
        """),
    "GPU901": (Severity.ERROR, Safety.SUGGEST, None, False, """
        ## What it does
        Reports a path that cannot be linted: it does not exist, cannot be read, or cannot be decoded with its
        declared encoding (PEP 263 cookie, UTF-8 by default).

        ## Why is this slow
        It is not a performance finding: a file gpulint could not read must not be reported as clean. It
        counts towards exit code 1 and cannot be ignored or suppressed.

        ## Example
        ```console
        $ gpulint check missing.py
        ```

        ## Use instead
        Check paths that exist and decode with their declared encoding.

        ## Fix safety
        No fix.
        """),
    "GPU902": (Severity.WARNING, Safety.SAFE, "Remove unused suppression", True, """
        ## What it does
        Reports a suppression comment (`# noqa: GPU011`, `# gpulint: ignore[GPU011]`, a file-level
        `# gpulint: noqa: GPU011`) that names a rule which ran on the file but found nothing there, or that
        names a `GPU` code no rule has. Codes of other linters (`E501`, `F401`) and of rules that are not
        enabled for the file are left alone.

        ## Why is this slow
        Stale suppressions hide the next real finding on that line: once the code is rewritten, a leftover
        `# noqa: GPU011` silently swallows a new blocking copy. Removing them keeps suppressions meaningful.

        ## Example
        ```python
        x = x.to(device, non_blocking=True)  # noqa: GPU011
        ```

        ## Use instead
        ```python
        x = x.to(device, non_blocking=True)
        ```

        ## Fix safety
        Safe: the fix deletes only the dead codes (or the whole directive when all of its codes are dead) and
        keeps any other comment text, including chained pragmas such as `# noqa: GPU011  # type: ignore`.
        Disable the check with `ignore = ["GPU902"]`.
        """),
}


def meta_info(code: str) -> RuleInfo:
    severity, safety, fix_title, selectable, doc = _META_DOCS[code]
    messages = {"GPU900": "SyntaxError: the file does not parse", "GPU901": "The file cannot be read or decoded",
                "GPU902": "Unused suppression directive"}
    return RuleInfo(code, META_CODES.get(code, "unused-noqa"), messages[code], severity, safety, fix_title, None,
                    True, textwrap.dedent(doc).strip(), meta=True, selectable=selectable)


def all_infos(include_meta: bool = True) -> list[RuleInfo]:
    infos = [info_for(r) for r in all_rules()]
    if include_meta:
        infos += [meta_info(code) for code in sorted(_META_DOCS)]
    return infos


def find_info(selector: str) -> RuleInfo | None:
    wanted = selector.strip()
    for info in all_infos():
        if info.code == wanted.upper() or info.name == wanted:
            return info
    return None


# -- rendering ----------------------------------------------------------------------------------------------

def _fix_line(info: RuleInfo) -> str:
    if not info.fixes:
        return "No automatic fix: the finding explains what to change."
    kind = "safe" if info.safety is Safety.SAFE else "unsafe (applied only with `--unsafe-fixes`)"
    return f"Fix is available ({kind}): {info.fix_title}."


def _enabled_line(info: RuleInfo) -> str:
    if info.meta and not info.selectable:
        return "Always on."
    return "Enabled by default." if info.default_enabled else "Off by default: enable it with `--extend-select " \
        f"{info.code}` or `extend-select = [\"{info.code}\"]`."


def _option_lines(info: RuleInfo) -> list[str]:
    if not info.options:
        return []
    lines = ["## Options", "", f"Set in `[tool.gpulint.options.{info.code}]`:", "", "| option | default |",
             "| --- | --- |"]
    for key, value in info.options.items():
        lines.append(f"| `{key.replace('_', '-')}` | `{_toml(value)}` |")
    return lines + [""]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def _example_lines(info: RuleInfo) -> list[str]:
    if not info.examples:
        return []
    lines = ["## Tested examples", "", "These come from the rule's own test cases.", ""]
    invalid = [e for e in info.examples if isinstance(e, Invalid)]
    valid = [e for e in info.examples if isinstance(e, Valid)]
    for index, example in enumerate(invalid, start=1):
        lines += [f"### Flagged ({index})", "", "```python", example.code.rstrip("\n"), "```", ""]
        if example.fixed is not None:
            lines += ["Fixed (with `--unsafe-fixes` if the fix is unsafe):", "", "```python",
                      example.fixed.rstrip("\n"), "```", ""]
    for index, example in enumerate(valid, start=1):
        lines += [f"### Not flagged ({index})", "", "```python", example.code.rstrip("\n"), "```", ""]
    return lines


def rule_markdown(info: RuleInfo) -> str:
    """The page docs/rules/<CODE>.md and the text of `gpulint rule CODE`."""
    facts = [f"**Code** `{info.code}` · **Family** `{info.family}` · **Severity** {info.severity.value}"]
    if info.priority:
        facts[0] += f" · **Priority** {info.priority}"
    lines = [f"# {info.name} ({info.code})", "", facts[0], "", _fix_line(info), "", _enabled_line(info), "",
             f"Message: {info.message}", "", info.docs.strip(), ""]
    lines += _option_lines(info)
    lines += _example_lines(info)
    lines += ["## Suppressing", "",
              f"Add `# noqa: {info.code}` to the line, `# gpulint: ignore[{info.code}]` on the line above, or "
              f"`ignore = [\"{info.code}\"]` / `per-file-ignores` in `[tool.gpulint]`."
              if info.selectable else "This diagnostic cannot be suppressed.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def rule_page(info: RuleInfo) -> str:
    return GENERATED_NOTE + "\n\n" + rule_markdown(info) + _measured_lines(info.code)


def _measured_lines(code: str) -> str:
    """The rule's row of the GPU table written by benchmarks/gpu_microchecks.py, when the checkout has one."""
    try:
        lines = GPU_RESULTS.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    row = next((line for line in lines if line.startswith(f"| {code} |")), None)
    header = next((i for i, line in enumerate(lines) if line.startswith("| rule |")), None)
    if row is None or header is None:
        return ""
    caption = next((line for line in lines if line.startswith("Measured on")), "")
    return "\n".join(["", "## Measured on a GPU", "", caption, "", *lines[header:header + 2], row, ""])


def rule_json(info: RuleInfo) -> dict[str, Any]:
    """Shaped like `ruff rule --output-format json`, plus gpulint's own fields."""
    return {
        "name": info.name,
        "code": info.code,
        "linter": "gpulint",
        "summary": info.summary,
        "message_formats": [info.message],
        "fix": {"None": "Fix is not available.", "Always": "Fix is always available.",
                "Sometimes": "Fix is sometimes available."}[info.fix_availability],
        "fix_availability": info.fix_availability,
        "explanation": info.docs,
        "preview": False,
        "family": info.family,
        "severity": info.severity.value,
        "priority": info.priority,
        "fix_safety": info.safety.value,
        "fix_title": info.fix_title,
        "default_enabled": info.default_enabled,
        "meta": info.meta,
        "options": {k.replace("_", "-"): v for k, v in info.options.items()},
        "examples": [{"kind": "invalid" if isinstance(e, Invalid) else "valid", "code": e.code,
                      "fixed": getattr(e, "fixed", None)} for e in info.examples],
    }


def index_page(infos: Sequence[RuleInfo]) -> str:
    lines = [GENERATED_NOTE, "", "# gpulint rules", "",
             "`[*]` safe fix · `[!]` unsafe fix (`--unsafe-fixes`) · blank: no automatic fix.", "",
             "| code | name | severity | fix | default | summary |", "| --- | --- | --- | --- | --- | --- |"]
    for info in infos:
        mark = "[*]" if info.safety is Safety.SAFE else "[!]" if info.safety is Safety.UNSAFE else ""
        default = "always" if info.meta and not info.selectable else "on" if info.default_enabled else "off"
        summary = info.summary.replace("|", "\\|")
        lines.append(f"| [{info.code}]({info.code}.md) | `{info.name}` | {info.severity.value} | {mark} | "
                     f"{default} | {summary} |")
    return "\n".join(lines) + "\n"


def expected_pages(include_meta: bool = True) -> dict[str, str]:
    infos = all_infos(include_meta)
    pages = {f"{info.code}.md": rule_page(info) for info in infos}
    pages["README.md"] = index_page(infos)
    return pages


def stale_pages(directory: Path = DOCS_DIR) -> list[str]:
    """Names of pages that are missing, out of date, or left over from a removed rule."""
    expected = expected_pages()
    problems = []
    for name, text in expected.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            problems.append(name)
    if directory.is_dir():
        problems += sorted(p.name for p in directory.glob("*.md") if p.name not in expected)
    return problems


def write_pages(directory: Path = DOCS_DIR) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    expected = expected_pages()
    written = []
    for name, text in expected.items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8", newline="\n")
            written.append(name)
    for path in directory.glob("*.md"):
        if path.name not in expected:
            path.unlink()
            written.append(path.name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulint.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is missing or stale")
    parser.add_argument("--dir", type=Path, default=DOCS_DIR)
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.dir)
        for name in stale:
            print(f"stale: {args.dir / name}")
        return 1 if stale else 0
    for name in write_pages(args.dir):
        print(f"wrote {args.dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
