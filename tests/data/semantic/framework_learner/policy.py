import torch

from utils import to_float_tensors


class MuZeroPolicy:
    """Registered with a training framework, whose learner calls `_forward_learn` once per training step."""

    def __init__(self, model, device):
        self._model = model
        self._device = device
        self._optimizer = torch.optim.Adam(model.parameters(), fused=True)

    def _forward_learn(self, data):  # frequency: per-step
        obs, target = to_float_tensors(data, self._device)
        loss = (self._model(obs) - target).pow(2).mean()
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        return {"loss": loss.item()}
