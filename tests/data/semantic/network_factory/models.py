import torch


class Network:
    """A factory: `Network(config)` builds one of the networks below."""

    def __new__(cls, config):
        if config.network == "mlp":
            return MlpNetwork(config.width)
        return ConvNetwork(config.width)


class AbstractNetwork(torch.nn.Module):
    def initial_inference(self, observation):  # frequency: per-step
        raise NotImplementedError


class MlpNetwork(AbstractNetwork):
    def __init__(self, width):
        super().__init__()
        self.body = torch.nn.Linear(width, width)

    def initial_inference(self, observation):  # frequency: per-step
        return self.normalised(self.body(observation))

    def normalised(self, state):  # frequency: per-step
        scale = state.max(1, keepdim=True)[0] - state.min(1, keepdim=True)[0]
        scale[scale < 1e-5] += 1e-5
        return state / scale


class ConvNetwork(AbstractNetwork):
    def __init__(self, width):
        super().__init__()
        self.body = torch.nn.Conv2d(width, width, 3)

    def initial_inference(self, observation):  # frequency: per-step
        return self.body(observation)
