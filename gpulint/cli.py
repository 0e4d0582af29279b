"""`gpulint check | fix | rule | rules`. Exit codes as ruff: 0 clean, 1 findings remain, 2 usage/config/internal.

`check` reports; `check --fix` = `fix --apply`; `check --diff` = `fix`. `fix` prints the diff of the fixes
and writes nothing; `fix --apply` writes them and exits 1 when findings remain.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence, TextIO

from gpulint import __version__

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

# Start-up: only what a replayed `check` needs is imported here (gpulint.cache_runs); argparse when a command line
# is parsed; the config, the reporters and the rest of the standard library by `_load()` when a command runs
# (`gpulint --version` and `--help` import none of them); libcst and the rules where a file is linted or a rule's
# class is needed (a `check` whose files are all results-cache hits imports neither: settings are resolved from
# the rules' recorded metadata, `registry.rule_infos`).
OUTPUT_FORMATS = ("full", "concise", "json", "json-lines", "github", "sarif")
MACHINE_FORMATS = ("json", "json-lines", "github", "sarif")


def _load() -> None:
    """Import what the commands need, once, into this module's namespace."""
    if "run" in globals():
        return
    import argparse
    import dataclasses
    import difflib
    import importlib.util
    import json
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from gpulint.cache import CACHE_DIR_NAME
    from gpulint.cache_runs import findable
    from gpulint.config import Layer, Resolver, Settings
    from gpulint.diagnostics import Diagnostic, Edit, Position, Safety
    from gpulint.discovery import discover_resolved, link_problem
    from gpulint.docs import all_infos, find_info, rule_json, rule_markdown
    from gpulint.reporters import (
        Writer, render_concise, render_diff, render_fixed, render_full, render_github, render_json,
        render_json_lines, render_sarif, render_statistics, render_summary, use_color,
    )
    from gpulint.reporters.baseline import Baseline, write_baseline
    from gpulint.reporters.text import render_remaining_hint
    from gpulint.runner import RunResult, call_isolated, display_path, run, write_fixed
    from gpulint.source import SourceError, read_source, write_source_atomically
    from gpulint.suppressions import IGNORE_NOQA_ENV, UNUSED_CODE, add_noqa

    globals().update({name: value for name, value in locals().items() if not name.startswith("_")})

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
PROGRESS_MIN_FILES = 20  # a progress bar only for runs at least this long, and only on a terminal


class UsageError(Exception):
    """A one-line problem with the command line or the environment (exit code 2)."""


