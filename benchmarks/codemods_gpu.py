"""Step time of the structural-codemod fixtures before and after the fix (GPU004, GPU070), on CUDA.

    python benchmarks/codemods_gpu.py [--out benchmarks/results/codemods_gpu.md] [--iters 50]

Imports each fixture and its `.fixed.py` golden, builds both with the same weights, and times the same work
on the same inputs: CUDA events around each call, warm-up runs first, the median of `--iters` runs. Also
prints graph breaks (`torch._dynamo.explain`, any break reason counts) and the largest output difference
between original and fixed, so a speed-up is never reported for code that computes something else.
Standalone: needs torch and numpy, not gpulint.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def load(code: str, stem: str, fixed: bool) -> Any:
    path = FIXTURES / code / (f"{stem}.fixed.py" if fixed else f"{stem}.py")
    name = f"_bench_{code}_{stem}_{int(fixed)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def time_cuda(fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Median milliseconds of `fn()` measured with CUDA events (host time included: syncs count)."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():  # smoke runs on CPU
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_breaks(fn: Callable, *args: Any) -> int:
    import torch._dynamo as dynamo

    dynamo.reset()
    explanation = dynamo.explain(fn)(*args)
    return max(explanation.graph_break_count, len(explanation.break_reasons))


def max_diff(a: Any, b: Any) -> float:
    if isinstance(a, (tuple, list)):
        return max((max_diff(x, y) for x, y in zip(a, b)), default=0.0)
    if isinstance(a, np.ndarray):
        return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) if a.size else 0.0
    diff = (a.double() - b.double()).abs()
    diff = diff.masked_fill(torch.isinf(a) & (a == b), 0.0)
    return float(diff.max()) if diff.numel() else 0.0


# ---------------------------------------------------------------------------------------------
# GPU004: policy-value net with set encoders over padded card slots


def card_inputs(mod: Any, batch: int, device: str, empty_fraction: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def cards(slots: int):
        x = torch.randn(batch, slots, mod.CARD_FEATURES, generator=gen)
        lengths = torch.randint(1, slots + 1, (batch,), generator=gen)
        lengths[torch.rand(batch, generator=gen) < empty_fraction] = 0
        pad = torch.arange(slots)[None, :] >= lengths[:, None]
        return x.masked_fill(pad[..., None], 0.0).to(device), pad.to(device)

    hand, hand_pad = cards(mod.MAX_HAND)
    table, table_pad = cards(mod.MAX_TABLE)
    context = torch.rand(batch, mod.CONTEXT, generator=gen)
    action_mask = torch.rand(batch, mod.NUM_ACTIONS, generator=gen) > 0.3
    action_mask[:, 0] = True
    return hand, hand_pad, table, table_pad, context.to(device), action_mask.to(device)


def gpu004_cases(args: argparse.Namespace) -> list[dict]:
    rows = []
    original_mod, fixed_mod = load("GPU004", "card_policy_value_net", False), load("GPU004", "card_policy_value_net", True)
    torch.manual_seed(0)
    original = original_mod.PolicyValueNet().to(args.device)
    fixed = fixed_mod.PolicyValueNet().to(args.device)
    fixed.load_state_dict(original.state_dict())
    for batch in args.batches:
        inputs = card_inputs(original_mod, batch, args.device, empty_fraction=0.25)
        original.eval(), fixed.eval()
        with torch.no_grad():
            diff = max_diff(original(*inputs), fixed(*inputs))
            before = time_cuda(lambda: original(*inputs), args.warmup, args.iters)
            after = time_cuda(lambda: fixed(*inputs), args.warmup, args.iters)
        rows.append(dict(case=f"GPU004 PolicyValueNet inference, eager, B={batch}", before=before, after=after,
                         diff=diff))

        def train_step(net: Any, optimizer: Any) -> None:
            log_pi, value, bids = net(*inputs)
            loss = -(log_pi.clamp_min(-30.0)[:, 0]).mean() + value.pow(2).mean() + bids.pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        original.train(), fixed.train()
        opt_o = torch.optim.Adam(original.parameters(), lr=0.0)  # lr 0: weights stay equal between runs
        opt_f = torch.optim.Adam(fixed.parameters(), lr=0.0)
        before = time_cuda(lambda: train_step(original, opt_o), args.warmup, args.iters)
        after = time_cuda(lambda: train_step(fixed, opt_f), args.warmup, args.iters)
        rows.append(dict(case=f"GPU004 PolicyValueNet train step (fwd+bwd+Adam), eager, B={batch}", before=before,
                         after=after, diff=None))
    if not args.no_compile:
        batch = args.batches[0]
        inputs = card_inputs(original_mod, batch, args.device, empty_fraction=0.25)
        original.eval(), fixed.eval()
        with torch.no_grad():
            breaks = (graph_breaks(original, *inputs), graph_breaks(fixed, *inputs))
            torch._dynamo.reset()
            compiled_o, compiled_f = torch.compile(original), torch.compile(fixed)
            diff = max_diff(compiled_o(*inputs), compiled_f(*inputs))
            before = time_cuda(lambda: compiled_o(*inputs), args.warmup, args.iters)
            after = time_cuda(lambda: compiled_f(*inputs), args.warmup, args.iters)
        rows.append(dict(case=f"GPU004 PolicyValueNet inference, torch.compile, B={batch}", before=before,
                         after=after, diff=diff, breaks=breaks))
    return rows


# ---------------------------------------------------------------------------------------------
# GPU070: PPO update per seat, self-play evaluation of both seats


class Batch:
    def __init__(self, obs_dim: int, num_actions: int, n: int, device: str, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.obs = torch.randn(n, obs_dim, generator=gen).to(device)
        self.next_obs = torch.randn(n, obs_dim, generator=gen).to(device)
        self.rewards = torch.randn(n, generator=gen).to(device)
        self.dones = (torch.rand(n, generator=gen) > 0.95).float().to(device)
        self.actions = torch.randint(0, num_actions, (n,), generator=gen).to(device)
        self.logprobs = (-torch.rand(n, generator=gen)).to(device)


class FakeGame:
    def __init__(self, seed: int, obs_dim: int) -> None:
        self.obs = np.random.default_rng(seed).standard_normal((2, obs_dim)).astype(np.float32)

    def encode(self, seat: int) -> np.ndarray:
        return self.obs[seat]

    def step(self, a0: int, a1: int) -> None:
        self.obs = np.roll(self.obs, 1, axis=1)


def gpu070_cases(args: argparse.Namespace) -> list[dict]:
    rows = []
    mods = load("GPU070", "ppo_update", False), load("GPU070", "ppo_update", True)
    obs_dim, num_actions = 64, 18
    agents = []
    for mod in mods:
        torch.manual_seed(0)
        agents.append(mod.SeatPPO(obs_dim, num_actions, lr=0.0, epochs=4, device=args.device))
    for batch in args.batches:
        seat0 = Batch(obs_dim, num_actions, batch, args.device, 1)
        seat1 = Batch(obs_dim, num_actions, batch, args.device, 2)
        with torch.no_grad():
            diff = max_diff(agents[0].returns(seat0), agents[1].returns(seat0))
        before = time_cuda(lambda: agents[0].returns(seat0), args.warmup, args.iters)
        after = time_cuda(lambda: agents[1].returns(seat0), args.warmup, args.iters)
        breaks = (graph_breaks(agents[0].returns, seat0), graph_breaks(agents[1].returns, seat0))
        rows.append(dict(case=f"GPU070 PPO returns (critic on obs and next_obs), B={batch}", before=before,
                         after=after, diff=diff, breaks=breaks))
        before = time_cuda(lambda: agents[0].update(seat0, seat1), args.warmup, args.iters)
        after = time_cuda(lambda: agents[1].update(seat0, seat1), args.warmup, args.iters)
        rows.append(dict(case=f"GPU070 PPO update, 4 epochs, two seats of B={batch}", before=before, after=after,
                         diff=None))
    mods = load("GPU070", "selfplay_trainer", False), load("GPU070", "selfplay_trainer", True)
    trainers = []
    for mod in mods:
        mod.DEVICE = torch.device(args.device)
        torch.manual_seed(0)
        trainers.append(mod.SelfPlayTrainer([FakeGame(i, mod.OBS_DIM) for i in range(args.games)]))
    trainers[1].net.load_state_dict(trainers[0].net.state_dict())
    records = [t.generate(num_moves=2) for t in trainers]
    diff = max(max(max_diff(a[2], b[2]), max_diff(a[3], b[3])) for a, b in zip(*records))
    before = time_cuda(lambda: trainers[0].generate(num_moves=4), args.warmup, max(5, args.iters // 5))
    after = time_cuda(lambda: trainers[1].generate(num_moves=4), args.warmup, max(5, args.iters // 5))
    rows.append(dict(case=f"GPU070 self-play generate, {args.games} games x 4 moves (both seats per move)",
                     before=before, after=after, diff=diff))
    return rows


def render(rows: list[dict], header: str) -> str:
    lines = [header, "", "| case | before (ms) | after (ms) | speed-up | graph breaks before -> after | max abs diff |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    for row in rows:
        breaks = row.get("breaks")
        lines.append(f"| {row['case']} | {row['before']:.3f} | {row['after']:.3f} | x{row['before'] / row['after']:.2f} "
                     f"| {f'{breaks[0]} -> {breaks[1]}' if breaks else ''} "
                     f"| {'' if row['diff'] is None else format(row['diff'], '.2e')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--games", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile case (slow to compile)")
    parser.add_argument("--only", choices=["GPU004", "GPU070"])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: this benchmark times GPU step time (--device cpu for a smoke run)",
              file=sys.stderr)
        return 2
    rows = []
    if args.only in (None, "GPU004"):
        rows += gpu004_cases(args)
    if args.only in (None, "GPU070"):
        rows += gpu070_cases(args)
    card = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (smoke run)"
    header = (f"Measured on {card}, torch {torch.__version__}, "
              f"{datetime.date.today().isoformat()}: median of {args.iters} runs after {args.warmup} warm-up runs "
              f"(`python benchmarks/codemods_gpu.py`).")
    table = render(rows, header)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
