import torch


class Optimizer:
    def __init__(self, params, lr):
        self._opt = torch.optim.Adam(params, lr=lr)

    def __call__(self, loss):  # frequency: per-step
        self._opt.zero_grad()
        loss.backward()
        self._opt.step()