def _codes(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _pattern_codes(value: str) -> tuple[str, list[str]]:
    pattern, sep, codes = value.rpartition(":")
    if not sep or not pattern or not _codes(codes):
        import argparse

        raise argparse.ArgumentTypeError(f"expected PATTERN:CODES (e.g. 'tests/*:GPU01'), got {value!r}")
    return pattern, _codes(codes)


def build_parser() -> argparse.ArgumentParser:
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # one line, exit 2, like every other usage error
            self.exit(EXIT_ERROR, f"gpulint: error: {message}\n")

    parser = _Parser(prog="gpulint", description="Find and fix GPU performance anti-patterns in PyTorch training code.")
    parser.add_argument("--version", action="version", version=f"gpulint {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def lint_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("paths", nargs="*", default=None, help="files or directories (default: .); - reads stdin")
        sel = p.add_argument_group("rule selection")
        sel.add_argument("--select", action="extend", type=_codes, metavar="CODES",
                         help="rule codes, prefixes (GPU01), names or ALL to enable (replaces the config's)")
        sel.add_argument("--extend-select", action="extend", type=_codes, default=[], metavar="CODES",
                         help="enable these rules too (keeps the config's selection)")
        sel.add_argument("--ignore", action="extend", type=_codes, default=[], metavar="CODES",
                         help="disable these rules")
        sel.add_argument("--per-file-ignores", action="append", type=_pattern_codes, metavar="PATTERN:CODES",
                         help="replaces the config's per-file-ignores")
        sel.add_argument("--extend-per-file-ignores", action="append", type=_pattern_codes, default=[],
                         metavar="PATTERN:CODES", help="add to the config's per-file-ignores")
        sel.add_argument("--fixable", action="extend", type=_codes, metavar="CODES",
                         help="only these rules' fixes are applied (default: all)")
        sel.add_argument("--unfixable", action="extend", type=_codes, default=[], metavar="CODES",
                         help="never apply these rules' fixes (the findings stay)")
        sel.add_argument("--extend-fixable", action="extend", type=_codes, default=[], metavar="CODES",
                         help="add to --fixable")
        sel.add_argument("--extend-safe-fixes", action="extend", type=_codes, default=[], metavar="CODES",
                         help="treat these rules' unsafe fixes as safe")
        sel.add_argument("--extend-unsafe-fixes", action="extend", type=_codes, default=[], metavar="CODES",
                         help="treat these rules' safe fixes as unsafe")
        sel.add_argument("--unsafe-fixes", action=argparse.BooleanOptionalAction, default=None,
                         help="also apply fixes that may change behaviour")
        files = p.add_argument_group("files")
        files.add_argument("--exclude", action="extend", type=_codes, metavar="GLOBS",
                           help="replaces the default excludes")
        files.add_argument("--extend-exclude", action="extend", type=_codes, default=[], metavar="GLOBS",
                           help="exclude these too (keeps the defaults)")
        files.add_argument("--respect-gitignore", action=argparse.BooleanOptionalAction, default=None,
                           help="skip files that .gitignore ignores (default: on)")
        files.add_argument("--force-exclude", action=argparse.BooleanOptionalAction, default=None,
                           help="apply excludes to files named on the command line too (pre-commit)")
        files.add_argument("--stdin-filename", metavar="PATH", help="the path of the code read from stdin")
        files.add_argument("--show-files", action="store_true", help="list the files that would be linted")
        cfg = p.add_argument_group("configuration")
        cfg.add_argument("--config", metavar="PATH|KEY=VALUE",
                         help="a config file for all paths, or an inline TOML override like \"select = ['GPU0']\"")
        cfg.add_argument("--isolated", action="store_true", help="ignore every config file")
        cfg.add_argument("--show-settings", action="store_true", help="print the resolved settings and exit")
        out = p.add_argument_group("output")
        out.add_argument("--output-format", choices=OUTPUT_FORMATS, default=None,
                         help="default: full (env GPULINT_OUTPUT_FORMAT)")
        out.add_argument("-o", "--output-file", metavar="FILE", help="write the report to FILE (env GPULINT_OUTPUT_FILE)")
        out.add_argument("--statistics", action="store_true", help="counts per rule instead of findings")
        out.add_argument("--show-fixes", action=argparse.BooleanOptionalAction, default=None,
                         help="list what was fixed, per file")
        out.add_argument("-e", "--exit-zero", action="store_true", help="exit 0 even when findings remain")
        out.add_argument("--exit-non-zero-on-fix", action="store_true", help="exit 1 when anything was fixed")
        out.add_argument("-q", "--quiet", action="store_true", help="findings only, no summary")
        out.add_argument("-s", "--silent", action="store_true", help="print nothing (the exit code tells)")
        out.add_argument("-v", "--verbose", action="store_true", help="say which config files apply, and timings")
        out.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                         help="colour in full/concise output (default: auto, a terminal without NO_COLOR)")
        sup = p.add_argument_group("suppressions and baselines")
        sup.add_argument("--add-noqa", nargs="?", const="", default=None, metavar="REASON",
                         help="add `# noqa: CODES` to every line with a finding, then exit")
        sup.add_argument("--ignore-noqa", action="store_true", help="ignore every suppression comment")
        sup.add_argument("--baseline", metavar="FILE", help="report only findings not recorded in FILE")
        sup.add_argument("--write-baseline", metavar="FILE", help="record the current findings in FILE and exit 0")
        p.add_argument("--fix-only", action="store_true", help="apply fixes; do not report what remains")
        perf = p.add_argument_group("speed")
        perf.add_argument("-n", "--no-cache", action="store_true", help="do not read or write the results cache "
                          "(env GPULINT_NO_CACHE)")
        perf.add_argument("--cache-dir", metavar="DIR", help="default: .gpulint_cache beside the config file "
                          "(env GPULINT_CACHE_DIR)")
        perf.add_argument("-j", "--jobs", type=int, metavar="N", help="worker processes (default: automatic)")

    check = sub.add_parser("check", help="report findings")
    lint_options(check)
    check.add_argument("--fix", action="store_true", help="alias of `gpulint fix --apply`")
    check.add_argument("--diff", action="store_true", help="alias of `gpulint fix` (print the diff, write nothing)")
    fix = sub.add_parser("fix", help="show the diff of fixes (write them with --apply)")
    lint_options(fix)
    fix.add_argument("--apply", action="store_true", help="write the fixes to the files")
    fix.add_argument("--diff", action="store_true", help="print the diff, write nothing (the default)")
    for p in (check, fix):
        p.add_argument("--no-verify", action="store_true",
                       help="apply fixes without first running their rules' micro-checks on the installed torch")
    verify = sub.add_parser("verify", help="run the rules' micro-checks on real tensors (needs torch)",
                            add_help=False)  # parsed by gpulint.verify (main() hands it the arguments)
    verify.add_argument("rest", nargs=argparse.REMAINDER)
    rule = sub.add_parser("rule", help="explain a rule")
    rule.add_argument("code", nargs="?", help="a rule code or name")
    rule.add_argument("--all", action="store_true", help="every rule")
    rule.add_argument("--output-format", choices=("text", "json"), default="text")
    rules = sub.add_parser("rules", help="list all rules")
    rules.add_argument("--output-format", choices=("text", "json"), default="text")
    clean = sub.add_parser("clean", help="delete the results cache")
    clean.add_argument("--cache-dir", metavar="DIR")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["check"] or _no_cache(argv):
        return _main(argv)  # `--no-cache` neither replays nor records: no tracing of every stat and open
    # A `check` whose inputs are those of a recorded all-cached run is answered from the recording, before
    # anything heavy is imported; any other `check` is traced, and recorded if it qualifies (gpulint.cache_runs).
    from gpulint import cache_runs

    replayed = cache_runs.replay(argv)
    if replayed is not None:
        return replayed
    global _RECORD_TO
    _RECORD_TO = None
    recorder = cache_runs.Recorder(argv).start()
    code = EXIT_ERROR
    try:
        code = _main(argv)
    finally:
        if _RECORD_TO is not None and code in (EXIT_CLEAN, EXIT_FINDINGS):
            recorder.save(_RECORD_TO, code)
        else:
            recorder.stop()
    return code


def _no_cache(argv: Sequence[str]) -> bool:
    """Does this command line say `--no-cache` (or `-n`, or GPULINT_NO_CACHE)? A spelling missed here (an
    abbreviation, `-qn`) only costs the recorder's tracing: the run itself still reads no cache."""
    if os.environ.get("GPULINT_NO_CACHE", "") not in ("", "0"):
        return True
    options = argv[:argv.index("--")] if "--" in argv else argv
    return "--no-cache" in options or "-n" in options


def _users_error(error: Exception) -> bool:
    """A mistake in the command, the config or a baseline (not a gpulint bug). Its class comes from the module
    that raised it: `gpulint verify GPU999` fails before `_load()` has imported the names above."""
    for module, name in (("gpulint.registry", "SelectorError"), ("gpulint.config", "ConfigError"),
                         ("gpulint.reporters.baseline", "BaselineError")):
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(error, getattr(loaded, name)):
            return True
    return False


_RECORD_TO: str | None = None  # set by a `check` that may be replayed: the cache folder its recording goes to


def _main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["verify"]:  # its own parser: `verify --device cpu`, `verify -h`, `verify GPU011 --format json`
            from gpulint.verify import main as verify_main

            return verify_main(argv[1:])
        try:
            args = build_parser().parse_args(argv)
            args.raw_argv = argv
        except SystemExit as exit_:  # argparse: --help, --version, usage errors
            return int(exit_.code or 0)
        _load()
        if args.command == "rules":
            return _rules(args)
        if args.command == "rule":
            return _rule(args)
        if args.command == "clean":
            return _clean(args)
        if args.command == "verify":  # `gpulint --color never verify ...`: options before the command
            from gpulint.verify import main as verify_main

            return verify_main(args.rest)
        return _lint(args)
    except UsageError as error:
        print(f"gpulint: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("gpulint: interrupted", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # `gpulint check | head`
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep the interpreter from complaining at exit
        except OSError:
            pass
        return EXIT_ERROR
    except Exception as error:  # noqa: BLE001 - a gpulint bug: one line and exit 2, never a traceback with exit 1
        if _users_error(error):
            print(f"gpulint: error: {error}", file=sys.stderr)
            return EXIT_ERROR
        if os.environ.get("GPULINT_DEBUG"):
            raise
        print(f"gpulint: error: internal error: {type(error).__name__}: {' '.join(str(error).split())[:500]} "
              f"(set GPULINT_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_ERROR


# -- settings -------------------------------------------------------------------------------------------------

def _cli_layer(args: argparse.Namespace) -> Layer:
    layer = Layer("command line", Path.cwd())
    layer.select = args.select
    layer.ignore = list(args.ignore)
    layer.extend_select = list(args.extend_select)
    layer.fixable = args.fixable
    layer.unfixable = list(args.unfixable)
    layer.extend_fixable = list(args.extend_fixable)
    layer.extend_safe_fixes = list(args.extend_safe_fixes)
    layer.extend_unsafe_fixes = list(args.extend_unsafe_fixes)
    if args.per_file_ignores is not None:
        layer.per_file_ignores = {}
        for pattern, codes in args.per_file_ignores:
            layer.per_file_ignores.setdefault(pattern, []).extend(codes)
    for pattern, codes in args.extend_per_file_ignores:
        layer.extend_per_file_ignores.setdefault(pattern, []).extend(codes)
    layer.exclude = args.exclude
    layer.extend_exclude = list(args.extend_exclude)
    layer.respect_gitignore = args.respect_gitignore
    layer.force_exclude = args.force_exclude
    layer.unsafe_fixes = args.unsafe_fixes
    layer.show_fixes = args.show_fixes
    layer.output_format = args.output_format
    return layer


class _Mode(NamedTuple):
    fix: bool  # run the fixer
    write: bool  # write the files
    fix_only: bool

    @property
    def dry_run(self) -> bool:
        return self.fix and not self.write


def _mode(args: argparse.Namespace) -> _Mode:
    if args.command == "fix":
        write = bool(args.apply) and not args.diff
        return _Mode(True, write, args.fix_only and write)
    if args.diff:
        return _Mode(True, False, False)
    if args.fix or args.fix_only:
        return _Mode(True, True, args.fix_only)
    return _Mode(False, False, False)


class _Files(NamedTuple):
    paths: list[str]  # what to give the runner: files, and missing paths (reported as GPU901)
    settings: dict[str, Settings]  # display path -> settings


def _collect(raw_paths: Sequence[str], resolver: Resolver) -> _Files:
    chosen: dict[str, Path] = {}
    known: dict[str, Settings] = {}  # resolved path -> settings, for the files found by walking a folder
    missing: list[str] = []
    for raw in raw_paths:
        path = Path(raw)
        if (not path.exists() and not path.is_symlink()) or link_problem(path) is not None:
            missing.append(raw)  # the runner's discovery names the problem (missing, symlink loop, ...)
            continue
        if not path.is_dir():
            settings = resolver.settings_for(path)
            if settings.force_exclude and settings.is_excluded(path):
                continue
            if path.suffix.lower() == ".ipynb":  # JSON parses as Python: checking it would silently find nothing
                print(f"gpulint: warning: {raw}: Jupyter notebooks are not checked; skipped", file=sys.stderr)
                continue
            chosen.setdefault(str(path.resolve()), path)
            continue
        root_settings = resolver.settings_for(path)
        files, problems = discover_resolved([raw], excludes=root_settings.walk_excludes(),
                                            respect_gitignore=root_settings.respect_gitignore)
        missing.extend(p.path for p in problems)
        for found, real in files:  # (each file is resolved once, by the discovery)
            file_settings = resolver.settings_for_file(real)
            if file_settings.is_excluded(found, below=path, real=real):
                continue
            if str(real) not in chosen:
                chosen[str(real)] = found
                known[str(real)] = file_settings
    ordered = sorted(chosen.items(), key=lambda item: item[1].as_posix())
    settings = {display_path(p): known.get(real) or resolver.settings_for(p) for real, p in ordered}
    return _Files([str(p) for _, p in ordered] + missing, settings)


class _Policy:
    """Per-file decisions from settings: which findings count, which fixes apply."""

    def __init__(self, settings: dict[str, Settings], default: Settings) -> None:
        self.settings = settings
        self.default = default
        self.demoted: dict[str, str] = {}  # rule code -> why its fixes failed verification
        self.refused_sites: set[tuple] = set()  # fixes whose rewrite disagreed with the original on real tensors

    def of(self, path: str) -> Settings:
        return self.settings.get(path, self.default)

    def keep(self, d: Diagnostic) -> bool:
        return d.code != UNUSED_CODE or self.of(d.path).code_enabled(d.code, Path(d.path))

    def can_fix(self, d: Diagnostic) -> bool:
        if d.fix is None or not self.keep(d) or d.code in self.demoted or _site_key(d) in self.refused_sites:
            return False
        settings = self.of(d.path)
        if not settings.is_fixable(d.code):
            return False
        safety = settings.fix_safety(d.code, d.fix.safety)
        return safety is Safety.SAFE or (safety is Safety.UNSAFE and settings.unsafe_fixes)

    def adjusted(self, d: Diagnostic) -> Diagnostic:
        """The finding with its fix's safety as the settings see it (extend-safe-fixes / extend-unsafe-fixes)."""
        if d.fix is None:
            return d
        safety = self.of(d.path).fix_safety(d.code, d.fix.safety)
        return d if safety is d.fix.safety else dataclasses.replace(d, fix=dataclasses.replace(d.fix, safety=safety))

    def hidden_unsafe(self, d: Diagnostic) -> bool:
        settings = self.of(d.path)
        return (d.fix is not None and settings.fix_safety(d.code, d.fix.safety) is Safety.UNSAFE
                and not settings.unsafe_fixes and settings.is_fixable(d.code))


# -- check / fix ----------------------------------------------------------------------------------------------

def _lint(args: argparse.Namespace) -> int:
    mode = _mode(args)
    if not args.paths:
        args.paths = ["-"] if args.stdin_filename else ["."]
    if args.ignore_noqa:
        os.environ[IGNORE_NOQA_ENV] = "1"
    resolver = Resolver(_cli_layer(args), config=args.config, isolated=args.isolated)
    cwd_settings = resolver.settings_for(Path.cwd())
    fmt = args.output_format or os.environ.get("GPULINT_OUTPUT_FORMAT") or cwd_settings.output_format
    if fmt not in OUTPUT_FORMATS:
        raise UsageError(f"unknown output format {fmt!r} (GPULINT_OUTPUT_FORMAT); one of {', '.join(OUTPUT_FORMATS)}")
    if args.write_baseline and mode.fix:
        raise UsageError("--write-baseline records findings; it cannot be combined with fixing")
    output_file = args.output_file or os.environ.get("GPULINT_OUTPUT_FILE")
    if args.show_settings:
        target = Path(args.paths[0]) if args.paths and args.paths[0] != "-" else Path.cwd()
        print(json.dumps(resolver.settings_for(target).describe(), indent=2, default=str))
        return EXIT_CLEAN
    if args.paths == ["-"]:
        return _lint_stdin(args, resolver, mode, fmt)
    if "-" in args.paths:
        raise UsageError("`-` (stdin) cannot be combined with other paths")
    started = time.perf_counter()
    files = _collect(args.paths, resolver)
    if not files.settings and not args.silent:
        print("gpulint: warning: no Python files found under the given path(s)", file=sys.stderr)
    if args.verbose:
        by_config: dict[str, int] = {}
        for settings in files.settings.values():
            by_config[settings.source or "built-in defaults"] = by_config.get(settings.source or
                                                                              "built-in defaults", 0) + 1
        for source, count in sorted(by_config.items()):
            print(f"gpulint: {count} file{'s' if count != 1 else ''} with settings from {source}", file=sys.stderr)
    if args.show_files:
        for path in files.settings:
            print(path)
        return EXIT_CLEAN
    policy = _Policy(files.settings, cwd_settings)
    # the rules' metadata: the runner needs their codes (a worker imports the classes when it lints)
    rules = sorted({r for s in [*files.settings.values(), cwd_settings] for r in s.infos}, key=lambda r: r.code)
    human = fmt not in MACHINE_FORMATS and not args.statistics

    def file_rules(path: Path):
        settings = policy.of(display_path(path))
        return settings.infos_for(path)

    def file_options(path: Path):
        return policy.of(display_path(path)).options

    verified = (_verify_before_writing(files.paths, rules, policy, file_rules, file_options, args)
                if mode.write and not args.no_verify else None)
    cache_dir = _cache_dir(args, cwd_settings)
    replayable = False
    if verified is not None and not policy.demoted and not policy.refused_sites:
        result = write_fixed(verified)  # verification changed nothing: write what the checked run produced
    else:
        with _progress(len(files.settings), enabled=human and not args.quiet and not args.silent
                       and args.add_noqa is None) as advance:
            result = run(files.paths, rules, fix=mode.fix, write=mode.write, min_safety=Safety.UNSAFE,
                         respect_gitignore=False, can_fix=policy.can_fix, file_filter=file_rules,
                         options_for=file_options, progress=advance, cache_dir=cache_dir, jobs=args.jobs,
                         isolate=True)
            replayable = advance is None  # a progress bar's output is not the run's
    global _RECORD_TO
    if (replayable and cache_dir is not None and not mode.fix and args.add_noqa is None and not args.write_baseline
            and not output_file and not args.verbose and not result.errors
            and findable(args.raw_argv, str(cache_dir))):
        _RECORD_TO = str(cache_dir)
    for report in result.files:  # a cached finding carries the path it was shown with when it was stored
        report.diagnostics = [d if d.path == report.path else dataclasses.replace(d, path=report.path)
                              for d in report.diagnostics]
    if args.verbose:
        count = len(files.settings)
        print(f"gpulint: {count} file{'s' if count != 1 else ''} in {time.perf_counter() - started:.2f}s",
              file=sys.stderr)
    for error in result.errors:
        print(f"gpulint: error: {error}", file=sys.stderr)
    for report in result.files:
        if report.error:
            print(f"gpulint: {report.path}: {report.error}", file=sys.stderr)
    if args.add_noqa is not None:
        return _add_noqa(result, policy, args.add_noqa, args)
    stream: TextIO = sys.stdout
    handle = None
    if output_file:
        try:
            handle = open(output_file, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
        except OSError as error:
            raise UsageError(f"cannot write {output_file}: {error.strerror or error}") from None
        stream = handle
    try:
        return _report(args, mode, fmt, result, policy, rules, stream)
    finally:
        if handle is not None:
            handle.close()


def _verify_before_writing(paths: list[str], rules: Sequence, policy: "_Policy", file_rules: Callable,
                           file_options: Callable, args: argparse.Namespace) -> RunResult:
    """Before writing, check what is about to be written, in a separate process so that gpulint itself never
    imports torch: each rewritten site that can safely run on synthetic tensors is run, original against
    rewrite; every rule with fixes has its micro-check run (cached per torch version). A site that differs is
    not fixed; a rule whose check fails has its fixes demoted to suggestions. Returns the unwritten fix run."""
    dry = run(paths, rules, fix=True, write=False, min_safety=Safety.UNSAFE, respect_gitignore=False,
              can_fix=policy.can_fix, file_filter=file_rules, options_for=file_options, jobs=args.jobs, isolate=True)
    from gpulint.registry import rule_by_code

    checked = {rule.code for rule in rules if rule_by_code(rule.code).micro_check is not None}  # GPU902 has none
    codes = sorted({d.code for report in dry.files if report.fix for d in report.fix.fixed} & checked)
    if not codes:
        return dry
    if importlib.util.find_spec("torch") is None:
        print("gpulint: torch is not installed, so the fixes were not verified at run time (the CPU build is "
              "enough: pip install torch --index-url https://download.pytorch.org/whl/cpu; in a pre-commit hook see "
              "the README; --no-verify silences this)", file=sys.stderr)
        return dry
    files, sites, fixed = _rewritten_sites(dry, checked)
    with tempfile.TemporaryDirectory(prefix="gpulint-verify-") as scratch:
        request = Path(scratch) / "sites.json"
        request.write_text(json.dumps({"files": files, "sites": sites}), encoding="utf-8")
        completed = subprocess.run([sys.executable, "-m", "gpulint", "verify", *codes, "--cached",
                                    "--sites", str(request)], capture_output=True, text=True)
    try:
        answer = json.loads(completed.stdout)
        results, site_results = answer["rules"], answer["sites"]
    except (ValueError, KeyError, TypeError):
        print(f"gpulint: the micro-checks could not run ({completed.stderr.strip()[-200:]}); "
              f"fixes of {', '.join(codes)} demoted to suggestions", file=sys.stderr)
        policy.demoted = {code: "micro-check could not run" for code in codes}
        return dry
    policy.demoted = {r["code"]: r["error"] or "; ".join(r.get("notes") or ()) or "original and rewritten code disagree"
                      for r in results if not r["ok"]}
    for code, reason in sorted(policy.demoted.items()):
        print(f"gpulint: {code} fixes demoted to suggestions: its micro-check failed on the installed torch "
              f"({reason})", file=sys.stderr)
    for diagnostic, result in zip(fixed, site_results):
        if result["status"] == "differs":
            policy.refused_sites.add(_site_key(diagnostic))
            print(f"gpulint: {diagnostic.path}:{diagnostic.line}:{diagnostic.col}: {diagnostic.code} fix not "
                  f"applied: run on synthetic tensors, the rewrite disagrees with the original ({result['reason']})",
                  file=sys.stderr)
    if args.verbose:
        equal = sum(r["status"] == "equal" for r in site_results)
        print(f"gpulint: {equal} of {len(site_results)} rewritten sites verified on their own code; the others "
              f"rely on their rule's micro-check", file=sys.stderr)
    return dry


def _site_key(diagnostic: Diagnostic) -> tuple:
    """Stable across fix passes: positions move as earlier fixes land, a fix's path, code and text do not."""
    assert diagnostic.fix is not None
    return diagnostic.path, diagnostic.code, tuple(edit.content for edit in diagnostic.fix.edits)


def _rewritten_sites(dry: "RunResult", checked: set[str]) -> tuple[dict[str, str], list[dict], list[Diagnostic]]:
    """Fixes that replace one span (plus any imports they add), as sites for `gpulint verify --sites`."""
    files: dict[str, str] = {}
    sites: list[dict] = []
    fixed: list[Diagnostic] = []
    for report in dry.files:
        if not report.fix or report.original is None:
            continue
        for diagnostic, replaced in zip(report.fix.fixed, report.fix.replaced):
            if diagnostic.code not in checked or diagnostic.fix is None:
                continue
            imports = [e.content for e in diagnostic.fix.edits if _is_import(e.content)]
            spans = [(e, text) for e, text in zip(diagnostic.fix.edits, replaced) if not _is_import(e.content)]
            if len(spans) != 1 or not spans[0][1].strip():
                continue
            edit, original = spans[0]
            files[report.path] = report.original
            sites.append({"code": diagnostic.code, "path": report.path, "column": edit.start.col,
                          "original": original, "rewritten": edit.content, "imports": imports})
            fixed.append(diagnostic)
    return files, sites, fixed


def _is_import(text: str) -> bool:
    stripped = text.strip()
    return stripped.startswith(("import ", "from ")) and " import " in f" {stripped}"


def _cache_dir(args: argparse.Namespace, settings: Settings) -> Path | None:
    if args.no_cache or os.environ.get("GPULINT_NO_CACHE", "") not in ("", "0") or args.ignore_noqa:
        return None
    chosen = args.cache_dir or os.environ.get("GPULINT_CACHE_DIR")
    if chosen:
        return Path(chosen)
    if settings.cache_dir is not None:
        return settings.cache_dir
    base = Path(settings.source).parent if settings.source else Path.cwd()
    return base / CACHE_DIR_NAME


def _clean(args: argparse.Namespace) -> int:
    directory = Path(args.cache_dir or os.environ.get("GPULINT_CACHE_DIR") or CACHE_DIR_NAME)
    if directory.is_dir():
        if not (directory / ".gitignore").is_file() and not any(directory.glob("results-*.json")):
            raise UsageError(f"{directory} does not look like a gpulint cache; not deleting it")
        shutil.rmtree(directory)
        print(f"Removed {directory}", file=sys.stderr)
    return EXIT_CLEAN


def _report(args: argparse.Namespace, mode: _Mode, fmt: str, result: RunResult, policy: _Policy,
            rules: Sequence, stream: TextIO) -> int:
    silent = args.silent
    writer = Writer(stream, color=fmt in ("full", "concise") and use_color(stream, args.color))
    # what the findings are measured against: the text on disk after this command
    sources: dict[str, str] = {}
    for report in result.files:
        if report.original is None:
            continue
        written_or_checked = report.fix.text if (report.fix and mode.write and report.written) else report.original
        sources[report.path] = written_or_checked
    diagnostics: list[Diagnostic] = []
    fixed: dict[str, list[Diagnostic]] = {}
    would_change = False
    for report in result.files:
        remaining = [d for d in report.diagnostics if policy.keep(d)]
        outcome = report.fix
        if mode.write and outcome is not None and outcome.changed and not report.written and \
                report.original is not None:
            # the fixes could not be written (read-only, changed meanwhile): what the file has is what counts
            remaining = [d for d in _relint(report.path, report.original, policy) if policy.keep(d)]
            sources[report.path] = report.original
            diagnostics.extend(remaining)
            continue
        if outcome is not None and outcome.changed and report.original is not None and \
                outcome.text != report.original:
            if mode.write and report.written:
                fixed[report.path] = list(outcome.fixed)
            elif mode.dry_run:
                would_change = True
                fixed[report.path] = list(outcome.fixed)
                remaining = _map_to_original(report.original, outcome.text, remaining)
        diagnostics.extend(remaining)
    diagnostics = sorted(map(policy.adjusted, diagnostics), key=Diagnostic.sort_key)
    if args.write_baseline:
        count = write_baseline(Path(args.write_baseline), diagnostics, sources)
        if not silent:
            print(f"Wrote {count} finding{'s' if count != 1 else ''} to the baseline {args.write_baseline}.",
                  file=sys.stderr)
        return EXIT_ERROR if result.errors else EXIT_CLEAN
    hidden_by_baseline = 0
    if args.baseline:
        diagnostics, hidden_by_baseline = Baseline.load(Path(args.baseline)).filter(diagnostics, sources)
    fixed_count = sum(len(v) for v in fixed.values())
    show_fixes = args.show_fixes if args.show_fixes is not None else policy.default.show_fixes
    human = fmt not in MACHINE_FORMATS
    if not silent:
        if mode.dry_run and human and not args.statistics:
            for report in result.files:
                outcome = report.fix
                if outcome and outcome.changed and report.original is not None and outcome.text != report.original:
                    render_diff(writer, report.path, report.original, outcome.text)
            # the diff stays a clean patch on stdout; the rest goes to stderr
            side = Writer(sys.stderr, color=use_color(sys.stderr, args.color)) if stream is sys.stdout else writer
            if fixed_count:
                render_fixed(side, fixed, dry_run=True, show=bool(show_fixes))
            if diagnostics and not args.quiet:
                side.line(f"{len(diagnostics)} finding{'s' if len(diagnostics) != 1 else ''} would remain"
                          + (":" if fmt == "concise" else " (shown in the file as it is now):"))
            _render_findings(side, fmt, diagnostics, policy, sources, rules, args, mode)
            if not args.quiet:
                render_remaining_hint(side, diagnostics, fixed_count, hidden_by_baseline,
                                      sum(map(policy.hidden_unsafe, diagnostics)))
        else:
            if mode.write and human and fixed_count and not args.quiet:
                render_fixed(writer, fixed, dry_run=False, show=bool(show_fixes))
            if not mode.fix_only:
                _render_findings(writer, fmt, diagnostics, policy, sources, rules, args, mode)
                if human and not args.quiet and not args.statistics:
                    render_summary(writer, diagnostics, policy.can_fix, fixed=fixed_count, fixing=mode.fix,
                                   baseline_hidden=hidden_by_baseline,
                                   unsafe_hidden=sum(map(policy.hidden_unsafe, diagnostics)))
    stream.flush()
    if result.errors:
        return EXIT_ERROR
    if args.exit_zero:
        return EXIT_CLEAN
    if args.exit_non_zero_on_fix and fixed_count and (mode.write or mode.dry_run):
        return EXIT_FINDINGS
    if mode.fix_only:
        return EXIT_CLEAN
    if mode.dry_run and would_change:
        return EXIT_FINDINGS
    return EXIT_FINDINGS if diagnostics else EXIT_CLEAN


def _relint(path: str, text: str, policy: _Policy) -> list[Diagnostic]:
    from gpulint.engine import RuleCrash, lint_text

    settings = policy.of(path)
    try:
        return lint_text(text, path, settings.rules_for(Path(path)), rule_options=settings.options).diagnostics
    except RuleCrash as crash:
        print(f"gpulint: error: {crash}", file=sys.stderr)
        return []


def _render_findings(writer: Writer, fmt: str, diagnostics: list[Diagnostic], policy: _Policy,
                     sources: dict[str, str], rules: Sequence, args: argparse.Namespace, mode: _Mode) -> None:
    if args.statistics:
        render_statistics(writer, diagnostics, policy.can_fix, as_json=fmt in ("json", "json-lines"))
        return
    if fmt == "json":
        writer.raw(render_json(diagnostics, sources))
    elif fmt == "json-lines":
        writer.raw(render_json_lines(diagnostics, sources))
    elif fmt == "github":
        writer.raw(render_github(diagnostics))
    elif fmt == "sarif":
        writer.raw(render_sarif(diagnostics, sources, [r.code for r in rules] + _meta_codes(policy)))
    elif fmt == "concise":
        render_concise(writer, diagnostics, policy.can_fix)
    else:
        render_full(writer, diagnostics, policy.can_fix, sources, preview_fixes=not mode.write)


def _meta_codes(policy: _Policy) -> list[str]:
    return [UNUSED_CODE] if UNUSED_CODE in policy.default.enabled else []


def _map_to_original(original: str, fixed: str, diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """Positions in the would-be-fixed text -> positions in the file as it is (a dry run writes nothing)."""
    if not diagnostics:
        return diagnostics
    before, after = original.splitlines(), fixed.splitlines()
    line_map: dict[int, tuple[int, bool]] = {}  # fixed line -> (original line, same text)
    for tag, a1, a2, b1, b2 in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes():
        for offset in range(b2 - b1):
            if tag == "equal":
                line_map[b1 + offset + 1] = (a1 + offset + 1, True)
            else:
                line_map[b1 + offset + 1] = (min(a1 + offset, max(a2 - 1, a1)) + 1, False)

    def position(p: Position) -> Position:
        line, same = line_map.get(p.line, (min(p.line, len(before) or 1), False))
        if same:
            return Position(line, p.col)
        width = len(before[line - 1]) + 1 if 0 < line <= len(before) else 1
        return Position(line, min(p.col, width))

    mapped = []
    for d in diagnostics:
        fix = d.fix
        if fix is not None:
            edits = tuple(Edit(position(e.start), position(e.end), e.content) for e in fix.edits)
            if all(line_map.get(e.start.line, (0, False))[1] and line_map.get(e.end.line, (0, False))[1]
                   for e in fix.edits):
                fix = dataclasses.replace(fix, edits=edits)
            else:
                fix = dataclasses.replace(fix, edits=())
        start, end = position(d.start), position(d.end)
        mapped.append(dataclasses.replace(d, start=start, end=max(end, start), fix=fix))
    return mapped


def _add_noqa(result: RunResult, policy: _Policy, reason: str, args: argparse.Namespace) -> int:
    total = 0
    for report in result.files:
        kept = [d for d in report.diagnostics if policy.keep(d)]
        if not kept or report.original is None:
            continue
        try:
            source = read_source(Path(report.path))
        except SourceError as error:
            print(f"gpulint: {report.path}: {error}", file=sys.stderr)
            continue
        if source.text != report.original:
            print(f"gpulint: {report.path}: changed while gpulint was reading it; left untouched", file=sys.stderr)
            continue
        text, changed = add_noqa(source.text, kept, reason or None)
        if not changed:
            continue
        try:
            write_source_atomically(source, text)
        except SourceError as error:
            print(f"gpulint: {report.path}: {error}", file=sys.stderr)
            continue
        total += changed
    if not args.silent:
        print(f"Added {total} noqa directive{'s' if total != 1 else ''}.", file=sys.stderr)
    return EXIT_ERROR if result.errors else EXIT_CLEAN


def _lint_stdin(args: argparse.Namespace, resolver: Resolver, mode: _Mode, fmt: str) -> int:
    from gpulint.engine import RuleCrash, lint_text
    from gpulint.fixer import fix_text

    text = sys.stdin.read()
    name = args.stdin_filename or "-"
    path = Path(name) if args.stdin_filename else Path.cwd() / "-"
    settings = resolver.settings_for(path.parent if not args.stdin_filename else path)
    if args.stdin_filename and settings.force_exclude and settings.is_excluded(path):
        if mode.fix and mode.write:
            sys.stdout.write(text)
        return EXIT_CLEAN
    rules = settings.rules_for(path)
    policy = _Policy({name: settings}, settings)
    try:
        if mode.fix:
            done, outcome = call_isolated(lambda: fix_text(text, name, rules, min_safety=Safety.UNSAFE,
                                                           rule_options=settings.options, can_fix=policy.can_fix),
                                          name, text)
            if not done:  # the parser crashed on this input: reported, nothing fixed
                from gpulint.fixer import FixOutcome

                outcome = FixOutcome(text, [], [outcome])
            diagnostics = [d for d in outcome.remaining if policy.keep(d)]
            changed = outcome.changed and outcome.text != text
            if mode.write:
                sys.stdout.write(outcome.text)  # the fixed source, like `ruff check --fix -`
                stream = sys.stderr
            else:
                if changed:
                    sys.stdout.write(_diff_text(name, text, outcome.text))
                diagnostics = _map_to_original(text, outcome.text, diagnostics) if changed else diagnostics
                stream = sys.stderr
            if not args.silent and not mode.fix_only:
                writer = Writer(stream, color=use_color(stream, args.color) and fmt in ("full", "concise"))
                _render_findings(writer, fmt, diagnostics, policy, {name: outcome.text if mode.write else text},
                                 rules, args, mode)
            if args.exit_zero:
                return EXIT_CLEAN
            if args.exit_non_zero_on_fix and outcome.fixed:
                return EXIT_FINDINGS
            if mode.fix_only:
                return EXIT_CLEAN
            return EXIT_FINDINGS if diagnostics or (changed and not mode.write) else EXIT_CLEAN
        done, found = call_isolated(lambda: lint_text(text, name, rules, rule_options=settings.options).diagnostics,
                                    name, text)
        diagnostics = [d for d in (found if done else [found]) if policy.keep(d)]
    except RuleCrash as crash:
        print(f"gpulint: error: {crash}", file=sys.stderr)
        return EXIT_ERROR
    if not args.silent:
        writer = Writer(sys.stdout, color=use_color(sys.stdout, args.color) and fmt in ("full", "concise"))
        _render_findings(writer, fmt, diagnostics, policy, {name: text}, rules, args, mode)
        if fmt not in MACHINE_FORMATS and not args.quiet and not args.statistics:
            render_summary(writer, diagnostics, policy.can_fix,
                           unsafe_hidden=sum(map(policy.hidden_unsafe, diagnostics)))
    if args.exit_zero:
        return EXIT_CLEAN
    return EXIT_FINDINGS if diagnostics else EXIT_CLEAN


def _diff_text(name: str, before: str, after: str) -> str:
    from gpulint.reporters import unified_diff

    return unified_diff(name, before, after)


class _progress:
    """A transient rich progress bar on stderr for long runs on a terminal; a no-op otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled and total >= PROGRESS_MIN_FILES and sys.stderr.isatty() \
            and os.environ.get("TERM") != "dumb"
        self._progress = None
        self._task = None

    def __enter__(self) -> Callable[[str], None] | None:
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=sys.stderr, markup=False, highlight=False)
        self._progress = Progress(TextColumn("checking"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.fields[path]}"), console=console, transient=True)
        self._progress.start()
        self._task = self._progress.add_task("gpulint", total=self.total, path="")
        return self._advance

    def _advance(self, path: str) -> None:
        assert self._progress is not None and self._task is not None
        self._progress.update(self._task, advance=1, path=path)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


# -- rule docs ------------------------------------------------------------------------------------------------

def _rules(args: argparse.Namespace) -> int:
    infos = all_infos()
    if args.output_format == "json":
        print(json.dumps([rule_json(i) for i in infos], indent=2))
        return EXIT_CLEAN
    width = max(len(i.name) for i in infos)
    print("[*] safe fix (gpulint fix --apply)   [!] unsafe fix (needs --unsafe-fixes)   on/off: enabled by default")
    for info in infos:
        mark = "[*]" if info.safety is Safety.SAFE else "[!]" if info.safety is Safety.UNSAFE else "   "
        state = "always" if info.meta and not info.selectable else "on" if info.default_enabled else "off"
        print(f"{info.code}  {mark}  {info.name:<{width}}  {info.severity.value:<7}  {state:<6}  {info.summary}")
    return EXIT_CLEAN


def _rule(args: argparse.Namespace) -> int:
    if args.all:
        infos = all_infos()
    elif args.code:
        info = find_info(args.code)
        if info is None:
            from gpulint.config import did_you_mean

            known = [i.code for i in all_infos()] + [i.name for i in all_infos()]
            raise UsageError(f"unknown rule {args.code!r}" + did_you_mean(args.code, known))
        infos = [info]
    else:
        raise UsageError("give a rule code (e.g. `gpulint rule GPU011`) or --all")
    if args.output_format == "json":
        payload = [rule_json(i) for i in infos]
        print(json.dumps(payload if args.all else payload[0], indent=2))
        return EXIT_CLEAN
    sys.stdout.write("\n".join(rule_markdown(i) for i in infos))
    return EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())
