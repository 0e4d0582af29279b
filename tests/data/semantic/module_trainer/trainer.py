"""A trainer written as an nn.Module: its `forward` runs the whole training once, so it is no network forward
run per step; the step loop inside it is."""
import torch
from torch import nn


class Trainer(nn.Module):
    def __init__(self, model, loader, steps):
        super().__init__()
        self.model = model.cuda()
        self.loader = loader
        self.steps = steps
        self.optimizer = torch.optim.Adam(self.model.parameters())
        self.register_buffer("step", torch.tensor(0))

    def forward(self):  # frequency: once
        start = self.step.item()
        for images in self.loader:  # hot: step-loop
            loss = self.model(images.cuda(non_blocking=True)).mean()
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
        return start


def main(model, loader):
    Trainer(model, loader, 1000)()
