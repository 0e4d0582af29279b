"""A `check` whose every file is a results-cache hit is recorded; the same `check` with unchanged inputs prints the
recording without importing libcst, the rules or the config (issue 12, start-up). Any change of what the run
read -- a source, a new file, a config, an ignore file, an environment variable -- runs it for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

GOOD = "import torch\nfor x, y in loader:\n    x = x.to('cuda')\n    x.sum().backward()\n    opt.step()\n"
PROBE = ("import sys\nfrom gpulint.cli import main\ncode = main(sys.argv[1:])\nsys.stdout.flush()\n"
         "print('\\0' + json.dumps([code, sorted(sys.modules)]), file=sys.stderr)\n")


MODULES: dict[tuple, list[str]] = {}  # the modules the last run of each command line imported


def check(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, bool]:
    """(exit code, stdout, stderr, replayed: libcst was never imported)."""
    command = [sys.executable, "-c", "import json\n" + PROBE, "check", *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_COLOR": "1", **(env or {})})
    stderr, _, tail = result.stderr.rpartition("\0")
    code, modules = json.loads(tail)
    MODULES[args] = modules
    return code, result.stdout, stderr, "libcst" not in modules


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(GOOD)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "util.py").write_text("import torch\n")
    return tmp_path


def recorded(project: Path, *args: str) -> tuple[int, str, str]:
    """Cold run, then the warm run that records; returns the warm run's result."""
    cold = check(project, *args)
    assert not cold[3]
    assert not (project / ".gpulint_cache" / "runs").exists()  # a run that linted files is never recorded
    time.sleep(2.1)  # a run reading files changed less than 2 s before it is not recorded (timestamp granularity)
    warm = check(project, *args)
    assert not warm[3] and warm[:3] == cold[:3]
    assert list((project / ".gpulint_cache" / "runs").glob("*.json"))
    return warm[:3]


ARGS = ("--output-format", "concise", "--select", "GPU011")


def test_unchanged_inputs_are_replayed_without_libcst(project):
    warm = recorded(project, *ARGS)
    assert warm[0] == 1 and "train.py:3:9: GPU011" in warm[1]
    replayed = check(project, *ARGS)
    assert replayed[3], "the replay imported libcst"
    assert replayed[:3] == warm
    heavy = {"argparse", "rich", "torch", "gpulint.config", "gpulint.registry", "gpulint.rule", "gpulint.runner",
             "gpulint.analysis", "gpulint.engine", "gpulint.rules"}
    assert not heavy & set(MODULES[ARGS]), heavy & set(MODULES[ARGS])


def test_a_different_command_line_is_not_replayed(project):
    recorded(project, *ARGS)
    other = check(project, *ARGS, "-q")
    assert not other[3] and "Found" not in other[1]


@pytest.mark.parametrize("change", ["edit", "same_size_edit", "new_file", "config", "gitignore", "removed"])
def test_a_changed_input_runs_for_real(project, change):
    recorded(project, *ARGS)
    train = project / "train.py"
    if change == "edit":
        train.write_text("# moved\n" + GOOD)
        expected = "train.py:4:9: GPU011"
    elif change == "same_size_edit":  # same size, and the old modification time put back
        info = train.stat()
        train.write_text(GOOD.replace("x = x.to", "y = x.to"))
        os.utime(train, ns=(info.st_atime_ns, info.st_mtime_ns))
        expected = "train.py:3:9: GPU011"
    elif change == "new_file":
        (project / "pkg" / "loop.py").write_text(GOOD)
        expected = "loop.py:3:9: GPU011"
    elif change == "config":
        (project / "pyproject.toml").write_text("[tool.gpulint]\nextend-exclude = ['train.py']\n")
        expected = "All checks passed"
    elif change == "gitignore":
        (project / ".gitignore").write_text("train.py\n")
        expected = "All checks passed"
    else:
        train.unlink()
        expected = "All checks passed"
    result = check(project, *ARGS)
    assert not result[3], f"{change}: replayed a stale run"
    assert expected in result[1], (change, result)
    if change == "same_size_edit":
        assert "y = x.to" in train.read_text() and result[1].count("GPU011") == 1


def test_an_environment_variable_the_run_read_counts(project):
    recorded(project, "--select", "GPU011")
    assert check(project, "--select", "GPU011")[3]
    result = check(project, "--select", "GPU011", env={"GPULINT_OUTPUT_FORMAT": "json"})
    assert not result[3] and json.loads(result[1])[0]["code"] == "GPU011"


def test_runs_that_write_or_skip_the_cache_are_not_recorded(project):
    recorded(project, *ARGS)
    runs = project / ".gpulint_cache" / "runs"
    before = sorted(p.name for p in runs.iterdir())
    for extra in (["--no-cache"], ["-o", "report.txt"], ["--verbose"], ["--statistics", "--no-cache"]):
        for _ in range(2):
            assert not check(project, *ARGS, *extra)[3], extra
    assert sorted(p.name for p in runs.iterdir()) == before
    assert not check(project, *ARGS, env={"GPULINT_NO_CACHE": "1"})[3]


def test_a_damaged_recording_is_ignored(project):
    recorded(project, *ARGS)
    for recording in (project / ".gpulint_cache" / "runs").glob("*.json"):
        recording.write_text('{"format": 1, "argv": 3}')
    result = check(project, *ARGS)
    assert not result[3] and "train.py:3:9: GPU011" in result[1] and "Traceback" not in result[2]
