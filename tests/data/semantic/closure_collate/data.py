import torch
from torch.utils.data import DataLoader


def encode_batch(batch, vocab, device):  # frequency: per-step
    ids = [torch.tensor(vocab(text), dtype=torch.int64, device=device) for text in batch]
    return torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)


def make_loader(dataset, vocab, device):  # frequency: once
    def collate(batch):  # frequency: per-step
        return encode_batch(batch, vocab, device)

    return DataLoader(dataset, batch_size=32, shuffle=True, collate_fn=collate)
