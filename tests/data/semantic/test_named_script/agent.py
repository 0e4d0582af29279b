import torch


class Agent:
    def __init__(self, actor, device):
        self.actor = actor.to(device)
        self.device = device

    def get_action(self, obs):  # frequency: per-rollout-step
        state = torch.as_tensor(obs, device=self.device).unsqueeze(0)
        return self.actor(state).squeeze(0).cpu().detach().numpy()
