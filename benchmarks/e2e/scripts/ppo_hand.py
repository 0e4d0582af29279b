"""Hand-optimised twin of ppo.py: same environment, models, sampling and losses; the rollout runs on a CPU
replica refreshed once per episode (the GPU models never move), distributions without argument validation,
one pinned copy of the rollout batch, fused Adam, statistics kept on the GPU and read once per episode.

    python ppo.py [--device cuda|cpu] [--small]
"""
import argparse
import copy
import random
import time

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class ChaseEnv:
    """N agents on a plane chase their own moving target; 5 actions (stay, up, down, left, right)."""

    obs_dim, n_actions = 8, 5
    moves = np.array([[0, 0], [0, 1], [0, -1], [-1, 0], [1, 0]], dtype=np.float32) * 0.1

    def __init__(self, n, seed, max_steps=200):
        self.n, self.max_steps = n, max_steps
        self.rng = np.random.default_rng(seed)
        self.pos = np.zeros((n, 2), np.float32)
        self.target = np.zeros((n, 2), np.float32)
        self.vel = np.zeros((n, 2), np.float32)
        self.t = np.zeros(n, np.int64)

    def _reset(self, idx):
        k = len(idx)
        self.pos[idx] = self.rng.uniform(-1, 1, (k, 2))
        self.target[idx] = self.rng.uniform(-1, 1, (k, 2))
        self.vel[idx] = self.rng.normal(0, 0.02, (k, 2))
        self.t[idx] = 0

    def _obs(self):
        delta = self.target - self.pos
        dist = np.linalg.norm(delta, axis=1, keepdims=True)
        return np.concatenate([self.pos, self.target, delta, self.vel * 10, dist], axis=1)[:, :self.obs_dim].astype(np.float32)

    def reset(self):
        self._reset(np.arange(self.n))
        return self._obs()

    def step(self, actions):
        before = np.linalg.norm(self.target - self.pos, axis=1)
        self.pos = np.clip(self.pos + self.moves[actions], -1.5, 1.5)
        self.target = np.clip(self.target + self.vel, -1.5, 1.5)
        after = np.linalg.norm(self.target - self.pos, axis=1)
        reward = (before - after) * 10 - 0.01
        caught = after < 0.1
        reward[caught] += 1.0
        self.t += 1
        done = caught | (self.t >= self.max_steps)
        if done.any():
            self._reset(np.nonzero(done)[0])
        return self._obs(), reward.astype(np.float32), done


class Actor(nn.Module):
    def __init__(self, obs_dim, n_actions, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, n_actions))

    def forward(self, obs):
        return self.net(obs)


class Critic(nn.Module):
    def __init__(self, obs_dim, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, 1))

    def forward(self, obs):
        return self.net(obs).squeeze(-1)


