"""Policies shared by every script of the project, imported with `from common.policies import *`."""
import torch
import torch.nn as nn


class GaussianPolicy(nn.Module):
    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.mean = nn.Linear(obs_dim, act_dim)

    def forward(self, obs):
        return self.mean(obs)

    def act(self, obs):  # frequency: per-rollout-step
        mean = self(torch.as_tensor(obs, dtype=torch.float32, device="cuda"))
        return (mean + 0.1 * torch.randn_like(mean)).cpu().numpy()
