import torch

from memory import ReplayMemory


class BaseAgent:
    def __init__(self, net, device):
        self.net = net.to(device)
        self.optim = torch.optim.Adam(self.net.parameters(), lr=1e-3)
        self.memory = ReplayMemory(100000, device)

    def run(self, env, steps):  # frequency: once
        for step in range(steps):
            self.learn()
