import torch


def weight_histogram(model):  # frequency: once
    return [p.detach().cpu().numpy() for p in model.parameters()]


def update(model, batch, optimizer, visualise):  # frequency: per-step
    loss = model(batch.cuda(non_blocking=True)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if visualise:
        return weight_histogram(model)
    return None


def train(model, loader, optimizer, vis_interval=1000):
    for step, batch in enumerate(loader):
        if step % vis_interval == 0:
            visualise = True
        else:
            visualise = False
        update(model, batch, optimizer, visualise)
