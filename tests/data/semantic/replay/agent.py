import torch


class Learner:
    def __init__(self, q_net, target_net, optimizer):
        self.q_net, self.target_net, self.optimizer = q_net, target_net, optimizer
        self.updates = 0

    def act(self, obs):
        with torch.no_grad():
            return self.q_net(torch.as_tensor(obs).unsqueeze(0)).argmax().item()

    def learn(self, replay):  # one training step per call: what it calls runs once per step
        obs, actions, rewards = replay.sample_batch(64)
        q = self.q_net(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = torch.nn.functional.smooth_l1_loss(q, rewards)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        if self.updates % 1000 == 0:
            self.sync()

    def sync(self):  # frequency: once
        self.target_net.load_state_dict(self.q_net.state_dict())


def fit_critic(critic, states, returns, minimize):
    """A closure handed to an optimizer routine, which calls it once per iteration."""
    def value_loss(flat_params):  # frequency: per-step
        critic.load_flat(flat_params)
        loss = (critic(states) - returns).pow(2).mean()
        loss.backward()
        return report(loss), critic.flat_grad()

    return minimize(value_loss, critic.flat())


def report(loss):  # frequency: per-step
    return loss.item()
