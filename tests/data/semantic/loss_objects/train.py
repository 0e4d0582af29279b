from loss import ComputeLoss


def train(model, loader, optimizer):
    compute_loss = ComputeLoss(model)
    for imgs, targets in loader:
        pred = model(imgs.cuda(non_blocking=True))
        loss = compute_loss(pred, targets.to("cuda"))  # a network's output (`pred`) is not taken for a GPU tensor
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
