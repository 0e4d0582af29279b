import torch

from base_agent import BaseAgent


class DQN(BaseAgent):
    def pick_action(self, state):  # frequency: per-rollout-step
        q = self.q_network(torch.from_numpy(state).float().to(self.device))
        return q.argmax().item()

    def learn(self):  # frequency: per-rollout-step
        loss = self.compute_loss(self.memory.sample())
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
