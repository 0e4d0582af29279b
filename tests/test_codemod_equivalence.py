"""The structural codemods (GPU004, GPU070) keep what the code computes.

Each fixture is an importable module; its `.fixed.py` golden is what `gpulint fix --unsafe-fixes` makes of it.
Both are imported and run on the same random inputs with the same weights: outputs (eval mode) and
gradients must match within the catalog's tolerances, and the GPU004 rewrite must remove the graph breaks.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import numpy as np  # the test extra installs numpy and torch: these tests must run, never skip
import torch

from gpulint.diagnostics import Safety
from gpulint.fixer import fix_text
from gpulint.registry import rule_by_code

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FP32 = {"rtol": 1e-5, "atol": 1e-6}  # catalog: GPU070 EQ(rtol 1e-5, atol 1e-6); GPU004 fp32 1e-6 relative
FP64 = {"rtol": 1e-12, "atol": 1e-12}


def _load(code: str, stem: str, fixed: bool):
    path = FIXTURES / code / (f"{stem}.fixed.py" if fixed else f"{stem}.py")
    name = f"_equivalence_{code}_{stem}_{'fixed' if fixed else 'original'}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _pair(code: str, stem: str):
    return _load(code, stem, False), _load(code, stem, True)


def _twins(factory, dtype=torch.float32):
    """The same network twice (original and fixed class), with identical weights."""
    torch.manual_seed(0)
    original = factory(False).to(dtype)
    fixed = factory(True).to(dtype)
    fixed.load_state_dict(original.state_dict())
    return original, fixed


def _assert_close(a, b, tol):
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_close(x, y, tol)
        return
    if isinstance(a, np.ndarray):
        np.testing.assert_allclose(a, b, rtol=tol["rtol"], atol=tol["atol"])
        return
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    assert torch.allclose(a, b, equal_nan=True, **tol), (a - b).abs().nan_to_num(0, 0, 0).max()


def test_goldens_are_what_the_fixer_produces():
    for code, stem in (("GPU004", "card_policy_value_net"), ("GPU070", "ppo_update"), ("GPU070", "selfplay_trainer")):
        source = (FIXTURES / code / f"{stem}.py").read_text(encoding="utf-8")
        outcome = fix_text(source, f"{stem}.py", [rule_by_code(code)], min_safety=Safety.UNSAFE)
        assert outcome.error is None
        assert outcome.text != source
        assert outcome.text == (FIXTURES / code / f"{stem}.fixed.py").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# GPU004: card-set encoder and policy-value net

def _card_inputs(batch, slots, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    mod = _load("GPU004", "card_policy_value_net", False)
    cards = torch.randn(batch, slots, mod.CARD_FEATURES, generator=gen, dtype=dtype)
    lengths = torch.randint(0, slots + 1, (batch,), generator=gen)
    lengths[0] = 0  # an empty set
    lengths[-1] = slots if batch > 1 else 0  # and a full one
    pad = torch.arange(slots)[None, :] >= lengths[:, None]
    cards = cards.masked_fill(pad[..., None], 0.0)  # padded slots hold zeros, as a real encoder would see
    return cards, pad


def _net_inputs(batch, dtype=torch.float32, seed=2):
    mod = _load("GPU004", "card_policy_value_net", False)
    gen = torch.Generator().manual_seed(seed)
    hand, hand_pad = _card_inputs(batch, mod.MAX_HAND, dtype, seed)
    table, table_pad = _card_inputs(batch, mod.MAX_TABLE, dtype, seed + 10)
    context = torch.rand(batch, mod.CONTEXT, generator=gen, dtype=dtype)
    context[:, 0] = (torch.rand(batch, generator=gen) > 0.5).to(dtype)
    action_mask = torch.rand(batch, mod.NUM_ACTIONS, generator=gen) > 0.3
    action_mask[:, 0] = True
    return hand, hand_pad, table, table_pad, context, action_mask


@pytest.mark.parametrize("dtype, tol", [(torch.float32, FP32), (torch.float64, FP64)], ids=["fp32", "fp64"])
@pytest.mark.parametrize("batch", [1, 7, 16])
def test_gpu004_encoder_matches_in_eval_mode(dtype, tol, batch):
    original_mod, fixed_mod = _pair("GPU004", "card_policy_value_net")
    original, fixed = _twins(lambda f: (fixed_mod if f else original_mod).CardSetEncoder(), dtype)
    original.eval(), fixed.eval()
    cards, pad = _card_inputs(batch, original_mod.MAX_HAND, dtype)
    with torch.no_grad():
        _assert_close(original(cards, pad), fixed(cards, pad), tol)


def test_gpu004_encoder_all_rows_empty_and_none_empty():
    original_mod, fixed_mod = _pair("GPU004", "card_policy_value_net")
    original, fixed = _twins(lambda f: (fixed_mod if f else original_mod).CardSetEncoder())
    original.eval(), fixed.eval()
    cards = torch.randn(5, original_mod.MAX_HAND, original_mod.CARD_FEATURES)
    for pad in (torch.ones(5, original_mod.MAX_HAND, dtype=torch.bool),
                torch.zeros(5, original_mod.MAX_HAND, dtype=torch.bool)):
        with torch.no_grad():
            _assert_close(original(cards, pad), fixed(cards, pad), FP32)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, FP32), (torch.float64, FP64)], ids=["fp32", "fp64"])
def test_gpu004_policy_value_net_matches_in_eval_mode(dtype, tol):
    original_mod, fixed_mod = _pair("GPU004", "card_policy_value_net")
    original, fixed = _twins(lambda f: (fixed_mod if f else original_mod).PolicyValueNet(), dtype)
    original.eval(), fixed.eval()
    inputs = _net_inputs(12, dtype)
    with torch.no_grad():
        _assert_close(original(*inputs), fixed(*inputs), tol)


def test_gpu004_gradients_match_and_stay_finite():
    """Training mode (the encoder has no dropout): parameter and input gradients equal, none NaN, although
    empty sets are now run through attention too (the double-where guard keeps them finite)."""
    original_mod, fixed_mod = _pair("GPU004", "card_policy_value_net")
    original, fixed = _twins(lambda f: (fixed_mod if f else original_mod).PolicyValueNet(), torch.float64)
    grads = []
    for net in (original, fixed):
        net.train()
        hand, hand_pad, table, table_pad, context, action_mask = _net_inputs(9, torch.float64)
        hand.requires_grad_(True)
        log_pi, value, bids = net(hand, hand_pad, table, table_pad, context, action_mask)
        gen = torch.Generator().manual_seed(5)
        weights = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in (log_pi, value, bids)]
        loss = sum((torch.where(torch.isfinite(t), t, 0) * w).sum() for t, w in zip((log_pi, value, bids), weights))
        loss.backward()
        grads.append([hand.grad] + [p.grad for p in net.parameters()])
    for a, b in zip(*grads):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.isfinite(b).all()
            _assert_close(a, b, FP64)


def _graph_breaks(fn, *args) -> int:
    import torch._dynamo as dynamo

    dynamo.reset()
    explanation = dynamo.explain(fn)(*args)
    return max(explanation.graph_break_count, len(explanation.break_reasons))


def test_gpu004_graph_breaks_before_and_after():
    original_mod, fixed_mod = _pair("GPU004", "card_policy_value_net")
    original, fixed = _twins(lambda f: (fixed_mod if f else original_mod).PolicyValueNet())
    original.eval(), fixed.eval()
    inputs = _net_inputs(8)
    with torch.no_grad():
        before = _graph_breaks(original, *inputs)
        after = _graph_breaks(fixed, *inputs)
    assert before > 0
    assert after == 0


# ---------------------------------------------------------------------------------------------
# GPU070: PPO update and self-play evaluation

class _Batch:
    def __init__(self, obs_dim, num_actions, n, seed):
        gen = torch.Generator().manual_seed(seed)
        self.obs = torch.randn(n, obs_dim, generator=gen)
        self.next_obs = torch.randn(n, obs_dim, generator=gen)
        self.rewards = torch.randn(n, generator=gen)
        self.dones = (torch.rand(n, generator=gen) > 0.9).float()
        self.actions = torch.randint(0, num_actions, (n,), generator=gen)
        self.logprobs = -torch.rand(n, generator=gen)


def _ppo_twins():
    original_mod, fixed_mod = _pair("GPU070", "ppo_update")
    agents = []
    for mod in (original_mod, fixed_mod):
        torch.manual_seed(0)
        agents.append(mod.SeatPPO(obs_dim=24, num_actions=6, epochs=3, device="cpu"))
    return agents


def test_gpu070_ppo_returns_match():
    original, fixed = _ppo_twins()
    batch = _Batch(24, 6, 33, seed=3)
    _assert_close(original.returns(batch), fixed.returns(batch), FP32)


def test_gpu070_ppo_update_matches():
    """Seats with different batch sizes; after three epochs of Adam the parameters agree."""
    original, fixed = _ppo_twins()
    seat0, seat1 = _Batch(24, 6, 40, seed=4), _Batch(24, 6, 17, seed=5)
    original.update(seat0, seat1)
    fixed.update(seat0, seat1)
    for a, b in zip([*original.actor.parameters(), *original.critic.parameters()],
                    [*fixed.actor.parameters(), *fixed.critic.parameters()]):
        _assert_close(a.detach(), b.detach(), {"rtol": 1e-4, "atol": 1e-6})


class _FakeGame:
    """Stands in for the card game: a random observation per seat that changes with the moves played."""

    def __init__(self, seed, obs_dim):
        self.rng = np.random.default_rng(seed)
        self.obs = self.rng.standard_normal((2, obs_dim)).astype(np.float32)
        self.moves = []

    def encode(self, seat):
        return self.obs[seat].copy()

    def step(self, a0, a1):
        self.moves.append((int(a0), int(a1)))
        self.obs = np.roll(self.obs, int(a0) + int(a1), axis=1) * np.float32(0.9)


def test_gpu070_selfplay_generate_matches():
    original_mod, fixed_mod = _pair("GPU070", "selfplay_trainer")
    trainers = []
    for mod in (original_mod, fixed_mod):
        torch.manual_seed(0)
        trainer = mod.SelfPlayTrainer([_FakeGame(i, mod.OBS_DIM) for i in range(6)])
        trainer.net.to("cpu")
        mod.DEVICE = torch.device("cpu")
        trainers.append(trainer)
    trainers[1].net.load_state_dict(trainers[0].net.state_dict())
    # BatchNorm running statistics that are not the defaults, so eval mode matters
    for trainer in trainers:
        trainer.net.train()
        with torch.no_grad():
            trainer.net(torch.randn(64, original_mod.OBS_DIM) * 3 + 1)
    trainers[1].net.load_state_dict(trainers[0].net.state_dict())
    records = [t.generate(num_moves=5) for t in trainers]
    for (s0, s1, v0, v1), (t0, t1, w0, w1) in zip(*records):
        _assert_close(list(s0), list(t0), FP32)
        _assert_close(list(s1), list(t1), FP32)
        _assert_close(v0, w0, FP32)
        _assert_close(v1, w1, FP32)
    assert [g.moves for g in trainers[0].games] == [g.moves for g in trainers[1].games]


def test_gpu070_batchnorm_training_step_was_not_rewritten():
    """The training step runs a BatchNorm net in training mode on two batches: reported, never fixed."""
    original = (FIXTURES / "GPU070" / "selfplay_trainer.py").read_text(encoding="utf-8")
    fixed = (FIXTURES / "GPU070" / "selfplay_trainer.fixed.py").read_text(encoding="utf-8")
    line = "        mirrored_logits, mirrored_value = self.net(mirrored_obs)\n"
    assert line in original and line in fixed


# ---------------------------------------------------------------------------------------------
# GPU076: per-leaf evaluation of a tree search, replayed from a CUDA graph

class _Position:
    def __init__(self, seed):
        self.board = np.random.default_rng(seed).integers(-1, 2, size=(6, 7))

    def planes(self):
        return np.stack([self.board == 1, self.board == -1]).astype(np.float32)


def test_gpu076_cpu_run_is_unchanged_and_the_helper_keeps_grad_mode_and_outputs():
    """On the CPU (no CUDA inputs) the added helper runs the network as before: a script that ran on the CPU
    still does, with the same priors and values; under grad mode it returns the network's own outputs."""
    original_mod, fixed_mod = _pair("GPU076", "tree_search")
    torch.manual_seed(0)
    net = original_mod.PolicyValueNet().eval()
    cpu = torch.device("cpu")
    for seed in range(4):
        position = _Position(seed)
        priors, value = original_mod.evaluate(net, position, cpu)
        fixed_priors, fixed_value = fixed_mod.evaluate(net, position, cpu)
        np.testing.assert_array_equal(priors, fixed_priors)
        assert value == fixed_value
    x = torch.from_numpy(_Position(9).planes()).unsqueeze(0)
    logits, value = fixed_mod.cuda_graph_inference(net, x)
    assert logits.requires_grad and value.requires_grad  # grad mode on: the network ran as written
    assert not fixed_mod._CUDA_GRAPHS  # nothing captured on the CPU
