"""The command line, run for real (`python -m gpulint ...` in a subprocess): check/fix verbs and aliases, exit
codes, stdin, suppression comments, --add-noqa, and `gpulint rule` with the generated rule pages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from samples import BAD, GOOD, REPO


def gpulint(*args: str, cwd: Path, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("GPULINT_") and k not in ("NO_COLOR", "FORCE_COLOR", "GITHUB_WORKSPACE")}
    environment["PYTHONPATH"] = str(REPO) + os.pathsep + environment.get("PYTHONPATH", "")
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpulint", *args], cwd=cwd, capture_output=True, text=True,
                          input=stdin, env=environment, timeout=300)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(BAD)
    return tmp_path


# -- verbs and exit codes ------------------------------------------------------------------------------------

def test_check_reports_and_exits_1(project):
    result = gpulint("check", "--select", "GPU011", "--output-format", "concise", cwd=project)
    assert result.returncode == 1, result.stderr
    assert "train.py:6:13: GPU011 [*] Host-to-device copy" in result.stdout
    assert "Found 1 finding" in result.stdout
    assert "[*] 1 fixable with `gpulint fix --apply`" in result.stdout


def test_clean_exits_0(project):
    (project / "train.py").write_text(GOOD)
    result = gpulint("check", "--select", "GPU011", cwd=project)
    assert result.returncode == 0
    assert "All checks passed!" in result.stdout


def test_full_format_has_ruff_shape(project):
    result = gpulint("check", "--select", "GPU011", cwd=project)
    lines = result.stdout.splitlines()
    assert lines[0] == "GPU011 [*] Host-to-device copy in the training step blocks the host; pass `non_blocking=True`"
    assert lines[1] == " --> train.py:6:13"
    assert "6 |         x = x.to(device)" in lines
    assert "  |             ^^^^^^^^^^^^" in lines
    assert "help: Add `non_blocking=True`" in lines
    assert "  -         x = x.to(device)" in lines  # the fix preview
    assert "6 +         x = x.to(device, non_blocking=True)" in lines


def test_fix_dry_run_prints_a_patch_and_what_remains(project):
    (project / "broken.py").write_text("def f(:\n    pass\n")
    before = (project / "train.py").read_text()
    result = gpulint("fix", "--select", "GPU011", cwd=project)
    assert result.returncode == 1
    assert (project / "train.py").read_text() == before, "a dry run must not write"
    assert result.stdout.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "All checks passed!" not in result.stdout + result.stderr
    assert "Would fix 1 finding." in result.stderr
    assert "1 finding would remain" in result.stderr
    assert "GPU900" in result.stderr and "broken.py" in result.stderr
    # the patch on stdout applies with git
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "apply"], cwd=project, input=result.stdout, text=True, check=True)
    assert (project / "train.py").read_text() == GOOD


def test_fix_dry_run_with_nothing_to_do(project):
    (project / "train.py").write_text(GOOD)
    result = gpulint("fix", "--select", "GPU011", cwd=project)
    assert result.returncode == 0
    assert result.stdout == ""
    assert "All checks passed!" in result.stderr


def test_fix_apply_exits_0_when_everything_is_fixed(project):
    result = gpulint("fix", "--apply", "--select", "GPU011", "--show-fixes", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (project / "train.py").read_text() == GOOD
    assert "Fixed 1 finding:" in result.stdout
    assert "    1 × GPU011 (h2d-copy-blocking)" in result.stdout


def test_fix_apply_exits_1_when_unfixable_findings_remain(project):
    (project / "broken.py").write_text("def f(:\n    pass\n")
    result = gpulint("fix", "--apply", "--select", "GPU011", "--output-format", "concise", cwd=project)
    assert result.returncode == 1
    assert (project / "train.py").read_text() == GOOD
    assert "broken.py:1:" in result.stdout and "GPU900" in result.stdout
    assert "(1 fixed, 1 remaining" in result.stdout


def test_unfixable_setting_keeps_the_finding(project):
    result = gpulint("fix", "--apply", "--select", "GPU011", "--unfixable", "GPU011", cwd=project)
    assert result.returncode == 1
    assert (project / "train.py").read_text() == BAD
    check = gpulint("check", "--select", "GPU011", "--unfixable", "GPU011", "--output-format", "concise",
                    cwd=project)
    assert "GPU011 Host-to-device" in check.stdout  # no [*]: not fixable with these settings


def test_check_fix_and_diff_aliases(project):
    diff = gpulint("check", "--diff", "--select", "GPU011", cwd=project)
    assert diff.returncode == 1 and diff.stdout.startswith("--- a/train.py")
    assert (project / "train.py").read_text() == BAD
    fixed = gpulint("check", "--fix", "--select", "GPU011", cwd=project)
    assert fixed.returncode == 0
    assert (project / "train.py").read_text() == GOOD


def test_exit_modifiers(project):
    assert gpulint("check", "--select", "GPU011", "--exit-zero", cwd=project).returncode == 0
    fix_only = gpulint("check", "--fix-only", "--select", "GPU011", "--unfixable", "GPU011", cwd=project)
    assert fix_only.returncode == 0 and fix_only.stdout == ""
    on_fix = gpulint("fix", "--apply", "--exit-non-zero-on-fix", "--select", "GPU011", cwd=project)
    assert on_fix.returncode == 1  # fixed something, even though nothing remains
    again = gpulint("fix", "--apply", "--exit-non-zero-on-fix", "--select", "GPU011", cwd=project)
    assert again.returncode == 0


def test_quiet_and_silent(project):
    quiet = gpulint("check", "--select", "GPU011", "-q", "--output-format", "concise", cwd=project)
    assert quiet.returncode == 1
    assert quiet.stdout.splitlines() == [l for l in quiet.stdout.splitlines() if l.startswith("train.py:")]
    silent = gpulint("check", "--select", "GPU011", "-s", cwd=project)
    assert silent.returncode == 1 and silent.stdout == ""


def test_usage_errors_exit_2_with_one_line(project):
    for args in (["check", "--select", "GPU0111"], ["check", "--output-format", "xml"], ["frobnicate"]):
        result = gpulint(*args, cwd=project)
        assert result.returncode == 2, args
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "did you mean 'GPU011'" in gpulint("check", "--select", "GPU0111", cwd=project).stderr


def test_missing_path_and_syntax_error_are_findings(project):
    (project / "broken.py").write_text("def f(:\n    pass\n")
    result = gpulint("check", "--select", "GPU011", "--output-format", "concise", "broken.py", "nope.py",
                     cwd=project)
    assert result.returncode == 1
    assert "broken.py:1:" in result.stdout and "GPU900" in result.stdout
    assert "nope.py:1:1: GPU901" in result.stdout
    assert "Traceback" not in result.stderr


def test_stdin(project):
    result = gpulint("check", "--select", "GPU011", "--output-format", "concise", "--stdin-filename",
                     "train.py", "-", cwd=project, stdin=BAD)
    assert result.returncode == 1
    assert result.stdout.startswith("train.py:6:13: GPU011")
    implicit = gpulint("check", "--select", "GPU011", "--stdin-filename", "train.py", cwd=project, stdin=GOOD)
    assert implicit.returncode == 0  # --stdin-filename without paths reads stdin, not the folder
    fixed = gpulint("check", "--fix", "--select", "GPU011", "-", cwd=project, stdin=BAD)
    assert fixed.returncode == 0
    assert fixed.stdout == GOOD


def test_show_files_and_settings(project):
    (project / ".venv").mkdir()
    (project / ".venv" / "lib.py").write_text(BAD)
    files = gpulint("check", "--show-files", cwd=project)
    assert files.stdout.splitlines() == ["train.py"]
    settings = json.loads(gpulint("check", "--show-settings", "--select", "GPU011", cwd=project).stdout)
    assert settings["enabled"] == ["GPU011"]
    assert settings["config"] is None


# -- suppressions --------------------------------------------------------------------------------------------

def _check(project: Path, *extra: str) -> subprocess.CompletedProcess:
    return gpulint("check", "--output-format", "concise", "-q", *extra, cwd=project)


def _codes_by_line(result: subprocess.CompletedProcess) -> list[tuple[int, str]]:
    found = []
    for line in result.stdout.splitlines():
        path, row, _col, rest = line.split(":", 3)
        found.append((int(row), rest.split()[0]))
    return found


def test_noqa_forms(project):
    (project / "train.py").write_text(textwrap.dedent("""\
        import torch


        def train(model, loader, optimizer, device):
            for x, y, z, w, v, t in loader:
                x = x.to(device)  # noqa: GPU011
                y = y.to(device)  # noqa
                z = z.to(device)  # NOQA:GPU011 reason text
                # gpulint: ignore[GPU011]
                w = w.to(
                    device)
                v = v.to(device)  # gpulint: fixme[GPU011]
                s = "# noqa: GPU011"; t = t.to(device)
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
    """))
    result = _check(project, "--select", "GPU011")
    # a bare noqa belongs to other linters; text inside a string is not a comment
    assert _codes_by_line(result) == [(7, "GPU011"), (13, "GPU011")]
    everything = _check(project, "--select", "GPU011", "--ignore-noqa")
    assert [row for row, _ in _codes_by_line(everything)] == [6, 7, 8, 10, 12, 13]


def test_file_level_noqa(project):
    text = BAD.replace("import torch\n", "import torch\n# gpulint: noqa\n")
    (project / "train.py").write_text(text)
    assert _check(project, "--select", "GPU011").returncode == 0
    (project / "train.py").write_text(BAD.replace("import torch\n", "import torch\n# gpulint: noqa: GPU022\n"))
    assert _codes_by_line(_check(project, "--select", "GPU011")) == [(7, "GPU011")]
    (project / "train.py").write_text(BAD.replace("import torch\n", "import torch  # gpulint: noqa\n"))
    assert _check(project, "--select", "GPU011").returncode == 1  # only on a line of its own


def test_unused_suppressions_are_reported_and_fixed(project):
    (project / "train.py").write_text(textwrap.dedent("""\
        import torch  # noqa: GPU011


        def train(model, loader, optimizer, device):
            for x, y in loader:
                x = x.to(device)  # noqa: GPU011, GPU999, E501
                # gpulint: ignore[GPU011]
                loss = model(x).sum()  # keep me  # noqa: GPU011  # type: ignore
                loss.backward()
                optimizer.step()
    """))
    result = _check(project, "--select", "GPU011,GPU902")
    assert _codes_by_line(result) == [(1, "GPU902"), (6, "GPU902"), (7, "GPU902"), (8, "GPU902")]
    assert "Unused `noqa` directive (unknown: GPU999)" in result.stdout
    # unused-noqa is on by default, off when an explicit selection leaves it out, and can be ignored
    assert _check(project, "--select", "GPU011").returncode == 0
    assert _check(project, "--select", "GPU011,GPU902", "--ignore", "unused-noqa").returncode == 0
    fixed = gpulint("fix", "--apply", "--select", "GPU011,GPU902", cwd=project)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert (project / "train.py").read_text() == textwrap.dedent("""\
        import torch


        def train(model, loader, optimizer, device):
            for x, y in loader:
                x = x.to(device)  # noqa: GPU011, E501
                loss = model(x).sum()  # keep me  # type: ignore
                loss.backward()
                optimizer.step()
    """)


def test_noqa_for_a_rule_that_is_not_enabled_is_left_alone(project):
    (project / "train.py").write_text(GOOD.replace("import torch", "import torch  # noqa: GPU011"))
    assert _check(project, "--select", "GPU022,GPU902").returncode == 0


def test_add_noqa_then_clean(project):
    (project / "train.py").write_text(BAD.replace("loss = model(x).sum()", "loss = model(x).sum()  # noqa: E501")
                                      .replace("x = x.to(device)", "x = x.to(device)  # noqa: E731"))
    added = gpulint("check", "--select", "GPU011", "--add-noqa", cwd=project)
    assert added.returncode == 0, added.stderr
    assert "Added 1 noqa directive." in added.stderr
    text = (project / "train.py").read_text()
    assert "x = x.to(device)  # noqa: E731, GPU011\n" in text
    assert _check(project, "--select", "GPU011,GPU902").returncode == 0
    (project / "other.py").write_text(BAD)
    gpulint("check", "--select", "GPU011", "--add-noqa=legacy loader", "other.py", cwd=project)
    assert "x = x.to(device)  # noqa: GPU011 legacy loader\n" in (project / "other.py").read_text()
    assert _check(project, "--select", "GPU011,GPU902").returncode == 0


def test_add_noqa_on_a_multiline_string_goes_after_the_string(project):
    (project / "train.py").write_text(textwrap.dedent('''\
        def train(model, loader, optimizer, device):
            for x, y in loader:
                x = x.to(device, """
                """)
                loss = model(x).sum()
                loss.backward()
                optimizer.step()
    '''))
    before = _check(project, "--select", "GPU011")
    assert before.returncode == 1, "GPU011 fires on this training step"
    gpulint("check", "--select", "GPU011", "--add-noqa", cwd=project)
    text = (project / "train.py").read_text()
    assert '    """)  # noqa: GPU011\n' in text
    assert _check(project, "--select", "GPU011,GPU902").returncode == 0


