import numpy as np
import torch


def ReplayBuffer(state_dim, is_atari, device):  # frequency: once
    if is_atari:
        return AtariBuffer(state_dim, device)
    return StandardBuffer(state_dim, device)


class StandardBuffer:
    def __init__(self, state_dim, device):
        self.state = np.zeros((100000, state_dim), dtype=np.float32)
        self.device = device

    def sample(self):  # frequency: per-step
        ind = np.random.randint(0, len(self.state), size=32)
        return torch.FloatTensor(self.state[ind]).to(self.device)


class AtariBuffer(StandardBuffer):
    def sample(self):  # frequency: per-step
        ind = np.random.randint(0, len(self.state), size=32)
        return torch.ByteTensor(self.state[ind]).to(self.device).float()
