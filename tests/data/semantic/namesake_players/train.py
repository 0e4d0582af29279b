import torch

from arena import Arena
from random_search import Player as RandomPlayer
from tree_search import Player


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(64, 65)

    def evaluate(self, board):  # frequency: per-rollout-step
        out = self.body(torch.as_tensor(board.planes()).cuda())
        return out[:-1].cpu().numpy(), out[-1].item()


class Pipeline:
    def __init__(self, new_board):
        self.new_board = new_board
        self.arena = Arena()
        self.net = Net().cuda()
        self.player = Player(self.net.evaluate, simulations=400)
        self.baseline = RandomPlayer()

    def run(self, games):
        for _ in range(games):
            self.arena.self_play(self.player, self.new_board())
