"""`gpulint check | fix | rule | rules`. Exit codes as ruff: 0 clean, 1 findings remain, 2 usage/config/internal."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from rich.console import Console
from rich.table import Table

from gpulint import __version__
from gpulint.diagnostics import Safety
from gpulint.registry import SelectorError, all_rules, rule_by_code, select_rules
from gpulint.reporters import TextReporter, render_github, render_json
from gpulint.reporters.text import unified_diff
from gpulint.runner import RunResult, run

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other usage error
        self.exit(EXIT_ERROR, f"gpulint: error: {message}\n")


def _codes(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpulint", description="Find and fix GPU performance anti-patterns in PyTorch training code.")
    parser.add_argument("--version", action="version", version=f"gpulint {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def lint_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("paths", nargs="*", default=["."], help="files or directories (default: .)")
        p.add_argument("--select", type=_codes, help="rule codes, prefixes or names to enable (replaces defaults)")
        p.add_argument("--extend-select", type=_codes, default=[], help="add rules to the selection")
        p.add_argument("--ignore", type=_codes, default=[], help="rule codes, prefixes or names to disable")
        p.add_argument("--output-format", choices=("full", "concise", "json", "github"), default="full")
        p.add_argument("--exit-zero", action="store_true", help="exit 0 even when findings remain")
        p.add_argument("--statistics", action="store_true", help="print counts per rule instead of findings")
        p.add_argument("--no-respect-gitignore", dest="respect_gitignore", action="store_false")
        p.add_argument("-q", "--quiet", action="store_true", help="print findings only, no summary")

    check = sub.add_parser("check", help="report findings")
    lint_options(check)
    fix = sub.add_parser("fix", help="show the diff of fixes (write them with --apply)")
    lint_options(fix)
    fix.add_argument("--apply", action="store_true", help="write the fixes to the files")
    fix.add_argument("--unsafe-fixes", action="store_true", help="also apply fixes that may change behaviour")
    rule = sub.add_parser("rule", help="explain one rule")
    rule.add_argument("code")
    rule.add_argument("--output-format", choices=("text", "json"), default="text")
    rules = sub.add_parser("rules", help="list all rules")
    rules.add_argument("--output-format", choices=("text", "json"), default="text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(soft_wrap=True)
    try:
        if args.command == "rules":
            return _rules(args, console)
        if args.command == "rule":
            return _rule(args, console)
        return _lint(args, console)
    except SelectorError as error:
        print(f"gpulint: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("gpulint: interrupted", file=sys.stderr)
        return EXIT_ERROR


def _lint(args: argparse.Namespace, console: Console) -> int:
    rules = select_rules(args.select, args.ignore, args.extend_select)
    fixing = args.command == "fix"
    unsafe = fixing and args.unsafe_fixes
    result = run(args.paths, rules, fix=fixing, write=fixing and args.apply,
                 min_safety=Safety.UNSAFE if unsafe else Safety.SAFE, respect_gitignore=args.respect_gitignore)
    for error in result.errors:
        print(f"gpulint: error: {error}", file=sys.stderr)
    for report in result.files:
        if report.error:
            print(f"gpulint: {report.path}: {report.error}", file=sys.stderr)
    diagnostics = result.diagnostics
    would_change = False
    if fixing:
        would_change = _report_fixes(args, result, console)
    if args.output_format == "json":
        sys.stdout.write(render_json(diagnostics))
    elif args.output_format == "github":
        sys.stdout.write(render_github(diagnostics))
    else:
        reporter = TextReporter(console, concise=args.output_format == "concise")
        if args.statistics:
            reporter.statistics(diagnostics)
        else:
            sources = {r.path: r.fix.text if r.fix else r.original for r in result.files}
            for diagnostic in diagnostics:
                reporter.diagnostic(diagnostic, sources.get(diagnostic.path))
        if not args.quiet:
            fixed = sum(len(r.fix.fixed) for r in result.files if r.fix and r.written)
            reporter.summary(diagnostics, fixing=fixing, unsafe_enabled=unsafe, fixed=fixed)
    if result.errors:
        return EXIT_ERROR
    if args.exit_zero:
        return EXIT_CLEAN
    if fixing and not args.apply and would_change:
        return EXIT_FINDINGS
    return EXIT_FINDINGS if diagnostics else EXIT_CLEAN


def _report_fixes(args: argparse.Namespace, result: RunResult, console: Console) -> bool:
    """Print the diff (dry run) or what was written; True when some file would change."""
    would_change = False
    machine = args.output_format in ("json", "github")
    for report in result.files:
        outcome = report.fix
        if outcome is None or not outcome.changed or report.original is None:
            continue
        would_change = True
        if args.apply:
            if report.written and not machine and not args.quiet:
                console.print(f"Fixed {len(outcome.fixed)} in {report.path}", highlight=False, markup=False)
        elif not machine:
            sys.stdout.write(unified_diff(report.path, report.original, outcome.text))
    sys.stdout.flush()
    return would_change


def _rules(args: argparse.Namespace, console: Console) -> int:
    rules = all_rules()
    if args.output_format == "json":
        print(json.dumps([_rule_json(r) for r in rules], indent=2))
        return EXIT_CLEAN
    table = Table(title="gpulint rules")
    for column in ("code", "name", "family", "severity", "fix", "default"):
        table.add_column(column)
    for r in rules:
        table.add_row(r.code, r.name, r.family(), r.severity.value, r.safety.value, "on" if r.default_enabled else "off")
    console.print(table)
    return EXIT_CLEAN


def _rule_json(r) -> dict:
    return {"code": r.code, "name": r.name, "family": r.family(), "priority": r.priority,
            "severity": r.severity.value, "fix": r.safety.value, "fix_title": r.fix_title,
            "default_enabled": r.default_enabled, "message": r.message, "explanation": r.docs()}


def _rule(args: argparse.Namespace, console: Console) -> int:
    r = rule_by_code(args.code)
    if args.output_format == "json":
        print(json.dumps(_rule_json(r), indent=2))
        return EXIT_CLEAN
    print(f"# {r.code} {r.name}\n")
    print(f"Severity: {r.severity.value}. Fix: {r.safety.value}. "
          f"{'On' if r.default_enabled else 'Off'} by default. Priority {r.priority}.\n")
    print(r.docs())
    return EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())
