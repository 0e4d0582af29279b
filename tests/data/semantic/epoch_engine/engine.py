import torch


def train_one_epoch(model, criterion, data_loader, optimizer, device):  # frequency: per-iteration
    model.train()
    for samples, targets in data_loader:  # hot: step-loop
        samples = samples.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        loss = criterion(model(samples), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@torch.no_grad()
def evaluate(data_loader, model, device):  # frequency: per-iteration
    model.eval()
    correct = 0
    for images, labels in data_loader:
        correct += (model(images.to(device)).argmax(1) == labels.to(device)).sum()
    return correct
