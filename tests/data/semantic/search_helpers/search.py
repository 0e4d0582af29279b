"""A tree search whose simulation loop only calls its own helpers; one of them asks the model object for an
inference. Each helper call is one network evaluation, so the loop runs per search step, and the search runs once
per move of the game loop (`environment.policy_step(...)` steps the game)."""
import torch


class TreeSearch:
    def __init__(self, simulations):
        self.simulations = simulations

    def expand_leaf(self, leaf):  # frequency: per-rollout-step
        return self.model.dynamics_inference(leaf.state, leaf.action)

    def run(self, root, model):  # frequency: per-rollout-step
        self.model = model
        for simulation in range(self.simulations):
            leaf = root.select()
            reward, state = self.expand_leaf(leaf)
            leaf.backup(reward, state)
        return root


def play_game(environment, tree_search, model):  # frequency: once
    while not environment.terminal:
        root = tree_search.run(environment.root(), model)
        environment.policy_step(root.best_action())


class Seeds:
    def __init__(self, seed):
        self.generator = torch.Generator().manual_seed(seed)


def make_rng(seed):  # frequency: per-iteration
    return Seeds(seed)


def store(batch, out):  # frequency: per-iteration
    out.extend(batch.cpu().numpy())


def sample_images(sampler, count):  # frequency: once
    """Building a random generator per batch is no network evaluation: this loop is no rollout."""
    out = []
    while len(out) < count:
        store(sampler(make_rng(len(out))), out)
    return out
