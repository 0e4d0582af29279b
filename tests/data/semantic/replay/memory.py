import numpy as np
import torch


class Replay:
    def __init__(self, capacity, obs_dim, device):
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.device = device
        self.size = 0

    def push(self, obs, action, reward):  # frequency: per-rollout-step
        self.obs[self.size], self.actions[self.size], self.rewards[self.size] = obs, action, reward
        self.size += 1

    def sample_batch(self, batch_size):  # frequency: per-step
        idx = np.random.randint(0, self.size, size=batch_size)
        return self._tensors(idx)

    def _tensors(self, idx):  # frequency: per-step
        obs = torch.tensor(self.obs[idx], device=self.device)
        actions = torch.tensor(self.actions[idx], device=self.device)
        return obs, actions, torch.tensor(self.rewards[idx], device=self.device)
