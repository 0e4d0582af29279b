"""AlphaZero-style self-play on Connect Four: PUCT tree search guided by a small masked transformer encoder
(attention only over the stones on the board), then training on the games played.

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
        logits[~legal] = float("-inf")
        return logits, torch.tanh(self.value(h)).squeeze(-1)


class Node:
    __slots__ = ("prior", "children", "visits", "value_sum")

    def __init__(self, prior):
        self.prior, self.children, self.visits, self.value_sum = prior, {}, 0, 0.0

    def q(self):
        return self.value_sum / self.visits if self.visits else 0.0


def evaluate(net, game, device):
    tokens, pad, legal = game.encode()
    tokens = torch.from_numpy(tokens).unsqueeze(0).to(device)
    pad = torch.from_numpy(pad).unsqueeze(0).to(device)
    legal = torch.from_numpy(legal).unsqueeze(0).to(device)
    with torch.no_grad():
        logits, value = net(tokens, pad, legal)
    priors = F.softmax(logits, dim=-1)[0].cpu().numpy()
    return priors, value.item()


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


def search(net, game, sims, device, rng):
    root = Node(1.0)
    priors, _ = evaluate(net, game, device)
    expand(root, game, priors)
    noise = rng.dirichlet([0.5] * len(root.children))
    for child, eps in zip(root.children.values(), noise):
        child.prior = 0.75 * child.prior + 0.25 * eps
    for _ in range(sims):
        node, scratch, path = root, game.clone(), [root]
        while node.children and not scratch.done():
            col, node = select(node)
            scratch.play(col)
            path.append(node)
        if scratch.done():
            value = -1.0 if scratch.winner else 0.0  # the player to move has lost (or a draw)
        else:
            priors, value = evaluate(net, scratch, device)
            expand(node, scratch, priors)
        for visited in reversed(path):
            value = -value
            visited.value_sum += value
            visited.visits += 1
    visits = np.zeros(COLS, dtype=np.float32)
    for col, child in root.children.items():
        visits[col] = child.visits
    return visits / visits.sum()


def play_game(net, sims, device, rng):
    game, history = ConnectFour(), []
    while not game.done():
        pi = search(net, game, sims, device, rng)
        history.append((*game.encode(), pi, game.player))
        col = int(rng.choice(COLS, p=pi)) if game.n_moves < 8 else int(np.argmax(pi))
        game.play(col)
    return [(tokens, pad, legal, pi, game.winner * player) for tokens, pad, legal, pi, player in history]


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
    net = PolicyValueNet(d_model, n_head, n_layer).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4)
    buffer = []
    losses = []
    start = time.time()
    for iteration in range(iterations):
        net.eval()
        for g in range(games):
            rng = np.random.default_rng(args.seed * 10_000 + iteration * 100 + g)
            buffer.extend(play_game(net, sims, device, rng))
        net.train()
        sampler = np.random.default_rng(args.seed + iteration)
        for step in range(steps):
            idx = sampler.integers(0, len(buffer), size=batch_size)
            tokens = torch.from_numpy(np.stack([buffer[i][0] for i in idx])).to(device)
            pad = torch.from_numpy(np.stack([buffer[i][1] for i in idx])).to(device)
            legal = torch.from_numpy(np.stack([buffer[i][2] for i in idx])).to(device)
            pi = torch.from_numpy(np.stack([buffer[i][3] for i in idx])).to(device)
            z = torch.tensor([buffer[i][4] for i in idx], dtype=torch.float32).to(device)
            logits, value = net(tokens, pad, legal)
            log_p = F.log_softmax(logits, dim=-1).masked_fill(~legal, 0.0)
            policy_loss = -(pi * log_p).sum(dim=-1).mean()
            value_loss = F.mse_loss(value, z)
            loss = policy_loss + value_loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        print(f"iteration {iteration}: positions {len(buffer)} loss {np.mean(losses[-steps:]):.4f}")
    final = sum(losses[-20:]) / len(losses[-20:])
    print(f"final loss {final:.4f}")
    print(f"train time {time.time() - start:.3f}s")


if __name__ == "__main__":
    main()
