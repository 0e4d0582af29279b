class Rollouts:
    def __init__(self, num_steps):  # frequency: once
        self.num_steps = num_steps

    def minibatches(self):  # frequency: per-iteration
        return []
