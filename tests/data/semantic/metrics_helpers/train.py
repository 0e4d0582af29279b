import torch
import torch.nn.functional as F

from metrics import log_step, log_value, summarise


def train(model, loader, optimizer, writer):  # device-params: none
    for step, (x, y) in enumerate(loader):
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        accuracy = summarise(logits, y.cpu())  # `labels` is passed a host tensor here; what a program function
        # returns is not followed: `accuracy` is not known to be a GPU tensor
        log_step(writer, loss, accuracy, step)
        log_value(writer, "loss", loss, step)
        log_value(writer, "lr", optimizer.param_groups[0]["lr"], step)  # a number: `value` is not always a tensor


def validate(model, loader, writer, step):
    total = 0.0
    for x, y in loader:
        logits = model(x.to("cuda"))
        total += F.cross_entropy(logits, y.to("cuda"))
    log_value(writer, "val_loss", total.item(), step)
    log_step(writer, total, summarise(logits, y), step)


def main():
    model = torch.nn.Linear(4, 2).to("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, [], optimizer, None)
    validate(model, [], None, 0)
