"""Hand-optimised twin of selfplay.py: same game, search, network and losses. The games of an iteration are
played in lockstep, so each simulation step evaluates the leaves of all games in one batched forward (one
copy in, one copy out) under inference mode; each game keeps its own random stream, so every game's search
is the one the original runs. Training gathers batches from a GPU copy of the replay buffer, in bf16
autocast with TF32, fused AdamW, and reads the loss once per iteration.

    python selfplay.py [--device cuda|cpu] [--small]
"""
import argparse
import math
import random
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS, COLS = 6, 7
CELLS = ROWS * COLS


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class ConnectFour:
    def __init__(self):
        self.board = np.zeros((ROWS, COLS), dtype=np.int8)
        self.heights = np.zeros(COLS, dtype=np.int64)
        self.player = 1
        self.n_moves = 0
        self.winner = 0

    def clone(self):
        game = ConnectFour.__new__(ConnectFour)
        game.board, game.heights = self.board.copy(), self.heights.copy()
        game.player, game.n_moves, game.winner = self.player, self.n_moves, self.winner
        return game

    def legal(self):
        return self.heights < ROWS

    def done(self):
        return self.winner != 0 or self.n_moves == CELLS

    def play(self, col):
        row = self.heights[col]
        self.board[row, col] = self.player
        self.heights[col] += 1
        self.n_moves += 1
        for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
            count = 1
            for sign in (1, -1):
                r, c = row + sign * dr, col + sign * dc
                while 0 <= r < ROWS and 0 <= c < COLS and self.board[r, c] == self.player:
                    count += 1
                    r, c = r + sign * dr, c + sign * dc
            if count >= 4:
                self.winner = self.player
        self.player = -self.player

    def encode(self):
        """Tokens (0 CLS, 1 own stone, 2 opponent stone, 0 empty), padding mask (empty cells), legal moves."""
        cells = self.board.reshape(-1) * self.player
        tokens = np.concatenate([[0], np.where(cells == 1, 1, np.where(cells == -1, 2, 0))]).astype(np.int64)
        pad = np.concatenate([[False], cells == 0])
        return tokens, pad, self.legal()


