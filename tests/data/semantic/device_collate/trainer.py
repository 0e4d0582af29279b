def loss_of(batch, model, device):  # batch-params: none
    return model(batch.to(device)).mean()


def fit(model, opt, loader, device):  # frequency: once
    for batch in loader:  # hot: step-loop
        loss_of(batch, model, device).backward()
        opt.step()
