"""GPU014's two remedies for a model moved CPU <-> GPU every episode, timed per episode on one GPU.

    python benchmarks/pingpong_remedies.py [--out results.md]

A PPO-shaped rollout (N vectorised environments, an actor and a critic MLP of width H, 128 steps) as the
original writes it (`actor.to("cpu")` and `critic.to("cpu")` before the rollout, `.to("cuda")` after it) and as
the two remedies write it:

- replica: CPU copies of both models, refreshed with `load_state_dict` once per episode; the rollout runs on them;
- gpu: the rollout runs the GPU models (one batched forward over the N environments per step: observations
  copied in, the sampled actions read back every step).

Each episode also runs one optimizer step on the GPU models, so the ping-pong's moves really move weights
that were just updated. Median of 7 episodes after 2 warm-up episodes, wall clock, synchronized.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

from results_table import emit  # benchmarks/, the script's own folder

HORIZON, OBS, ACTIONS = 128, 8, 5


def mlp(width: int, out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(OBS, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, out))


def env_step(obs: np.ndarray, actions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return (obs * 0.9 + 0.1 * rng.standard_normal(obs.shape) + actions[:, None] * 0.01).astype(np.float32)


def rollout_cpu(actor: nn.Module, critic: nn.Module, obs: np.ndarray, rng: np.random.Generator) -> float:
    total = 0.0
    for _ in range(HORIZON):
        o = torch.from_numpy(obs)
        with torch.no_grad():
            logits, value = actor(o), critic(o)
        action = Categorical(logits=logits, validate_args=False).sample().numpy()
        total += float(value.numpy().sum())
        obs = env_step(obs, action, rng)
    return total


def rollout_gpu(actor: nn.Module, critic: nn.Module, obs: np.ndarray, rng: np.random.Generator) -> float:
    total = torch.zeros((), device="cuda")
    for _ in range(HORIZON):
        o = torch.from_numpy(obs).to("cuda", non_blocking=True)
        with torch.no_grad():
            logits, value = actor(o), critic(o)
        action = Categorical(logits=logits, validate_args=False).sample().cpu().numpy()  # the env needs it now
        total += value.sum()
        obs = env_step(obs, action, rng)
    return float(total)


def update(actor: nn.Module, critic: nn.Module, optimizer: torch.optim.Optimizer, n: int) -> None:
    x = torch.randn(n, OBS, device="cuda")
    loss = actor(x).logsumexp(-1).mean() + critic(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def episode(variant: str, models: dict, n: int, rng: np.random.Generator) -> float:
    actor, critic, optimizer = models["actor"], models["critic"], models["optimizer"]
    obs = rng.standard_normal((n, OBS)).astype(np.float32)
    torch.cuda.synchronize()
    start = time.perf_counter()
    if variant == "pingpong":
        actor.to("cpu")
        critic.to("cpu")
        rollout_cpu(actor, critic, obs, rng)
        actor.to("cuda")
        critic.to("cuda")
    elif variant == "replica":
        models["actor_cpu"].train(actor.training).load_state_dict(actor.state_dict())
        models["critic_cpu"].train(critic.training).load_state_dict(critic.state_dict())
        rollout_cpu(models["actor_cpu"], models["critic_cpu"], obs, rng)
    else:
        rollout_gpu(actor, critic, obs, rng)
    update(actor, critic, optimizer, n)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000


def measure(n: int, width: int) -> dict[str, float]:
    results = {}
    for variant in ("pingpong", "replica", "gpu"):
        torch.manual_seed(0)
        actor, critic = mlp(width, ACTIONS).cuda(), mlp(width, 1).cuda()
        models = {"actor": actor, "critic": critic,
                  "optimizer": torch.optim.Adam(list(actor.parameters()) + list(critic.parameters()), lr=3e-4),
                  "actor_cpu": copy.deepcopy(actor).cpu(), "critic_cpu": copy.deepcopy(critic).cpu()}
        rng = np.random.default_rng(0)
        times = [episode(variant, models, n, rng) for _ in range(9)][2:]
        results[variant] = statistics.median(times)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads; "
             f"ms per episode ({HORIZON} steps + one update), median of 7",
             "", "| envs | width | ping-pong | CPU replica | GPU rollout | replica vs ping-pong | winner |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for n, width in ((16, 64), (64, 256), (64, 1024), (1024, 256), (1024, 1024), (4096, 1024)):
        r = measure(n, width)
        winner = min(("CPU replica", r["replica"]), ("GPU rollout", r["gpu"]), key=lambda kv: kv[1])[0]
        lines.append(f"| {n} | {width} | {r['pingpong']:.2f} | {r['replica']:.2f} | {r['gpu']:.2f} | "
                     f"x{r['pingpong'] / r['replica']:.2f} | {winner} |")
        print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
