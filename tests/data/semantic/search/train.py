"""Self-play with tree search: a learner phase gated by a checkpoint schedule, a replay buffer class defined
twice in the tree (the copy beside the importer is the one imported)."""
import torch

from agent import Agent, make_player
from replay import Replay

device = torch.device("cuda")


def train(net, envs, optimizer, games_per_ckpt, target_steps):
    agent = Agent(net).to(device)
    buffer = Replay(1000)
    play = make_player(net)
    games_since_ckpt = 0
    steps = 0
    for game in range(10_000):
        obs = envs.reset()
        for move in range(400):  # hot: rollout
            obs, reward, done, info = envs.step(play(obs))
        games_since_ckpt += 1
        if games_since_ckpt >= games_per_ckpt:  # the update phase starts on a schedule; its loop is still per step
            while steps < target_steps:  # hot: step-loop
                batch = buffer.sample(256)
                loss = agent.unroll(batch).mean()
                loss.backward()
                optimizer.step()
                steps += 1
            games_since_ckpt = 0
