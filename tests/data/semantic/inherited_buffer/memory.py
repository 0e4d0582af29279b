import numpy as np
import torch


class ReplayMemory:
    def __init__(self, capacity, device):
        self.capacity, self.device = capacity, device
        self.states = np.zeros((capacity, 4), dtype=np.float32)

    def sample(self, batch_size):  # frequency: per-step
        indices = np.random.randint(0, self.capacity, size=batch_size)
        return torch.FloatTensor(self.states[indices]).to(self.device)
