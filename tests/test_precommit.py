"""The pre-commit hooks, run for real: pre-commit (installed from PyPI if missing) clones this checkout at
HEAD, installs gpulint into its own virtualenv, and runs `gpulint-check` / `gpulint-fix` on a temporary git
repository. The hooks tested are the ones committed at HEAD, so commit before running this test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from samples import BAD, GOOD, REPO


def _pre_commit() -> list[str]:
    """pre-commit comes with the test extra (`pip install -e '.[test]'`); its absence is a failure, not a skip."""
    probe = subprocess.run([sys.executable, "-m", "pre_commit", "--version"], capture_output=True, text=True)
    assert probe.returncode == 0, "pre-commit is missing: pip install -e '.[test]'"
    return [sys.executable, "-m", "pre_commit"]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=gpulint tests", "-c", "user.email=tests@gpulint.invalid",
                           "-c", "commit.gpgsign=false", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def pre_commit() -> list[str]:
    assert shutil.which("git") is not None, "the pre-commit test needs git"
    return _pre_commit()


def _run(pre_commit: list[str], cwd: Path) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("GPULINT_", "GIT_"))}
    environment.pop("NO_COLOR", None)
    return subprocess.run([*pre_commit, "run", "--all-files", "--color", "never"], cwd=cwd, capture_output=True,
                          text=True, env=environment, timeout=900)


def _project(tmp_path: Path, hook: str) -> Path:
    head = _git("rev-parse", "HEAD", cwd=REPO)
    tracked = _git("ls-files", ".pre-commit-hooks.yaml", cwd=REPO)
    if not tracked:
        pytest.fail(".pre-commit-hooks.yaml is not committed; pre-commit clones the repository at HEAD")
    project = tmp_path / "project"
    project.mkdir()
    _git("init", "-q", cwd=project)
    (project / "train.py").write_text(BAD)
    (project / "pyproject.toml").write_text('[tool.gpulint]\nselect = ["GPU011"]\nextend-exclude = ["vendor"]\n')
    (project / "vendor").mkdir()
    (project / "vendor" / "third_party.py").write_text(BAD)  # excluded even though pre-commit names it
    (project / ".pre-commit-config.yaml").write_text(textwrap.dedent(f"""\
        repos:
          - repo: {REPO.as_posix()}
            rev: {head}
            hooks:
              - id: {hook}
    """))
    _git("add", "-A", cwd=project)
    _git("commit", "-q", "-m", "bad training code", cwd=project)
    return project


def test_manifest_is_valid(pre_commit):
    result = subprocess.run([*pre_commit, "validate-manifest", str(REPO / ".pre-commit-hooks.yaml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_hook_fails_on_a_finding_and_passes_once_fixed(pre_commit, tmp_path):
    project = _project(tmp_path, "gpulint-check")
    failed = _run(pre_commit, project)
    output = failed.stdout + failed.stderr
    assert failed.returncode == 1, output
    assert "gpulint check" in output and "Failed" in output
    assert "GPU011" in output and "train.py:6:13" in output
    assert "vendor" not in output, "--force-exclude in the hook's entry keeps the config's excludes"
    (project / "train.py").write_text(GOOD)
    _git("add", "-A", cwd=project)
    passed = _run(pre_commit, project)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "Passed" in passed.stdout


def test_fix_hook_fixes_reports_and_then_passes(pre_commit, tmp_path):
    project = _project(tmp_path, "gpulint-fix")
    fixed = _run(pre_commit, project)
    output = fixed.stdout + fixed.stderr
    assert fixed.returncode == 1, output
    assert "files were modified by this hook" in output
    assert "1 × GPU011 (h2d-copy-blocking)" in output and "train.py" in output
    assert (project / "train.py").read_text() == GOOD
    assert (project / "vendor" / "third_party.py").read_text() == BAD
    _git("add", "-A", cwd=project)
    again = _run(pre_commit, project)
    assert again.returncode == 0, again.stdout + again.stderr
