"""Per-site verification: the user's own original and rewritten statement, run on synthetic tensors."""

import json
import subprocess
import sys

import pytest

from gpulint import cli
from gpulint.site_check import check_site
from gpulint.verify import check_sites

MODULE = "import math\nimport torch\nimport torch.nn.functional as F\n"


@pytest.mark.parametrize("original, rewritten", [
    ("x[mask] = 0", "x.masked_fill_(mask.reshape(mask.shape + (1,) * (x.dim() - mask.dim())), 0)"),
    ("labels[labels == pad_id] = -100", "labels.masked_fill_(labels == pad_id, -100)"),
    ("y = x[mask].sum()", "y = (x * mask.reshape(mask.shape + (1,) * (x.dim() - mask.dim()))).sum()"),
    ("torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v",
     "F.scaled_dot_product_attention(q, k, v)"),
    ("batch['input_ids'].to(device)", "batch['input_ids'].to(device, non_blocking=True)"),
    ("torch.zeros((steps, envs) + (dim,)).to(device)", "torch.zeros((steps, envs) + (dim,), device=device)"),
])
def test_equivalent_rewrites_are_verified_on_the_users_code(original, rewritten):
    result = check_site(original, rewritten, 9, MODULE)
    assert result.status == "equal", result


@pytest.mark.parametrize("original, rewritten, why", [
    ("x[mask] = 0", "x.masked_fill_(~mask, 0)", "`x` differs"),
    # A row mask on a 2-D tensor: the naive in-place fill does not broadcast, the original does.
    ("x[mask] = 0", "x.masked_fill_(mask, 0)", "masks of shape (4,)"),
    ("torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v", "F.scaled_dot_product_attention(q, k, v)", "differs"),
])
def test_wrong_rewrites_are_caught_on_the_users_code(original, rewritten, why):
    result = check_site(original, rewritten, 9, MODULE)
    assert result.status == "differs" and why in result.reason, result


@pytest.mark.parametrize("original, why", [
    ("torch.save(x, 'checkpoint.pt')", "torch.save"),
    ("open('f').write('x')", "open()"),
    ("self.proj(x)", "self"),
    ("helper(x)", "helper()"),
    ("import os", "import"),
    ("for i in range(10 ** 9):\n    x = x + i", "for"),
    ("x.__class__", "__class__"),
    ("np.where(x)", "np"),
    ("torch.cuda.synchronize()", "torch.cuda.synchronize"),
])
def test_unsafe_sites_fall_back_to_the_rules_check(original, why):
    module = MODULE + "import numpy as np\ndef helper(x):\n    open('touched', 'w')\n"
    result = check_site(original, "x", 1, module)
    assert result.status == "fallback" and why in result.reason, result


def test_no_user_code_runs_even_when_a_name_is_unknown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = check_site("y = x + undefined_name(1)", "y = x", 1, MODULE)
    assert result.status == "fallback" and not list(tmp_path.iterdir())


def test_sites_request_as_written_by_fix_apply(tmp_path):
    request = tmp_path / "sites.json"
    site = {"code": "GPU003", "path": "train.py", "column": 5, "imports": []}
    request.write_text(json.dumps({"files": {"train.py": MODULE}, "sites": [
        {**site, "original": "att[pad] = 0.0", "rewritten": "att.masked_fill_(pad, 0.0)"},
        {**site, "original": "att[pad] = 0.0", "rewritten": "att.masked_fill_(~pad, 0.0)"},
    ]}))
    assert [r["status"] for r in check_sites(str(request), "cpu")] == ["differs", "differs"]


def _in_process_verify(command, **kwargs):
    """`gpulint verify ...` without a second interpreter: the real checker, stdout captured."""
    import contextlib
    import io

    from gpulint.verify import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(command[command.index("verify") + 1:])
    return subprocess.CompletedProcess(command, code, out.getvalue(), "")


def test_fix_apply_skips_a_site_whose_rewrite_disagrees(tmp_path, monkeypatch, capsys):
    """The rule's own check passes, but this site's rewrite is wrong: the site is left as it was."""
    from gpulint import site_check

    path = tmp_path / "train.py"
    source = ("import torch\ndevice = 'cuda'\nfor x, y in loader:\n    x = x.to(device)\n"
              "    x.sum().backward()\n    opt.step()\n")
    path.write_text(source)
    real = site_check.check_site

    def rewrite_is_wrong(original, rewritten, *args, **kwargs):
        return real(original, rewritten.replace("x.to(device", "(x + 1).to(device"), *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", _in_process_verify)  # (cli imports subprocess lazily)
    monkeypatch.setattr(site_check, "check_site", rewrite_is_wrong)
    code = cli.main(["fix", "--apply", "--select", "GPU011", "--no-cache", str(path)])
    err = capsys.readouterr().err
    assert path.read_text() == source and code == 1
    assert "GPU011 fix not applied" in err and "`__value__` differs" in err


def test_fix_apply_verifies_sites_in_a_separate_process(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\ndevice = 'cuda'\nfor x, y in loader:\n    x = x.to(device)\n"
                    "    x.sum().backward()\n    opt.step()\n")
    completed = subprocess.run([sys.executable, "-m", "gpulint", "fix", "--apply", "--select", "GPU011",
                                "--no-cache", "-v", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert "1 of 1 rewritten sites verified on their own code" in completed.stderr, completed.stderr
    assert "x.to(device, non_blocking=True)" in path.read_text()


@pytest.mark.parametrize("original", ["torch.zeros(10 ** 9).to(device)", "x = sum(range(10 ** 12))",
                                      "x = 9 ** 999999999", "torch.ones(1 << 40).cuda()"])
def test_sizes_that_would_exhaust_memory_or_time_are_not_run(original):
    assert check_site(original, "x", 1, MODULE).status == "fallback"
