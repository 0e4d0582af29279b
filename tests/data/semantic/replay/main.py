import gym
import torch

from agent import Learner
from memory import Replay

train_every = 4

env = gym.make("CartPole-v1")
net, target = torch.nn.Linear(4, 2).cuda(), torch.nn.Linear(4, 2).cuda()
learner = Learner(net, target, torch.optim.Adam(net.parameters()))
replay = Replay(100_000, 4, "cuda")
obs, _ = env.reset()
for t in range(1_000_000):
    action = learner.act(obs)
    next_obs, reward, terminated, truncated, _ = env.step(action)
    replay.push(obs, action, reward)
    obs = next_obs if not (terminated or truncated) else env.reset()[0]
    # a learning step every few environment steps: each call is one training step
    if t > 1000 and t % train_every == 0:
        learner.learn(replay)
