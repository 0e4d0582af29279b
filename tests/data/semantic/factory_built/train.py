import torch

from factory import build_schedule


def main(model, loader):
    schedule = build_schedule()
    print(schedule.describe())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for x in loader:
        x = x.cuda(non_blocking=True)
        t = torch.randint(0, 1000, (x.shape[0],), device=x.device)
        loss = schedule.loss(model, x, t)
        opt.zero_grad()
        loss.backward()
        opt.step()
