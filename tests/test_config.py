"""Configuration, run for real through the CLI: `[tool.gpulint]` / gpulint.toml discovery, every key, paths
relative to the config file, command-line precedence, `--config`, `--isolated`, strict validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from samples import BAD, GOOD, REPO


def gpulint(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("GPULINT_") and k not in ("NO_COLOR", "FORCE_COLOR", "GITHUB_WORKSPACE")}
    environment["PYTHONPATH"] = str(REPO) + os.pathsep + environment.get("PYTHONPATH", "")
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpulint", *args], cwd=cwd, capture_output=True, text=True,
                          env=environment, timeout=300)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def findings(result: subprocess.CompletedProcess) -> list[str]:
    """`path:CODE` for each concise line."""
    out = []
    for line in result.stdout.splitlines():
        path, _row, _col, rest = line.split(":", 3)
        out.append(f"{path}:{rest.split()[0]}")
    return sorted(out)


def check(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return gpulint("check", "--output-format", "concise", "-q", *args, cwd=cwd)


# -- files and discovery -------------------------------------------------------------------------------------

def test_pyproject_select_and_ignore(tmp_path):
    write(tmp_path / "train.py", BAD)
    write(tmp_path / "pyproject.toml", """\
        [project]
        name = "demo"

        [tool.gpulint]
        select = ["GPU01"]
        ignore = ["GPU011"]
    """)
    assert check(tmp_path).returncode == 0
    # the command line overrides: its --select starts from scratch
    assert findings(check(tmp_path, "--select", "GPU011")) == ["train.py:GPU011"]


def test_lint_subtable_and_extend_select(tmp_path):
    write(tmp_path / "train.py", BAD)
    write(tmp_path / "pyproject.toml", """\
        [tool.gpulint.lint]
        select = ["GPU022"]
        extend-select = ["h2d-copy-blocking"]
    """)
    assert findings(check(tmp_path)) == ["train.py:GPU011"]
    write(tmp_path / "pyproject.toml", """\
        [tool.gpulint]
        select = ["GPU022"]

        [tool.gpulint.lint]
        select = ["GPU011"]
    """)
    result = check(tmp_path)
    assert result.returncode == 2 and "'select' is set both at the top level and under `lint`" in result.stderr


def test_standalone_files_and_their_precedence(tmp_path):
    write(tmp_path / "train.py", BAD)
    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU011"]\n')
    write(tmp_path / "gpulint.toml", 'select = ["GPU022"]\n')  # no [tool.gpulint] prefix in gpulint.toml
    assert check(tmp_path).returncode == 0
    write(tmp_path / ".gpulint.toml", 'select = ["GPU011"]\n')
    assert findings(check(tmp_path)) == ["train.py:GPU011"]


def test_nearest_config_wins_per_file(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU011"]\nignore = ["GPU011"]\n')
    write(tmp_path / "train.py", BAD)
    write(tmp_path / "sub" / "gpulint.toml", 'select = ["GPU011"]\n')
    write(tmp_path / "sub" / "train.py", BAD)
    write(tmp_path / "plain" / "pyproject.toml", '[project]\nname = "no-gpulint-table"\n')  # skipped
    write(tmp_path / "plain" / "train.py", BAD)
    assert findings(check(tmp_path)) == ["sub/train.py:GPU011"]
    # the same answer when the file is named directly or from another working directory
    assert findings(check(tmp_path / "plain", "train.py")) == []
    assert findings(check(tmp_path / "sub", "train.py")) == ["train.py:GPU011"]
    assert findings(check(tmp_path.parent, f"{tmp_path.name}/sub/train.py")) == [f"{tmp_path.name}/sub/train.py:GPU011"]


def test_paths_are_relative_to_the_config_file(tmp_path):
    project = tmp_path / "project"
    write(project / "pyproject.toml", """\
        [tool.gpulint]
        select = ["GPU011"]
        extend-exclude = ["scratch", "experiments/old"]

        [tool.gpulint.per-file-ignores]
        "tests/**" = ["GPU011"]
        "legacy_*.py" = ["GPU01"]
    """)
    for name in ("train.py", "tests/unit/test_train.py", "legacy_train.py", "scratch/a.py",
                 "experiments/old/b.py", "experiments/new/c.py", "pkg/experiments/old/d.py"):
        write(project / name, BAD)
    expected = ["experiments/new/c.py:GPU011", "pkg/experiments/old/d.py:GPU011", "train.py:GPU011"]
    assert findings(check(project)) == expected
    # from outside the project: still relative to the config, not to the cwd
    assert findings(check(tmp_path, "project")) == sorted(f"project/{e}" for e in expected)


def test_exclude_replaces_defaults_and_explicit_files_are_linted(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU011"]\nextend-exclude = ["gen"]\n')
    write(tmp_path / "gen" / "model.py", BAD)
    write(tmp_path / "build" / "x.py", BAD)
    write(tmp_path / "templates" / "{{cookiecutter.name}}" / "run.py", "def {{ name }}():\n")  # a Jinja template
    write(tmp_path / "train.py", BAD)
    assert findings(check(tmp_path)) == ["train.py:GPU011"]
    # a file named on the command line is linted unless --force-exclude (what the pre-commit hook passes)
    assert findings(check(tmp_path, "gen/model.py")) == ["gen/model.py:GPU011"]
    assert findings(check(tmp_path, "--force-exclude", "gen/model.py", "train.py")) == ["train.py:GPU011"]
    # a folder named on the command line is walked even if its own name is excluded
    assert findings(check(tmp_path, "build")) == ["build/x.py:GPU011"]
    # `exclude` replaces the defaults (which exclude build/)
    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU011"]\nexclude = ["gen"]\n')
    assert findings(check(tmp_path)) == ["build/x.py:GPU011", "templates/{{cookiecutter.name}}/run.py:GPU900",
                                         "train.py:GPU011"]


def test_fixable_unfixable_and_unsafe_fixes_from_config(tmp_path):
    write(tmp_path / "train.py", BAD)
    write(tmp_path / "gpulint.toml", 'select = ["GPU011"]\nunfixable = ["GPU011"]\n')
    assert gpulint("fix", "--apply", cwd=tmp_path).returncode == 1
    assert (tmp_path / "train.py").read_text() == BAD
    assert gpulint("fix", "--apply", "--fixable", "GPU011", cwd=tmp_path).returncode == 0
    assert (tmp_path / "train.py").read_text() == GOOD
    # per-rule demotion: GPU011's safe fix counts as unsafe
    write(tmp_path / "train.py", BAD)
    write(tmp_path / "gpulint.toml", 'select = ["GPU011"]\nextend-unsafe-fixes = ["GPU011"]\n')
    data = json.loads(gpulint("check", "--output-format", "json", cwd=tmp_path).stdout)
    assert data[0]["fix"]["applicability"] == "unsafe"
    assert gpulint("fix", "--apply", cwd=tmp_path).returncode == 1
    assert (tmp_path / "train.py").read_text() == BAD
    assert gpulint("fix", "--apply", "--unsafe-fixes", cwd=tmp_path).returncode == 0
    assert (tmp_path / "train.py").read_text() == GOOD


def _unsafe_rule():
    from gpulint.diagnostics import Safety
    from gpulint.registry import all_rules
    from gpulint.rule import Invalid

    for rule in all_rules():
        if rule.safety is Safety.UNSAFE:
            for example in rule.examples:
                if isinstance(example, Invalid) and example.fixed is not None:
                    return rule, example
    return None, None


def test_unsafe_fixes_setting(tmp_path):
    rule, example = _unsafe_rule()
    assert rule is not None, "the registry has rules with unsafe fixes"
    write(tmp_path / "train.py", example.code)
    write(tmp_path / "gpulint.toml", f'select = ["{rule.code}"]\n')
    gpulint("fix", "--apply", cwd=tmp_path)
    assert (tmp_path / "train.py").read_text() == example.code, "unsafe fixes need opting in"
    hint = check(tmp_path)
    assert "[*]" not in hint.stdout
    write(tmp_path / "gpulint.toml", f'select = ["{rule.code}"]\nunsafe-fixes = true\n')
    gpulint("fix", "--apply", cwd=tmp_path)
    assert (tmp_path / "train.py").read_text() == example.fixed
    write(tmp_path / "train.py", example.code)
    gpulint("fix", "--apply", "--no-unsafe-fixes", cwd=tmp_path)  # the command line wins
    assert (tmp_path / "train.py").read_text() == example.code
    # per-rule promotion: this rule's unsafe fixes count as safe
    write(tmp_path / "gpulint.toml", f'select = ["{rule.code}"]\nextend-safe-fixes = ["{rule.code}"]\n')
    assert "[*]" in check(tmp_path).stdout
    gpulint("fix", "--apply", cwd=tmp_path)
    assert (tmp_path / "train.py").read_text() == example.fixed


def test_output_format_and_show_fixes_from_config(tmp_path):
    write(tmp_path / "train.py", BAD)
    write(tmp_path / "gpulint.toml", 'select = ["GPU011"]\noutput-format = "json"\nshow-fixes = true\n')
    data = json.loads(gpulint("check", cwd=tmp_path).stdout)
    assert [d["code"] for d in data] == ["GPU011"]
    assert gpulint("check", "--output-format", "concise", cwd=tmp_path).stdout.startswith("train.py:6:13")
    fixed = gpulint("fix", "--apply", "--output-format", "full", cwd=tmp_path)
    assert "1 × GPU011 (h2d-copy-blocking)" in fixed.stdout


def test_extend_inherits_explicitly(tmp_path):
    write(tmp_path / "base.toml", 'select = ["GPU011"]\n[per-file-ignores]\n"vendor/*" = ["GPU011"]\n')
    write(tmp_path / "app" / "gpulint.toml", 'extend = "../base.toml"\nextend-select = ["GPU022"]\n')
    write(tmp_path / "app" / "train.py", BAD)
    write(tmp_path / "vendor" / "lib.py", BAD)
    assert findings(check(tmp_path / "app")) == ["train.py:GPU011"]
    # the inherited per-file-ignores stay relative to base.toml
    result = check(tmp_path, "--config", "app/gpulint.toml")
    assert findings(result) == ["app/train.py:GPU011"]
    write(tmp_path / "base.toml", 'extend = "app/gpulint.toml"\n')
    cycle = check(tmp_path / "app")
    assert cycle.returncode == 2 and "circular" in cycle.stderr


def test_config_flag_and_isolated(tmp_path):
    write(tmp_path / "train.py", BAD)
    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU022"]\n')
    write(tmp_path / "ci" / "strict.toml", 'select = ["GPU011"]\n')
    assert check(tmp_path).returncode == 0
    assert findings(check(tmp_path, "--config", "ci/strict.toml")) == ["train.py:GPU011"]
    assert findings(check(tmp_path, "--config", "select = ['GPU011']")) == ["train.py:GPU011"]
    assert findings(check(tmp_path, "--config", "lint.select = ['GPU011']", "--ignore", "GPU011")) == []
    isolated = json.loads(gpulint("check", "--isolated", "--show-settings", cwd=tmp_path).stdout)
    assert isolated["config"] is None and "GPU011" in isolated["enabled"]
    shown = json.loads(gpulint("check", "--show-settings", cwd=tmp_path).stdout)
    assert shown["config"].endswith("pyproject.toml") and shown["enabled"] == ["GPU022"]


# -- validation: one line, exit 2 ----------------------------------------------------------------------------

@pytest.mark.parametrize(("config", "message"), [
    ('[tool.gpulint]\nselct = ["GPU011"]\n', "unknown key 'selct' in [tool.gpulint] (did you mean 'select'?)"),
    ('[tool.gpulint.lint]\nper-file-ignore = {}\n',
     "unknown key 'per-file-ignore' in [tool.gpulint.lint] (did you mean 'per-file-ignores'?)"),
    ('[tool.gpulint]\nselect = ["GPU0111"]\n', "select: unknown rule selector 'GPU0111' (did you mean 'GPU011'?)"),
    ('[tool.gpulint]\nselect = "GPU011"\n', "select must be a list of strings"),
    ('[tool.gpulint.per-file-ignores]\n"tests/*" = ["GPX1"]\n', "per-file-ignores 'tests/*': unknown rule selector"),
    ('[tool.gpulint.options.GPU0111]\nx = 1\n', "options: unknown rule code 'GPU0111' (did you mean 'GPU011'?)"),
    ('[tool.gpulint.options.GPU011]\nmin-batch-size = 8\n', "unknown option 'min-batch-size'"),
    ('[tool.gpulint]\nunsafe-fixes = "yes"\n', "unsafe-fixes must be true or false"),
    ('[tool.gpulint]\noutput-format = "jsn"\n', "unknown format 'jsn' (did you mean 'json'?)"),
    ('[tool.gpulint\nselect = 1\n', "invalid TOML"),
])
def test_bad_config_is_a_one_line_error(tmp_path, config, message):
    write(tmp_path / "train.py", BAD)
    write(tmp_path / "pyproject.toml", config)
    result = check(tmp_path)
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpulint: error: pyproject.toml: "), lines[0]
    assert message in lines[0]


def test_per_rule_options_reach_the_rule(tmp_path):
    """`[tool.gpulint.options.CODE]` is validated against the rule's declared options and passed to it; a rule
    with options is registered for this run (real rules add options over time)."""
    write(tmp_path / "train.py", "loader = DataLoader(ds, batch_size=4)\n")
    driver = textwrap.dedent('''
        import sys
        import libcst as cst
        import gpulint.registry as registry
        from gpulint.rule import Invalid, Rule, Valid

        class TinyBatch(Rule):
            """
            ## What it does
            Test rule.
            ## Why is this slow
            -
            ## Example
            -
            ## Use instead
            -
            ## Fix safety
            -
            """
            code = "GPU953"
            name = "tiny-batch-test"
            message = "batch"
            options = {"min_batch_size": 16, "names": ["batch_size"]}
            examples = [Valid("x = 1"), Invalid("DataLoader(ds, batch_size=1)")]

            def visit_Call(self, node):
                for arg in node.args:
                    if arg.keyword and arg.keyword.value in self.option(self.ctx, "names"):
                        value = int(arg.value.value)
                        limit = self.option(self.ctx, "min_batch_size")
                        if value < limit:
                            self.report(node, f"batch {value} < {limit}")

        real = registry.all_rules()
        registry.all_rules = lambda: real + (TinyBatch,)
        from gpulint.cli import main
        sys.exit(main(sys.argv[1:]))
    ''')
    (tmp_path / "driver.py").write_text(driver)

    def run(*args: str) -> subprocess.CompletedProcess:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULINT_")}
        environment["PYTHONPATH"] = str(REPO) + os.pathsep + environment.get("PYTHONPATH", "")
        return subprocess.run([sys.executable, "driver.py", "check", "--output-format", "concise", "-q",
                               "train.py", *args], cwd=tmp_path, capture_output=True, text=True, env=environment)

    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU953"]\n')
    assert "batch 4 < 16" in run().stdout
    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU953"]\n'
                                       '[tool.gpulint.options.GPU953]\nmin-batch-size = 8\n')
    assert "batch 4 < 8" in run().stdout
    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU953"]\n'
                                       '[tool.gpulint.lint.options.tiny-batch-test]\nmin_batch_size = 2\n')
    assert run().returncode == 0
    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU953"]\n'
                                       '[tool.gpulint.options.GPU953]\nmin-batch-sise = 8\n')
    bad = run()
    assert bad.returncode == 2
    assert "unknown option 'min-batch-sise' (did you mean 'min-batch-size'?)" in bad.stderr
    write(tmp_path / "pyproject.toml", '[tool.gpulint]\nselect = ["GPU953"]\n'
                                       '[tool.gpulint.options.GPU953]\nmin-batch-size = "8"\n')
    assert "expected int, got str" in run().stderr
