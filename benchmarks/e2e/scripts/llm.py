"""LLM-style pre-training loop: a small GPT on a synthetic token stream, AMP the way older tutorials wrote it.

    python llm.py [--device cuda|cpu] [--small]
"""
import argparse
import math
import random
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        attn = F.softmax(scores, dim=-1)
        out = torch.matmul(attn, v)
        out = out.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(out)


class Block(nn.Module):
    def __init__(self, d_model, n_head, block_size):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, block_size)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size, d_model, n_head, n_layer, block_size):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.blocks = nn.Sequential(*[Block(d_model, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx, targets):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        x = self.blocks(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_corpus(n_tokens, vocab_size, seed):
    """A first-order Markov chain with a few likely successors per token: learnable, not trivial."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab_size, size=(vocab_size, 4))
    tokens = np.empty(n_tokens, dtype=np.int64)
    tokens[0] = 0
    choice = rng.integers(0, 4, size=n_tokens)
    noise = rng.random(n_tokens) < 0.1
    random_tokens = rng.integers(0, vocab_size, size=n_tokens)
    for i in range(1, n_tokens):
        tokens[i] = random_tokens[i] if noise[i] else successors[tokens[i - 1], choice[i]]
    return torch.from_numpy(tokens)


def get_batch(data, batch_size, block_size, device):
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    x, y = x.to(device), y.to(device)
    return x, y


def main():
    args = get_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if args.small:
        vocab, d_model, n_head, n_layer, block, batch, steps = 64, 32, 2, 1, 16, 4, 6
    else:
        vocab, d_model, n_head, n_layer, block, batch, steps = 512, 512, 8, 6, 256, 32, 400
    data = make_corpus(200_000 if not args.small else 5_000, vocab, args.seed)
    model = GPT(vocab, d_model, n_head, n_layer, block).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    scaler = torch.cuda.amp.GradScaler(enabled=device.type == "cuda")

    start = time.time()
    losses = []
    for step in range(steps):
        x, y = get_batch(data, batch, block, device)
        with torch.cuda.amp.autocast(enabled=device.type == "cuda"):
            loss = model(x, y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
        if step % 100 == 0:
            print(f"step {step}: loss {loss.item():.4f}")
    final = sum(losses[-20:]) / len(losses[-20:])
    print(f"final loss {final:.4f}")
    print(f"train time {time.time() - start:.3f}s")


if __name__ == "__main__":
    main()
