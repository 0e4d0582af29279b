import torch

from tree import tree_search


class Agent(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def unroll(self, batch):  # frequency: per-step
        return self.net(batch)


def make_player(net):  # frequency: once
    @torch.no_grad()
    def evaluate_leaf(state):  # frequency: per-rollout-step
        return net(torch.from_numpy(state).to("cuda"))

    def play(state):  # frequency: per-rollout-step (make_player returns it: the move loop calls it)
        return tree_search(state, evaluate=evaluate_leaf)

    return play
