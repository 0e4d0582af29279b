import torch


class ComputeLoss:
    def __init__(self, model):
        self.model = model

    def __call__(self, p, targets):  # device-params: targets
        # `compute_loss(pred, targets)` calls an instance: `p` is the first argument, `targets` the second
        tcls, indices = self.build_targets(p, targets)  # `targets` handed on unchanged
        targets = targets[targets[:, 1] > 0]  # rebound after the call: the call above still passed the parameter
        return self.score(p, targets) + tcls.sum()

    def build_targets(self, p, targets):  # device-params: targets
        keep = targets[:, 0] >= 0
        return targets[keep], keep.nonzero()

    def score(self, p, targets):  # device-params: none (a rebound parameter is not followed)
        return (p[0] - targets).pow(2).mean()
