import torch
from torch.utils.data import DataLoader


def run(model, optimizer, train_set, val_set):
    train_loader = DataLoader(train_set, batch_size=64, num_workers=4)  # feeds-training: yes, per-epoch: yes
    val_loader = DataLoader(val_set, batch_size=64, num_workers=4)  # feeds-training: no, per-epoch: yes
    for epoch in range(10):
        train_and_evaluate(model, optimizer, [train_loader, val_loader])


def train_and_evaluate(model, optimizer, loaders):
    train_loader, val_loader = loaders
    for x, y in train_loader:
        loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        for x, y in val_loader:
            model(x.cuda())