# -- rule docs -------------------------------------------------------------------------------------------------

def test_rule_text_and_json(project):
    text = gpulint("rule", "GPU011", cwd=project)
    assert text.returncode == 0
    assert text.stdout.startswith("# h2d-copy-blocking (GPU011)\n")
    for heading in ("## What it does", "## Why is this slow", "## Example", "## Use instead", "## Fix safety",
                    "## Tested examples"):
        assert heading in text.stdout
    data = json.loads(gpulint("rule", "h2d-copy-blocking", "--output-format", "json", cwd=project).stdout)
    assert data["code"] == "GPU011" and data["linter"] == "gpulint"
    assert data["fix_availability"] == "Always" and data["explanation"].startswith("## What it does")
    assert {"name", "summary", "message_formats", "fix", "preview", "examples"} <= set(data)
    meta = json.loads(gpulint("rule", "GPU902", "--output-format", "json", cwd=project).stdout)
    assert meta["name"] == "unused-noqa"


def test_rule_all_and_unknown(project):
    from gpulint.registry import all_rules

    every = json.loads(gpulint("rule", "--all", "--output-format", "json", cwd=project).stdout)
    assert {r.code for r in all_rules()} <= {entry["code"] for entry in every}
    unknown = gpulint("rule", "GPU0111", cwd=project)
    assert unknown.returncode == 2 and "did you mean 'GPU011'" in unknown.stderr


