import torch

import models


class Trainer:
    def __init__(self, config):
        self.model = models.Network(config)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train(self, batches):  # frequency: once
        for observation, target in batches:  # hot: step-loop
            loss = (self.model.initial_inference(observation) - target).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
