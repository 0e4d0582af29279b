"""A small image-classification training script with the GPU performance mistakes gpulint finds.

Run `gpulint check examples/` to see them and `gpulint fix examples/` for the rewrites.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class ConvNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 128, 3, padding=1)
        self.head = nn.Linear(128, num_classes)

    def forward(self, x, valid):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = x.mean(dim=(2, 3))
        logits = self.head(x)
        logits[~valid] = float("-inf")  # mask classes that are invalid for this sample
        return logits


def make_dataset(n: int = 4096) -> TensorDataset:
    images = torch.from_numpy(np.random.rand(n, 3, 32, 32).astype("float32"))
    labels = torch.randint(0, 10, (n,))
    return TensorDataset(images, labels)


def train(args) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = ConvNet().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.cuda.amp.GradScaler()
    loader = DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)

    for epoch in range(args.epochs):
        running = 0.0
        for step, (images, labels) in enumerate(loader):
            images, labels = images.to(device), labels.to(device)
            valid = torch.ones(images.shape[0], 10, dtype=torch.bool).to(device)
            optimizer.zero_grad()
            with torch.cuda.amp.autocast():
                loss = F.cross_entropy(model(images, valid), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            running += loss.item()
        print(f"epoch {epoch}: loss {running / (step + 1):.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    train(parser.parse_args())
