import torch
import torch.nn as nn


class Agent:
    def __init__(self, device):  # frequency: once
        self.device = device
        self.actor = nn.Linear(4, 2)
        self.opt = torch.optim.Adam(self.actor.parameters())

    def act(self, obs):  # frequency: per-rollout-step
        return self.actor(torch.as_tensor(obs, dtype=torch.float32)).argmax().item()

    def collect(self, env, horizon):  # frequency: per-iteration
        self.actor.to("cpu")
        obs = env.reset()
        trajectory = []
        for t in range(horizon):  # hot: rollout
            action = self.act(obs)
            obs, reward, done, _ = env.step(action)
            trajectory.append((obs, action, reward))
        return trajectory

    def update(self, trajectory):  # frequency: per-iteration
        self.actor.to(self.device)
        for epoch in range(4):  # hot: step-loop
            loss = self.actor(torch.zeros(1, 4, device=self.device)).sum()
            loss.backward()
            self.opt.step()

    def train(self, env, episodes):  # frequency: once
        for episode in range(episodes):
            self.update(self.collect(env, 128))
