"""Frame classifier: a small conv net trained on synthetic images served by a Dataset through a DataLoader.

    python vision.py [--device cuda|cpu] [--small]
"""
import argparse
import random
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class SyntheticFrames(Dataset):
    """Noisy frames with a class-specific blob pattern; each item is generated from its own index."""

    def __init__(self, n, size, classes, seed):
        self.n, self.size, self.classes, self.seed = n, size, classes, seed
        rng = np.random.default_rng(seed)
        self.patterns = rng.standard_normal((classes, 3, size, size)).astype(np.float32)
        self.labels = rng.integers(0, classes, size=n)

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        rng = np.random.default_rng(self.seed * 1_000_003 + idx)
        label = int(self.labels[idx])
        image = rng.standard_normal((3, self.size, self.size)).astype(np.float32)
        image += 0.12 * self.patterns[label]
        image = (image - image.mean()) / (image.std() + 1e-6)
        return torch.from_numpy(image), label


class ConvNet(nn.Module):
    def __init__(self, classes, width=64):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.MaxPool2d(2))

        self.features = nn.Sequential(block(3, width), block(width, 2 * width), block(2 * width, 4 * width),
                                      block(4 * width, 4 * width))
        self.classifier = nn.Linear(4 * width, classes)

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.classifier(x)


def main():
    args = get_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if args.small:
        n, size, width, batch_size, epochs = 64, 16, 8, 16, 1
    else:
        n, size, width, batch_size, epochs = 8192, 96, 64, 128, 3
    classes = 10
    dataset = SyntheticFrames(n, size, classes, args.seed)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True)
    model = ConvNet(classes, width).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    start = time.time()
    losses = []
    for epoch in range(epochs):
        model.train()
        running, correct, seen = 0.0, 0, 0
        for images, labels in loader:
            images = images.to(device)
            labels = labels.to(device)
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += loss.item()
            correct += (outputs.argmax(1) == labels).sum().item()
            seen += labels.size(0)
            losses.append(loss.item())
        print(f"epoch {epoch}: loss {running / len(loader):.4f} acc {correct / seen:.3f}")
    final = sum(losses[-10:]) / len(losses[-10:])
    print(f"final loss {final:.4f}")
    print(f"train time {time.time() - start:.3f}s")


if __name__ == "__main__":
    main()
