import torch


class discrete_BCQ:
    def __init__(self, net, device):
        self.q = net.to(device)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=1e-4)

    def train(self, replay_buffer):  # frequency: per-step
        state = replay_buffer.sample()
        loss = self.q(state).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
