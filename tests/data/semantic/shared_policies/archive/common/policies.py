"""An older copy of the shared policies, kept for a retired experiment: no script here imports it."""
import torch.nn as nn


class GaussianPolicy(nn.Module):
    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.mean = nn.Linear(obs_dim, act_dim)

    def act(self, obs):  # frequency: once
        return self.mean(obs)
