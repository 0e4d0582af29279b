"""A sampling script: each iteration of the outer loop runs a whole denoising loop, so the outer loop is not a
rollout loop itself (the denoising loop is shaped like a tree search's simulation loop, and is treated like one)."""
import torch


class Sampler:
    def __init__(self, model):
        self.model = model

    def denoise(self, x, t):  # frequency: per-rollout-step
        return self.model(x, t)

    def sample(self, cond, steps):  # frequency: per-iteration
        x = torch.randn_like(cond)
        for t in range(steps):  # hot: rollout
            x = x - self.denoise(x, t)
        return x


def generalized_steps(x, seq, model):  # a schedule walked back: as many network calls as timesteps
    seq_next = [-1] + list(seq[:-1])
    for i, j in zip(reversed(seq), reversed(seq_next)):  # hot: rollout
        x = model(x, i) - model(x, j)
    return x


def main(model, conds, n_iter):
    sampler = Sampler(model)
    for n in range(n_iter):  # hot: none
        cond = model.encoder(conds[n])
        images = sampler.sample(cond, 50)