def test_rule_pages_are_in_sync(update_fixtures):
    """docs/rules/<CODE>.md is generated from each rule; regenerate with `python -m gpulint.docs` (or
    `python -m pytest tests --update-fixtures`)."""
    if update_fixtures:
        from gpulint.docs import write_pages

        write_pages()
    result = subprocess.run([sys.executable, "-m", "gpulint.docs", "--check"], cwd=REPO, capture_output=True,
                            text=True)
    assert result.returncode == 0, f"stale rule pages, run `python -m gpulint.docs`:\n{result.stdout}"


def test_rule_page_generator_is_generic(tmp_path):
    from gpulint.docs import expected_pages, stale_pages, write_pages
    from gpulint.registry import all_rules

    write_pages(tmp_path)
    assert stale_pages(tmp_path) == []
    assert {f"{r.code}.md" for r in all_rules()} <= set(expected_pages())
    (tmp_path / "GPU999.md").write_text("left over")
    (tmp_path / "GPU011.md").write_text("edited by hand")
    assert stale_pages(tmp_path) == ["GPU011.md", "GPU999.md"]
    shutil.rmtree(tmp_path)


def test_notebooks_and_empty_folders_are_named_not_silently_passed(tmp_path):
    (tmp_path / "analysis.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    named = gpulint("check", "analysis.ipynb", cwd=tmp_path)
    assert named.returncode == 0
    assert "analysis.ipynb: Jupyter notebooks are not checked; skipped" in named.stderr
    walked = gpulint("check", ".", cwd=tmp_path)
    assert "no Python files found under the given path(s)" in walked.stderr
    assert gpulint("check", ".", "--silent", cwd=tmp_path).stderr == ""
