import numpy as np


class OrnsteinUhlenbeck:
    def sample(self):  # frequency: once
        return np.random.normal()
