import torch

from storage import Rollouts


def relabel(rollouts, discriminator, step):  # frequency: per-rollout-step
    return discriminator(rollouts.obs[step]).cpu().numpy()


def learn(model, rollouts, optimizer):  # frequency: per-iteration
    for minibatch in rollouts.minibatches():  # hot: step-loop
        loss = model(minibatch).mean()
        loss.backward()
        optimizer.step()


def main(model, discriminator, envs, optimizer, updates, num_steps):
    rollouts = Rollouts(num_steps)
    for update in range(updates):
        for step in range(num_steps):  # hot: rollout
            rollouts.rewards[step] = relabel(rollouts, discriminator, step)
        learn(model, rollouts, optimizer)
