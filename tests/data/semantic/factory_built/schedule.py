import numpy as np
import torch


def _gather(table, t):  # frequency: per-step
    return torch.from_numpy(table).to(t.device)[t].float()


class NoiseSchedule:
    def __init__(self, steps):
        self.alphas = np.linspace(0.999, 0.98, steps)

    def add_noise(self, x, t):  # frequency: per-step
        return _gather(self.alphas, t)[:, None] * x

    def loss(self, model, x, t):  # frequency: per-step
        return (model(self.add_noise(x, t), t) - x).pow(2).mean()


class RespacedSchedule(NoiseSchedule):
    def loss(self, model, x, t):  # frequency: per-step
        return super().loss(model, x, t * 2)

    def describe(self):  # frequency: once
        return f"{len(self.alphas)} steps"
