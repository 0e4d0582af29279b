"""A single-file PPO: the iteration loop collects, bootstraps a value, updates and logs once per iteration."""
import torch


def compute_returns(rewards, next_value, gamma):  # frequency: per-iteration
    return rewards.cumsum(0) + gamma * next_value


def train(agent, envs, optimizer, writer, num_iterations, num_steps, epochs):
    obs = envs.reset()
    for iteration in range(num_iterations):  # hot: none
        for step in range(num_steps):  # hot: rollout
            with torch.no_grad():
                action, value = agent.get_action_and_value(obs)
            obs, reward, done, info = envs.step(action.cpu().numpy())
        next_value = agent.get_value(obs)
        returns = compute_returns(torch.as_tensor(reward), next_value, 0.99)
        for epoch in range(epochs):  # hot: step-loop
            loss = agent.loss(obs, returns)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        writer.add_scalar("loss", loss.item(), iteration)
