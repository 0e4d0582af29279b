import argparse

import gym

import ddpg
import sac


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", default="sac")
    args = parser.parse_args()
    env = gym.make("Pendulum-v1")
    # both modules name their class `Agent`: each construction means its own module's class
    if args.algo == "sac":
        agent = sac.Agent(env.observation_space.shape[0])
    else:
        agent = ddpg.Agent(env.observation_space.shape[0])
    obs, _ = env.reset()
    for step in range(100_000):
        action = agent.act(obs)
        obs, reward, done, truncated, _ = env.step(action)
        if done or truncated:
            obs, _ = env.reset()


if __name__ == "__main__":
    main()
