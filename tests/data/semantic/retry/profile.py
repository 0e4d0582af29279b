import torch


def measure(model, x):  # frequency: per-iteration
    with torch.no_grad():
        return model(x).sum()


def profile(model, x):
    retries = 2
    while retries:  # hot: none
        retries -= 1
        try:
            return measure(model, x)
        except RuntimeError:
            model = model.cpu()
    return None

