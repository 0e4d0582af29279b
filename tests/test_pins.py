"""Fixes that need a newer torch stay off for projects whose requirement files pin an older one."""

import textwrap
from pathlib import Path

import pytest

from gpulint import pins
from gpulint.diagnostics import Safety
from gpulint.engine import lint_text
from gpulint.pins import torch_admitted_below, torch_pinned_below
from gpulint.registry import rule_by_code
from gpulint.runner import run


@pytest.mark.parametrize(("name", "text", "below_2_1", "below_2_0"), [
    ("requirements.txt", "numpy\ntorch==2.0.1\n", True, False),
    ("requirements-dev.txt", "torch<2.1\n", True, False),
    ("setup.py", 'setup(install_requires=["numpy", "torch==1.7.0"])\n', True, True),
    ("environment.yml", "dependencies:\n  - python=3.8\n  - pytorch=1.7.0\n", True, True),
    ("pyproject.toml", 'dependencies = ["torch>=2.0"]\n', False, False),  # a lower bound pins nothing
    ("pyproject.toml", '[tool.poetry.dependencies]\ntorch = ">=1.10.1, < 1.13.0"\n', True, True),
    ("requirements.txt", "torch>=1.8,<2.1; python_version >= '3.8'\n", True, False),
    ("requirements.txt", "torchvision==0.8.0\n", False, False),
])
def test_pins_are_read_from_requirement_files(tmp_path: Path, name, text, below_2_1, below_2_0):
    (tmp_path / ".git").mkdir()
    (tmp_path / name).write_text(text)
    source = tmp_path / "src" / "train.py"
    source.parent.mkdir()
    source.write_text("import torch\n")
    assert torch_pinned_below(str(source), (2, 1)) is below_2_1
    assert torch_pinned_below(str(source), (2, 0)) is below_2_0


TRAIN = textwrap.dedent("""
    import torch
    model = Net().cuda()
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.cuda.amp.GradScaler()

    def attention(q, k, v):
        return ((q @ k.transpose(-2, -1)) * 0.125).softmax(-1) @ v
""")


def _findings(tmp_path: Path, pin: str | None) -> dict[str, bool]:
    """code -> whether its finding carries a fix, for TRAIN in a project pinning `pin`."""
    (tmp_path / ".git").mkdir()
    if pin:
        (tmp_path / "requirements.txt").write_text(f"torch=={pin}\n")
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    rules = [rule_by_code(code) for code in ("GPU022", "GPU030", "GPU032")]
    found: dict[str, bool] = {}
    for d in lint_text(TRAIN, str(path), rules).diagnostics:
        found[f"{d.code}@{d.line}"] = d.fix is not None
    return found


def test_unpinned_project_gets_every_fix(tmp_path: Path):
    assert _findings(tmp_path, None) == {"GPU032@4": True, "GPU032@5": True, "GPU022@6": True, "GPU030@9": True}


def test_torch_2_0_has_no_fused_sgd_nor_sdpa_scale(tmp_path: Path):
    # SGD's `fused=` arrived in 2.2 (not reported below it: the catalog's do-not-fire case), SDPA's `scale=` in 2.1;
    # `torch.cuda.amp` is the API of torch < 2.3
    assert _findings(tmp_path, "2.0.1") == {"GPU032@4": True, "GPU030@9": False}


def test_torch_1_x_has_neither_fused_optimizers_nor_sdpa(tmp_path: Path):
    # no `fused=` to turn on: the optimizers are not reported; the hand-written attention is still worth knowing
    # about, reported with the pin as the reason for no fix
    assert _findings(tmp_path, "1.13.1") == {"GPU030@9": False}


@pytest.mark.parametrize(("text", "admitted"), [
    ("torch>=1.7.0\n", "torch>=1.7.0"),
    ("torch>=2.4\n", None),
    ("torch==2.3.1\n", None),
    ("torch~=2.1\n", "torch~=2.1"),
    ("torch\n", None),  # a bare requirement says nothing
])
def test_lower_bounds_below_an_api_are_found(tmp_path: Path, text, admitted):
    (tmp_path / ".git").mkdir()
    (tmp_path / "requirements.txt").write_text(text)
    (tmp_path / "train.py").write_text("import torch\n")
    assert torch_admitted_below(str(tmp_path / "train.py"), (2, 3)) == admitted


def test_amp_fix_is_unsafe_where_the_project_admits_an_older_torch(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "requirements.txt").write_text("torch>=1.7.0\n")
    (tmp_path / "train.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    [finding] = run([str(tmp_path / "train.py")], [rule_by_code("GPU022")], jobs=1).diagnostics
    assert finding.fix is not None and finding.fix.safety is Safety.UNSAFE
    assert "torch>=1.7.0" in (finding.note or "")
    (tmp_path / "requirements.txt").write_text("torch>=2.4\n")
    pins._torch_specs.cache_clear()  # requirement files are read once per run
    [finding] = run([str(tmp_path / "train.py")], [rule_by_code("GPU022")], jobs=1).diagnostics
    assert finding.fix is not None and finding.fix.safety is Safety.SAFE


PRECISION_TRAIN = textwrap.dedent("""
    import torch
    import torch.nn as nn

    batch_size = 512
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1000):
        x = torch.randn(batch_size, 1024, device="cuda")
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
""")


@pytest.mark.parametrize(("pin", "expected"), [
    (None, {"GPU020": True, "GPU023": True}),
    ("1.9.0", {"GPU023": False}),  # 1.7-1.11 ran matmuls in TF32 by default; no torch.autocast before 1.10
    ("1.5.0", {"GPU020": False, "GPU023": False}),  # no TF32 at all: reported, upgrade first
])
def test_precision_findings_name_an_old_pin_instead_of_fixing(tmp_path: Path, pin, expected):
    (tmp_path / ".git").mkdir()
    if pin:
        (tmp_path / "requirements.txt").write_text(f"torch=={pin}\n")
    path = tmp_path / "train.py"
    path.write_text(PRECISION_TRAIN)
    found = {d.code: d.fix is not None
             for d in lint_text(PRECISION_TRAIN, str(path), [rule_by_code("GPU020"), rule_by_code("GPU023")]).diagnostics}
    assert found == expected
    notes = [d.note or "" for d in lint_text(PRECISION_TRAIN, str(path), [rule_by_code("GPU023")]).diagnostics]
    assert all("upgrade torch" in note for note in notes) is bool(pin)


@pytest.mark.parametrize(("code", "believed"), [
    ("from torch.cuda.amp import GradScaler, autocast\n", False),  # needs torch 1.6: a 1.4 pin is stale
    ("import torch\nmodel = torch.compile(model)\n", False),
    ("import torch\nloader = DataLoader(data, num_workers=4, persistent_workers=True)\n", False),
    ("try:\n    from torch.cuda.amp import autocast\nexcept ImportError:\n    autocast = None\n", True),  # guarded
    ("import torch\nif hasattr(torch, 'compile'):\n    model = torch.compile(model)\n", True),
    ("import torch\nx = torch.zeros(3).cuda()\n", True),  # nothing newer than the pin
])
def test_a_pin_older_than_the_code_is_not_believed(tmp_path: Path, code, believed):
    (tmp_path / ".git").mkdir()
    (tmp_path / "requirements.txt").write_text("pytorch=1.4.0=py3.7_cuda10.1.243_cudnn7.6.3_0\n")
    (tmp_path / "model.py").write_text(code)
    (tmp_path / "train.py").write_text("import torch\n")
    assert torch_pinned_below(str(tmp_path / "train.py"), (1, 7)) is believed
