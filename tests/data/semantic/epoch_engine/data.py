from torch.utils.data import DataLoader


def load_data(dataset, batch_size):
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=4, drop_last=True)  # feeds-training: no, per-epoch: yes
    while True:
        yield from loader


def one_pass(dataset):
    loader = DataLoader(dataset, batch_size=64, num_workers=4)  # feeds-training: no, per-epoch: no
    yield from loader
