import numpy as np
import torch

from neural_net import NeuralNet


class NNetWrapper(NeuralNet):
    def __init__(self, net):
        self.net = net.cuda()

    def predict(self, board):  # frequency: per-rollout-step
        x = torch.FloatTensor(board.astype(np.float32)).cuda()
        with torch.no_grad():
            pi, v = self.net(x)
        return pi.cpu().numpy(), v.item()
