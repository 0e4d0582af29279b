import numpy as np


class Noise:
    def __init__(self, size):
        self.size = size

    def get_action(self, action):  # frequency: once
        return action + np.random.normal(size=self.size)
