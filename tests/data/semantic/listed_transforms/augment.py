import random

import torch
import torch.nn as nn


def to_hsv(images):  # frequency: per-step
    return images.flip(1)


def to_rgb(images):  # frequency: per-step
    return images.flip(1)


def unused(images):  # frequency: once
    return images


class ColorJitter(nn.Module):
    def shift_hue(self, images):  # frequency: per-step
        return images + 0.1

    def transform(self, images):  # frequency: per-step
        steps = [to_hsv, self.shift_hue, to_rgb]  # applied in turn: each runs once per call
        random.shuffle(steps)
        for step in steps:
            images = step(images)
        return images

    def forward(self, images):  # frequency: per-step
        return self.transform(images)


def train(model, loader, optimizer):
    jitter = ColorJitter()
    for images, labels in loader:
        loss = nn.functional.cross_entropy(model(jitter(images.cuda())), labels.cuda())
        loss.backward()
        optimizer.step()
