import torch


class Replay:
    def __init__(self, capacity):  # frequency: once
        self.items = []

    def sample(self, n):  # frequency: per-step
        return torch.stack([self._pad(i) for i in range(n)])

    def _pad(self, i):  # frequency: per-step
        return torch.tensor([0.0]).to("cuda")
