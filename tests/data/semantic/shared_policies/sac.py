"""A script whose trainer holds the policy: `trainer.policy.act(obs)` runs the class its `__init__` stored."""
import gym
import torch

from common.policies import *


class Trainer:
    def __init__(self, obs_dim, act_dim):
        self.policy = GaussianPolicy(obs_dim, act_dim).cuda()
        self.optimizer = torch.optim.Adam(self.policy.parameters())


env = gym.make("Pendulum-v1")
trainer = Trainer(3, 1)
obs, _ = env.reset()
for step in range(100_000):
    action = trainer.policy.act(obs)
    obs, reward, terminated, truncated, _ = env.step(action)
    if terminated or truncated:
        obs, _ = env.reset()
