import torch
from torch.utils.data import DataLoader

from engine import evaluate, train_one_epoch


def main(args, dataset_train, dataset_val, model):
    device = torch.device("cuda")
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    criterion = torch.nn.CrossEntropyLoss()
    loader_train = DataLoader(dataset_train, batch_size=args.batch_size, num_workers=args.workers)  # feeds-training: yes, per-epoch: yes
    loader_val = DataLoader(dataset_val, batch_size=args.batch_size, num_workers=args.workers)  # feeds-training: no, per-epoch: yes
    loader_test = DataLoader(dataset_val, batch_size=args.batch_size, num_workers=args.workers)  # feeds-training: no, per-epoch: no
    for epoch in range(args.epochs):
        train_one_epoch(model, criterion, loader_train, optimizer, device)
        evaluate(loader_val, model, device)
    evaluate(loader_test, model, device)
