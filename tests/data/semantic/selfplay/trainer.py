import torch


def policy_loss(logits, target):  # frequency: per-step
    return -(target * torch.log_softmax(logits, -1)).sum(-1).mean()


def train_epoch(net, games):  # frequency: per-iteration
    opt = torch.optim.AdamW(net.parameters())
    for batch in make_batches(games):  # hot: step-loop
        logits, value = net(batch.x)
        p_loss = policy_loss(logits, batch.pi)
        v_loss = (value - batch.z).pow(2).mean()
        total = p_loss + v_loss
        total.backward()
        opt.step()
        opt.zero_grad()
        log_losses(p_loss)


def log_losses(p_loss):  # frequency: per-step
    print(p_loss.item())


def make_batches(games):  # frequency: per-iteration
    return games
