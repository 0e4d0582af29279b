import torch
from torch.utils.data import DataLoader

import meters


def train_one_epoch(model, loader, optimizer):  # frequency: per-iteration
    progress = meters.ProgressLogger(every=20)
    for step, (images, labels) in enumerate(progress.logged(loader, header="train")):
        loss = torch.nn.functional.cross_entropy(model(images.cuda(non_blocking=True)), labels.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main(model, dataset, epochs=100):
    loader = DataLoader(dataset, batch_size=256, num_workers=8, pin_memory=True)  # feeds-training: yes, per-epoch: yes
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer)
