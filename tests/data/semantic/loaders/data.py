from torch.utils.data import DataLoader
from torchvision import datasets


def get_loaders(root, batch_size):
    train_set = datasets.ImageFolder(root + "/train")
    val_set = datasets.ImageFolder(root + "/val")
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True)  # feeds-training: yes, per-epoch: yes
    val_loader = DataLoader(val_set, batch_size=batch_size)  # feeds-training: no, per-epoch: yes
    return train_loader, val_loader


def calibration_loader(root):
    return DataLoader(datasets.ImageFolder(root + "/calib"), batch_size=16)  # feeds-training: no, per-epoch: no


def pretraining_loader(root):
    return DataLoader(datasets.ImageFolder(root + "/pretrain"), batch_size=16)  # feeds-training: yes
