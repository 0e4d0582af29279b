import torch.nn as nn

import tools


class WorldModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        self._model_opt = tools.Optimizer(self.parameters(), lr=1e-4)  # a class of another module, by its module

    def _train(self, data):  # frequency: per-step
        loss = self.encoder(data).pow(2).mean()
        self._model_opt(loss)  # one optimizer step per call: each call of `_train` is a training step
        return loss


class Agent:
    def __init__(self):
        self._wm = WorldModel().cuda()

    def __call__(self, obs, dataset, training):
        if training:
            for _ in range(4):
                self._wm._train(next(dataset))
        return obs


def main(env, dataset):
    agent = Agent()
    obs = env.reset()
    for _ in range(1000):
        obs = env.step(agent(obs, dataset, True))
