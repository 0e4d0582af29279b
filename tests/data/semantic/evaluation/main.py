"""Evaluation every N steps: its loops run many times per call, but the calls are rare."""
import torch


class Agent:
    def act(self, obs):  # frequency: per-rollout-step
        return self.online_net(obs).argmax().item()

    def evaluate_q(self, state):  # frequency: once
        return self.online_net(state.unsqueeze(0)).max().item()

    def learn(self, batch, optimizer):  # frequency: per-rollout-step
        loss = self.online_net(batch).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test(agent, val_states):  # frequency: once
    return [agent.evaluate_q(state) for state in val_states]


def sample_text(model, idx, steps):  # frequency: once
    for _ in range(steps):  # hot: none
        logits = model(idx)
        idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
    return idx


def main(agent, env, memory, optimizer, model, val_states, total_steps):
    obs = env.reset()
    for step in range(total_steps):  # hot: step-loop
        obs, reward, done, info = env.step(agent.act(obs))
        agent.learn(memory.sample(), optimizer)
        if step % 1000 == 0:
            test(agent, val_states)
            sample_text(model, obs, 32)
