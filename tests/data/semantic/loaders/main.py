import torch
from torch.utils.data import DataLoader
from torchvision import datasets

from data import calibration_loader, get_loaders, pretraining_loader
from trainer import Trainer, evaluate, fit


def main():
    model = torch.nn.Linear(10, 10).cuda()
    train_loader, val_loader = get_loaders("data", 64)
    extra = DataLoader(datasets.ImageFolder("extra"), batch_size=64)  # feeds-training: yes
    probe = DataLoader(datasets.ImageFolder("probe"), batch_size=64)  # feeds-training: no
    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), extra)
    for x, y in pretraining_loader("data"):  # hot: step-loop
        model(x.cuda()).sum().backward()
    trainer = Trainer(model, train_loader)
    for epoch in range(10):
        trainer.train_epoch()
        evaluate(model, val_loader)
        evaluate(model, calibration_loader("data"))
        evaluate(model, probe)


if __name__ == "__main__":
    main()
