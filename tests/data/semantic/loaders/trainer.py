import torch


class Trainer:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_epoch(self):  # frequency: per-iteration
        for x, y in self.loader:  # hot: step-loop
            loss = torch.nn.functional.cross_entropy(self.model(x.cuda()), y.cuda())
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


def fit(model, opt, batches):
    for x, y in batches:  # hot: step-loop
        loss = model(x.cuda()).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@torch.no_grad()
def evaluate(model, loader):
    return [model(x.cuda()) for x, _ in loader]
