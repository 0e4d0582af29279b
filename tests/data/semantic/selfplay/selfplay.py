import torch

from mcts import play_move
from trainer import train_epoch


def self_play_game(net, device):  # frequency: per-iteration
    state = new_game()
    history = []
    while not state.over:  # hot: rollout
        move, value = play_move(net, state, device)
        history.append((state, value))
        state = state.apply(move)
    return history


def main():
    net = build_network().to("cuda")
    for generation in range(100):
        games = [self_play_game(net, "cuda") for _ in range(8)]
        train_epoch(net, games)
        if generation % 10 == 0:
            save_checkpoint(net)


def save_checkpoint(net):  # frequency: once
    torch.save(net.state_dict(), "net.pt")
