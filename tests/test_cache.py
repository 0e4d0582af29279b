"""The results cache: unchanged files are not linted again; any relevant change invalidates."""

import pytest

from gpulint import runner
from gpulint.registry import rule_by_code

TRAIN = "import torch\nfor x, y in loader:\n    x = x.to('cuda')\n    x.sum().backward()\n    opt.step()\n"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "model.py").write_text("import torch\n")
    return tmp_path


def _run(project, rules=("GPU011",), **kwargs):
    return runner.run([str(project)], [rule_by_code(c) for c in rules], cache_dir=project / ".gpulint_cache",
                      **kwargs)


def test_warm_run_does_not_lint_unchanged_files(project, monkeypatch):
    cold = _run(project)
    assert [d.code for d in cold.diagnostics] == ["GPU011"]

    def no_lint(*args, **kwargs):
        raise AssertionError("a cached file was linted again")

    monkeypatch.setattr(runner, "_run_file", no_lint)
    warm = _run(project)
    assert warm.diagnostics == cold.diagnostics


def test_changed_file_settings_or_program_invalidate(project, monkeypatch):
    _run(project)
    linted = []
    real = runner._run_file
    monkeypatch.setattr(runner, "_run_file", lambda shown, *a, **k: linted.append(shown) or real(shown, *a, **k))
    (project / "train.py").write_text("# edited\n" + TRAIN)
    _run(project)
    assert [p.endswith("train.py") for p in linted] == [True]
    linted.clear()
    _run(project, rule_options={"GPU011": {"unused": 1}})  # other settings: everything again
    assert len(linted) == 2
    linted.clear()
    # program facts changed (a new nn.Module class elsewhere): every file's result may change
    (project / "model.py").write_text("import torch\nclass Net(torch.nn.Module):\n    pass\n")
    _run(project)
    assert len(linted) == 2


def test_fix_mode_never_uses_stale_results(project):
    _run(project)
    result = _run(project, fix=True)
    assert result.files and any(r.fix and r.fix.changed for r in result.files)


def test_code_fingerprint_covers_every_source_file_of_gpulint():
    from pathlib import Path

    from gpulint.cache import code_files

    root = Path(__file__).resolve().parent.parent
    files = {str(p.resolve()) for p in code_files()}
    for needed in ("gpulint/cli.py", "gpulint/semantic/loaders.py", "gpulint/reporters/text.py",
                   "rules/h2d_copy_blocking.py"):
        assert str((root / needed).resolve()) in files, needed
    assert not any("__pycache__" in f for f in files)


def test_editing_gpulint_invalidates_the_results_cache(tmp_path):
    """A results cache is keyed by gpulint's own code: after a rule or a shared analysis is edited (a development
    checkout), a warm run lints again instead of serving the old findings."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    package = tmp_path / "pkg"
    shutil.copytree(root / "gpulint", package / "gpulint", ignore=shutil.ignore_patterns("__pycache__", "rules"))
    shutil.copytree(root / "rules", package / "gpulint" / "rules", ignore=shutil.ignore_patterns("__pycache__"))
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    env = {"PYTHONPATH": str(package), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"}

    def check() -> str:
        result = subprocess.run([sys.executable, "-m", "gpulint", "check", ".", "--select", "GPU011",
                                 "--output-format", "concise", "-q"], cwd=project, capture_output=True, text=True,
                                env=env, timeout=300)
        assert result.returncode == 1, result.stderr
        return result.stdout

    def cache_files() -> set[str]:
        return {p.name for p in (project / ".gpulint_cache").glob("results-*.json")}

    first = check()
    assert "GPU011" in first and "EDITED" not in first and check() == first and len(cache_files()) == 1
    rule = package / "gpulint" / "rules" / "h2d_copy_blocking.py"
    rule.write_text(rule.read_text().replace("blocks the host", "blocks the host EDITED"))
    assert "EDITED" in check()
    before = cache_files()
    helper = package / "gpulint" / "semantic" / "loaders.py"
    helper.write_text(helper.read_text() + "\n# edited\n")
    check()
    assert cache_files() - before, "editing a shared analysis module did not change the cache key"
