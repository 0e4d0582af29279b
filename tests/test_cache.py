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