class PolicyValueNet(nn.Module):
    def __init__(self, d_model, n_head, n_layer):
        super().__init__()
        self.tok = nn.Embedding(3, d_model)
        self.pos = nn.Parameter(torch.randn(1, CELLS + 1, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.policy = nn.Linear(d_model, COLS)
        self.value = nn.Sequential(nn.Linear(d_model, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, tokens, pad, legal):
        x = self.tok(tokens) + self.pos
        h = self.encoder(x, src_key_padding_mask=pad)[:, 0]
        logits = self.policy(h)
        logits = logits.masked_fill(~legal, float("-inf"))
        return logits, torch.tanh(self.value(h)).squeeze(-1)


class Node:
    __slots__ = ("prior", "children", "visits", "value_sum")

    def __init__(self, prior):
        self.prior, self.children, self.visits, self.value_sum = prior, {}, 0, 0.0

    def q(self):
        return self.value_sum / self.visits if self.visits else 0.0


def evaluate_batch(net, games, device):
    encoded = [game.encode() for game in games]
    host = np.stack([np.concatenate([tokens, pad, legal]) for tokens, pad, legal in encoded]).astype(np.int64)
    host = torch.from_numpy(host)
    if device.type == "cuda":
        host = host.pin_memory()
    packed = host.to(device, non_blocking=True)
    tokens, pad, legal = packed[:, :CELLS + 1], packed[:, CELLS + 1:2 * CELLS + 2].bool(), packed[:, 2 * CELLS + 2:].bool()
    with torch.inference_mode():
        logits, value = net(tokens, pad, legal)
        out = torch.cat([F.softmax(logits, dim=-1), value[:, None]], dim=1).cpu().numpy()
    return out[:, :COLS], out[:, COLS]


def expand(node, game, priors):
    for col in np.nonzero(game.legal())[0]:
        node.children[int(col)] = Node(float(priors[col]))


def select(node, c_puct=1.5):
    sqrt_total = math.sqrt(node.visits)
    best, best_score = None, -1e9
    for col, child in node.children.items():
        score = child.q() + c_puct * child.prior * sqrt_total / (1 + child.visits)
        if score > best_score:
            best, best_score = col, score
    return best, node.children[best]


def search_batch(net, games, sims, device, rngs):
    roots = [Node(1.0) for _ in games]
    priors, _ = evaluate_batch(net, games, device)
    for root, game, prior, rng in zip(roots, games, priors, rngs):
        expand(root, game, prior)
        noise = rng.dirichlet([0.5] * len(root.children))
        for child, eps in zip(root.children.values(), noise):
            child.prior = 0.75 * child.prior + 0.25 * eps
    for _ in range(sims):
        leaves = []
        for root, game in zip(roots, games):
            node, scratch, path = root, game.clone(), [root]
            while node.children and not scratch.done():
                col, node = select(node)
                scratch.play(col)
                path.append(node)
            if scratch.done():
                backup(path, -1.0 if scratch.winner else 0.0)
            else:
                leaves.append((node, scratch, path))
        if leaves:
            priors, values = evaluate_batch(net, [scratch for _, scratch, _ in leaves], device)
            for (node, scratch, path), prior, value in zip(leaves, priors, values):
                expand(node, scratch, prior)
                backup(path, float(value))
    policies = []
    for root in roots:
        visits = np.zeros(COLS, dtype=np.float32)
        for col, child in root.children.items():
            visits[col] = child.visits
        policies.append(visits / visits.sum())
    return policies


def backup(path, value):
    for visited in reversed(path):
        value = -value
        visited.value_sum += value
        visited.visits += 1


def play_games(net, sims, device, rngs):
    games = [ConnectFour() for _ in rngs]
    histories = [[] for _ in rngs]
    while True:
        active = [i for i, game in enumerate(games) if not game.done()]
        if not active:
            break
        policies = search_batch(net, [games[i] for i in active], sims, device, [rngs[i] for i in active])
        for i, pi in zip(active, policies):
            game = games[i]
            histories[i].append((*game.encode(), pi, game.player))
            col = int(rngs[i].choice(COLS, p=pi)) if game.n_moves < 8 else int(np.argmax(pi))
            game.play(col)
    samples = []
    for game, history in zip(games, histories):
        samples.extend((tokens, pad, legal, pi, game.winner * player) for tokens, pad, legal, pi, player in history)
    return samples


def main():
    args = get_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if args.small:
        d_model, n_head, n_layer, games, sims, iterations, steps, batch_size = 32, 2, 1, 2, 4, 1, 4, 16
    else:
        d_model, n_head, n_layer, games, sims, iterations, steps, batch_size = 256, 8, 4, 8, 24, 2, 150, 512
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    net = PolicyValueNet(d_model, n_head, n_layer).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4, fused=cuda)
    buffer = []
    losses = []
    start = time.time()
    for iteration in range(iterations):
        net.eval()
        rngs = [np.random.default_rng(args.seed * 10_000 + iteration * 100 + g) for g in range(games)]
        buffer.extend(play_games(net, sims, device, rngs))
        net.train()
        all_tokens = torch.from_numpy(np.stack([b[0] for b in buffer])).to(device)
        all_pad = torch.from_numpy(np.stack([b[1] for b in buffer])).to(device)
        all_legal = torch.from_numpy(np.stack([b[2] for b in buffer])).to(device)
        all_pi = torch.from_numpy(np.stack([b[3] for b in buffer])).to(device)
        all_z = torch.tensor([b[4] for b in buffer], dtype=torch.float32).to(device)
        sampler = np.random.default_rng(args.seed + iteration)
        step_losses = torch.zeros(steps, device=device)
        for step in range(steps):
            idx = torch.from_numpy(sampler.integers(0, len(buffer), size=batch_size))
            if cuda:
                idx = idx.pin_memory()
            idx = idx.to(device, non_blocking=True)
            tokens, pad, legal, pi, z = all_tokens[idx], all_pad[idx], all_legal[idx], all_pi[idx], all_z[idx]
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cuda):
                logits, value = net(tokens, pad, legal)
                log_p = F.log_softmax(logits.float(), dim=-1).masked_fill(~legal, 0.0)
                policy_loss = -(pi * log_p).sum(dim=-1).mean()
                value_loss = F.mse_loss(value.float(), z)
                loss = policy_loss + value_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step_losses[step] = loss.detach()
        losses.extend(step_losses.tolist())
        print(f"iteration {iteration}: positions {len(buffer)} loss {np.mean(losses[-steps:]):.4f}")
    final = sum(losses[-20:]) / len(losses[-20:])
    print(f"final loss {final:.4f}")
    print(f"train time {time.time() - start:.3f}s")


if __name__ == "__main__":
    main()
