"""The network's own inference helper, called once per tree-search simulation through a parameter."""
import torch
import torch.nn as nn


class BoardNet(nn.Module):
    def forward(self, x):  # frequency: per-step  (a forward pass)
        return self.policy(x), self.value(x)

    def predict(self, board):  # frequency: per-rollout-step
        x = torch.FloatTensor(board).to(self.device)
        with torch.no_grad():
            pi, v = self.forward(x)
        return pi.cpu().numpy(), v.item()
