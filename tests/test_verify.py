"""The runtime micro-checks: every fixing rule's check passes on CPU, and a wrong rewrite is caught."""

import subprocess

import pytest

from gpulint import Invalid, MicroCheck, Rule, Safety, Valid
from gpulint.registry import all_rules
from gpulint.verify import failed_checks, fixing_rules, run_check

DOC = """
    ## What it does
    Test rule.
    ## Why is this slow
    ## Example
    ## Use instead
    ## Fix safety
"""


@pytest.mark.parametrize("rule", fixing_rules(all_rules()), ids=lambda r: r.code)
def test_fixing_rule_check_passes_on_cpu(rule):
    result = run_check(rule, "cpu")
    assert result.ok, result
    assert result.equal in (True, None)


def test_every_safe_fixing_rule_has_a_check():
    missing = [r.code for r in all_rules() if r.safety is Safety.SAFE and r.micro_check is None]
    assert missing == []


class WrongMaskFill(Rule):
    """A deliberately wrong rewrite: masks columns instead of rows on a square tensor (catalog F5)."""
    __doc__ = DOC
    code, name, message, fix_title, safety = "GPU995", "wrong-mask-fill", "m", "t", Safety.SAFE
    examples = [Valid("a\n"), Invalid("x\n", fixed="x\n")]
    micro_check = MicroCheck(kinds=("EQ",), setup="x = torch.randn(4, 4)\nm = torch.rand(4) > 0.5",
                             before="y = x.clone()\ny[m] = 0.0", after="y = x.masked_fill(m, 0.0)", compare=("y",))


def test_wrong_rewrite_is_caught_and_demoted():
    result = run_check(WrongMaskFill, "cpu")
    assert not result.ok and result.equal is False
    assert "GPU995" in failed_checks([WrongMaskFill])


def test_graph_breaks_and_syncs_are_counted():
    check = MicroCheck(kinds=("EQ", "GB", "SYNC"), setup="x = torch.randn(64, 8)\nm = torch.rand(64) > 0.5",
                       before="s = x[m].sum()", after="s = x.masked_fill(~m[:, None], 0).sum()",
                       compare=("s",), options={"rtol": 1e-5, "atol": 1e-5})

    class MaskedSum(Rule):
        __doc__ = DOC
        code, name, message, fix_title, safety = "GPU996", "masked-sum", "m", "t", Safety.SAFE
        examples = [Valid("a\n"), Invalid("x\n", fixed="x\n")]
        micro_check = check

    result = run_check(MaskedSum, "cpu")
    assert result.ok, result
    assert result.graph_breaks[0] >= 1 and result.graph_breaks[1] == 0
    assert result.syncs[0] >= 1 and result.syncs[1] == 0


def test_fix_apply_demotes_rules_whose_check_fails(tmp_path, monkeypatch, capsys):
    """`fix --apply` asks `gpulint verify` (a separate process) about the rules it is about to apply; a rule
    reported as failing keeps its findings but its fixes are not written."""
    import json
    import subprocess

    from gpulint import cli

    path = tmp_path / "train.py"
    source = "import torch\nfor x, y in loader:\n    x = x.to('cuda')\n    x.sum().backward()\n    opt.step()\n"
    path.write_text(source)
    asked = []

    def fake_verify(command, **kwargs):
        asked.append(command)
        report = {"rules": [{"code": "GPU011", "ok": False, "error": "outputs differ"}],
                  "sites": [{"status": "equal", "reason": ""}]}
        return subprocess.CompletedProcess(command, 0, json.dumps(report), "")

    monkeypatch.setattr(subprocess, "run", fake_verify)  # (cli imports subprocess lazily)
    code = cli.main(["fix", "--apply", "--select", "GPU011", "--no-cache", str(path)])
    assert asked and "verify" in asked[0] and "GPU011" in asked[0]
    assert path.read_text() == source and code == 1
    assert "GPU011 fixes demoted to suggestions" in capsys.readouterr().err
    assert cli.main(["fix", "--apply", "--no-verify", "--select", "GPU011", "--no-cache", str(path)]) == 0
    assert "non_blocking=True" in path.read_text()


def _rule_with(check: MicroCheck, rule_code: str) -> type[Rule]:
    class Probe(Rule):
        __doc__ = DOC
        code, name, message, fix_title, safety = rule_code, "probe", "m", "t", Safety.SAFE
        examples = [Valid("a\n"), Invalid("x\n", fixed="x\n")]
        micro_check = check

    return Probe


def test_cudagraph_unsafe_nodes_are_counted():
    """catalog F4: `x[m] = -inf` keeps aten.index_put in the AOT graph; masked_fill does not."""
    check = MicroCheck(kinds=("EQ", "CG"), setup="x = torch.randn(4, 5)\nm = torch.rand(4, 5) > 0.5",
                       before="y = x.clone()\ny[m] = float('-inf')", after="y = x.masked_fill(m, float('-inf'))",
                       compare=("y",))
    result = run_check(_rule_with(check, "GPU994"), "cpu")
    assert result.ok and result.cudagraph_unsafe == (1, 0), result


def test_alias_probe_catches_a_rewrite_that_stops_writing_in_place():
    """The original fills the caller's tensor in place; the rewrite rebinds the name, so a view the caller holds
    goes stale. Outputs alone agree; the ALIAS probe does not."""
    check = MicroCheck(kinds=("EQ", "ALIAS"), setup="x = torch.randn(4, 5)\nm = torch.rand(4, 5) > 0.5",
                       before="x[m] = 0.0", after="x = x.masked_fill(m, 0.0)", compare=("x",))
    result = run_check(_rule_with(check, "GPU993"), "cpu")
    assert result.equal is True and not result.ok
    in_place = MicroCheck(kinds=("EQ", "ALIAS"), setup=check.setup, before="x[m] = 0.0",
                          after="x.masked_fill_(m, 0.0)", compare=("x",))
    assert run_check(_rule_with(in_place, "GPU992"), "cpu").ok


def test_train_mode_probe_refuses_a_batch_merge_through_batchnorm():
    """catalog F6: merging two forwards through BatchNorm in train mode changes the batch statistics."""
    merge = dict(before="out_a = net(a)\nout_b = net(b)",
                 after="out_a, out_b = net(torch.cat([a, b])).split([a.shape[0], b.shape[0]])",
                 compare=("out_a", "out_b"), options={"rtol": 1e-5, "atol": 1e-6, "train_probe": True})
    inputs = "\na = torch.randn(7, 16)\nb = torch.randn(5, 16)"
    plain = MicroCheck(kinds=("EQ",), setup="net = nn.Sequential(nn.Linear(16, 8), nn.Tanh()).eval()" + inputs,
                       **merge)
    batchnorm = MicroCheck(kinds=("EQ",), setup="net = nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8)).eval()"
                           + inputs, **merge)
    assert run_check(_rule_with(plain, "GPU991"), "cpu").ok
    result = run_check(_rule_with(batchnorm, "GPU990"), "cpu")
    assert result.equal is True and not result.ok and "train mode" in result.notes[0]
