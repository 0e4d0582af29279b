import torch

from data import make_loader


def train(model, dataset, vocab, epochs=10):
    loader = make_loader(dataset, vocab, torch.device("cuda"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for epoch in range(epochs):
        for tokens in loader:
            loss = model(tokens).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