class PPO:
    def __init__(self, env, device, hidden, horizon, epochs, minibatch):
        self.env, self.device = env, device
        self.horizon, self.epochs, self.minibatch = horizon, epochs, minibatch
        self.actor = Actor(env.obs_dim, env.n_actions, hidden).to(device)
        self.critic = Critic(env.obs_dim, hidden).to(device)
        self.actor_cpu = copy.deepcopy(self.actor).cpu()  # no fresh init: the RNG stream stays the original's
        self.critic_cpu = copy.deepcopy(self.critic).cpu()
        self.params = list(self.actor.parameters()) + list(self.critic.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=3e-4, fused=device.type == "cuda")
        self.gamma, self.lam, self.clip = 0.99, 0.95, 0.2
        self.obs = env.reset()

    def collect(self):
        self.actor_cpu.load_state_dict(self.actor.state_dict())
        self.critic_cpu.load_state_dict(self.critic.state_dict())
        obs_buf, act_buf, logp_buf, rew_buf, done_buf, val_buf = [], [], [], [], [], []
        for t in range(self.horizon):
            obs_t = torch.from_numpy(self.obs)
            with torch.inference_mode():
                logits = self.actor_cpu(obs_t)
                value = self.critic_cpu(obs_t)
            dist = Categorical(logits=logits, validate_args=False)
            action = dist.sample()
            next_obs, reward, done = self.env.step(action.numpy())
            obs_buf.append(self.obs)
            act_buf.append(action.numpy())
            logp_buf.append(dist.log_prob(action).numpy())
            rew_buf.append(reward)
            done_buf.append(done)
            val_buf.append(value.numpy())
            self.obs = next_obs
        with torch.inference_mode():
            last_value = self.critic_cpu(torch.from_numpy(self.obs)).numpy()
        rewards, dones, values = np.array(rew_buf), np.array(done_buf), np.array(val_buf)
        advantages = np.zeros_like(rewards)
        gae = 0.0
        for t in reversed(range(self.horizon)):
            next_value = last_value if t == self.horizon - 1 else values[t + 1]
            nonterminal = 1.0 - dones[t]
            delta = rewards[t] + self.gamma * next_value * nonterminal - values[t]
            gae = delta + self.gamma * self.lam * nonterminal * gae
            advantages[t] = gae
        returns = advantages + values
        return (np.array(obs_buf).reshape(-1, self.env.obs_dim), np.array(act_buf).reshape(-1),
                np.array(logp_buf).reshape(-1), advantages.reshape(-1), returns.reshape(-1), rewards.mean())

    def update(self, batch):
        obs, actions, old_logp, advantages, returns, _ = batch
        host = torch.from_numpy(np.concatenate([obs, old_logp[:, None], advantages[:, None], returns[:, None],
                                                actions[:, None].astype(np.float32)], axis=1))
        if self.device.type == "cuda":
            host = host.pin_memory()
        flat = host.to(self.device, non_blocking=True)
        d = self.env.obs_dim
        obs, old_logp, advantages, returns = flat[:, :d], flat[:, d], flat[:, d + 1], flat[:, d + 2]
        actions = flat[:, d + 3].long()
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        stats = torch.zeros(3, device=self.device)
        n = obs.shape[0]
        for epoch in range(self.epochs):
            perm = torch.randperm(n).to(self.device, non_blocking=True)
            for start in range(0, n, self.minibatch):
                idx = perm[start:start + self.minibatch]
                logits = self.actor(obs[idx])
                dist = Categorical(logits=logits, validate_args=False)
                new_logp = dist.log_prob(actions[idx])
                entropy = dist.entropy().mean()
                ratio = torch.exp(new_logp - old_logp[idx])
                surr1 = ratio * advantages[idx]
                surr2 = torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * advantages[idx]
                pg_loss = -torch.min(surr1, surr2).mean()
                v_loss = ((self.critic(obs[idx]) - returns[idx]) ** 2).mean()
                loss = pg_loss + 0.5 * v_loss - 0.01 * entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.params, 0.5, foreach=True)
                self.optimizer.step()
                stats += torch.stack([pg_loss.detach(), v_loss.detach(), entropy.detach()])
        stats = dict(zip(("pg", "v", "ent"), stats.tolist()))
        updates = self.epochs * ((n + self.minibatch - 1) // self.minibatch)
        return {k: v / updates for k, v in stats.items()}


def main():
    args = get_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.small:
        n_envs, hidden, horizon, epochs, minibatch, episodes = 4, 16, 8, 2, 8, 2
    else:
        n_envs, hidden, horizon, epochs, minibatch, episodes = 64, 256, 128, 4, 256, 25
    env = ChaseEnv(n_envs, args.seed)
    agent = PPO(env, device, hidden, horizon, epochs, minibatch)
    start = time.time()
    history = []
    for episode in range(episodes):
        batch = agent.collect()
        stats = agent.update(batch)
        history.append(stats["v"])  # the critic's regression loss (the PPO objective hovers around 0)
        if episode % 5 == 0:
            print(f"episode {episode}: reward {batch[-1]:.3f} v_loss {stats['v']:.4f} entropy {stats['ent']:.3f}")
    final = sum(history[-5:]) / len(history[-5:])
    print(f"final loss {final:.4f}")
    print(f"train time {time.time() - start:.3f}s")


if __name__ == "__main__":
    main()
