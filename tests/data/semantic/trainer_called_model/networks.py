"""Networks named like the attributes that hold them (`Dynamics_function` in `self.dynamics_function`)."""
from torch import nn


class Dynamics_function(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Linear(width + 1, width + 1)

    def forward(self, x):  # frequency: per-step
        out = self.body(x)
        return out[:, :1], out[:, 1:]
