import torch

import bcq
import utils


def train_bcq(net, replay_buffer, device, iterations):  # frequency: once
    policy = bcq.discrete_BCQ(net, device)
    for _ in range(iterations):  # hot: step-loop
        policy.train(replay_buffer)


if __name__ == "__main__":
    buffer = utils.ReplayBuffer(4, False, torch.device("cuda"))
    train_bcq(torch.nn.Linear(4, 2), buffer, torch.device("cuda"), 100000)
