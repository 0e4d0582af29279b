"""A MuZero-style model object whose `train` method is one training step: it unrolls the dynamics network k times
(a loop of network calls inside the step, not a rollout) and backpropagates."""
import torch

from networks import Dynamics_function


class Muzero:
    def __init__(self, width, k, device):
        self.dynamics_function = Dynamics_function(width).to(device)
        self.optimizer = torch.optim.Adam(self.dynamics_function.parameters())
        self.k = k
        self.device = device

    def reshape_batch(self, batch):  # frequency: per-step
        return torch.tensor(batch, device=self.device)

    def compute_forward(self, state):  # frequency: per-step
        rewards = []
        for k in range(self.k):
            reward, state = self.dynamics_function(torch.cat([state, state[:, :1]], dim=1))
            rewards.append(reward)
        return torch.stack(rewards)

    def backpropagation(self, predicted):  # frequency: per-step
        loss = predicted.pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def train(self, batch):  # frequency: per-step
        self.backpropagation(self.compute_forward(self.reshape_batch(batch)))
