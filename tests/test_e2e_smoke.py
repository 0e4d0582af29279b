"""Smoke test of the end-to-end benchmark runner on the CPU: tiny sizes, one script, one round. It copies the
script, fixes the copy with gpulint (unsafe fixes included), runs original / fixed / hand and checks the losses."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

torch = pytest.importorskip("torch")


def test_e2e_runner_cpu_small(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "e2e" / "run.py"), "--device", "cpu", "--small", "--rounds", "1",
         "--scripts", "llm", "--save-fixed", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| llm |" in result.stdout and "geometric mean" in result.stdout
    diff = (tmp_path / "llm.diff").read_text()
    assert "scaled_dot_product_attention" in diff  # GPU030 rewrote the matmul/masked_fill/softmax attention
