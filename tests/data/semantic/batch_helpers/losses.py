import torch


def _moved(tensor, device):  # batch-params: tensor
    return tensor.to(device)


def batch_loss(model, images, labels, device):  # batch-params: images-labels
    return torch.nn.functional.cross_entropy(model(_moved(images, device)), _moved(labels, device))
