import gym
import torch

from agent import Agent
from loops import train

env = gym.make("Pendulum-v1")
agent = Agent(torch.nn.Linear(3, 1), torch.device("cuda"))
train(env, agent, 50, 500)
