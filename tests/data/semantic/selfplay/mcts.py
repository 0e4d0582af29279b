import torch


def encode(state):  # frequency: per-rollout-step
    return torch.from_numpy(state.planes())


def play_move(net, state, device):  # frequency: per-rollout-step
    x = encode(state).to(device)
    logits, value = net(x.unsqueeze(0))
    return sample(logits), value.item()


def sample(logits):  # frequency: per-rollout-step
    return torch.distributions.Categorical(logits=logits).sample().item()
