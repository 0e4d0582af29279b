import torch
from torch.utils.data import DataLoader

from losses import batch_loss


def loss_of(inputs, targets, model, device):  # batch-params: inputs-targets
    inputs, targets = inputs.to(device), targets.to(device)
    return torch.nn.functional.cross_entropy(model(inputs), targets)


def train(model, loader, opt, device):  # batch-params: none
    for step, (inputs, targets) in enumerate(loader):  # hot: step-loop
        loss = loss_of(inputs, targets, model, device)
        loss.backward()
        opt.step()


def finetune(model, data, opt, device):  # batch-params: none
    for images, labels in data:  # hot: step-loop
        batch_loss(model, images, labels, device).backward()
        opt.step()


def critic_step(model, real, opt):  # batch-params: real
    real = real.cuda()
    model(real).mean().backward()
    opt.step()


def train_critic(model, loader, opt):  # batch-params: none
    for i, data in enumerate(loader):  # hot: step-loop
        critic_step(model, data[0], opt)


def main():
    model = torch.nn.Linear(4, 2).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, DataLoader(range(10), batch_size=2), opt, "cuda")
    finetune(model, [(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))], opt, "cuda")
    train_critic(model, DataLoader(range(10), batch_size=2), opt)
