from functools import partial

import torch
from torch.utils.data import DataLoader

from trainer import fit


def collate(items, device):  # batch-params: none, frequency: per-step
    return torch.stack(items).to(device)


def main():
    model = torch.nn.Linear(4, 2).cuda()
    on_device = partial(collate, device="cuda")
    loader = DataLoader(range(10), batch_size=2, collate_fn=on_device)
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, "cuda")
