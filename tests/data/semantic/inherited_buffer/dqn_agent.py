from base_agent import BaseAgent


class DQNAgent(BaseAgent):
    def learn(self):  # frequency: per-step
        states = self.memory.sample(32)
        loss = self.net(states).pow(2).mean()
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
