import numpy as np


class GaussianNoise:
    def __init__(self, scale):
        self.scale = scale

    def sample(self, size):  # frequency: once
        return np.random.normal(scale=self.scale, size=size)
