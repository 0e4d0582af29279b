"""PPO on a vectorised toy environment: rollouts on the CPU, updates on the GPU, the models moved between
the two every episode (the hybrid CPU/GPU design of many RL code bases).

    python ppo.py [--device cuda|cpu] [--small]
"""
import argparse
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
        self.optimizer = torch.optim.Adam(list(self.actor.parameters()) + list(self.critic.parameters()), lr=3e-4)
        self.gamma, self.lam, self.clip = 0.99, 0.95, 0.2
        self.obs = env.reset()

    def collect(self):
        self.actor.to("cpu")
        self.critic.to("cpu")
        obs_buf, act_buf, logp_buf, rew_buf, done_buf, val_buf = [], [], [], [], [], []
        for t in range(self.horizon):
            obs_t = torch.FloatTensor(self.obs)
            with torch.no_grad():
                logits = self.actor(obs_t)
                value = self.critic(obs_t)
            dist = Categorical(logits=logits)
            action = dist.sample()
            next_obs, reward, done = self.env.step(action.numpy())
            obs_buf.append(self.obs)
            act_buf.append(action.numpy())
            logp_buf.append(dist.log_prob(action).numpy())
            rew_buf.append(reward)
            done_buf.append(done)
            val_buf.append(value.numpy())
            self.obs = next_obs
        with torch.no_grad():
            last_value = self.critic(torch.FloatTensor(self.obs)).numpy()
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
        self.actor.to(self.device)
        self.critic.to(self.device)
        obs, actions, old_logp, advantages, returns, _ = batch
        obs = torch.tensor(obs).to(self.device)
        actions = torch.tensor(actions).to(self.device)
        old_logp = torch.tensor(old_logp).to(self.device)
        advantages = torch.tensor(advantages).to(self.device)
        returns = torch.tensor(returns).to(self.device)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        stats = {"pg": 0.0, "v": 0.0, "ent": 0.0}
        n = obs.shape[0]
        for epoch in range(self.epochs):
            perm = torch.randperm(n)
            for start in range(0, n, self.minibatch):
                idx = perm[start:start + self.minibatch]
                logits = self.actor(obs[idx])
                dist = Categorical(logits=logits)
                new_logp = dist.log_prob(actions[idx])
                entropy = dist.entropy().mean()
                ratio = torch.exp(new_logp - old_logp[idx])
                surr1 = ratio * advantages[idx]
                surr2 = torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * advantages[idx]
                pg_loss = -torch.min(surr1, surr2).mean()
                v_loss = ((self.critic(obs[idx]) - returns[idx]) ** 2).mean()
                loss = pg_loss + 0.5 * v_loss - 0.01 * entropy
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(list(self.actor.parameters()) + list(self.critic.parameters()), 0.5)
                self.optimizer.step()
                stats["pg"] += pg_loss.item()
                stats["v"] += v_loss.item()
                stats["ent"] += entropy.item()
        updates = self.epochs * ((n + self.minibatch - 1) // self.minibatch)
        return {k: v / updates for k, v in stats.items()}


def main():
    args = get_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
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
