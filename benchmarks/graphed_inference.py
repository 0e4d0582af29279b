"""Is single-position inference in a tree search launch-bound, and what removes the launches?

Plays the same self-play games of benchmarks/e2e/scripts/selfplay.py with its per-leaf `evaluate` as written,
with the network call routed through the `cuda_graph_inference` helper that GPU076's fix adds (a CUDA graph
captured once per input shape), and with `torch.compile(mode="reduce-overhead")` on a second handle of the
network (`--with-compile`); prints seconds per game and whether the visit distributions match. First checks
the helper's edge cases on CUDA (a forward that syncs, weights that move, train/eval mode).

    python benchmarks/graphed_inference.py [--games 2] [--sims 24] [--skip-edge-checks --with-compile]
"""
import argparse
import importlib.util
import pathlib
import sys
import time
import warnings
import weakref

import numpy as np
import torch

SCRIPT = pathlib.Path(__file__).parent / "e2e" / "scripts" / "selfplay.py"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # the checkout's rules/


def load_selfplay():
    spec = importlib.util.spec_from_file_location("selfplay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shipped_helper():
    """The `cuda_graph_inference` function GPU076's fix adds to a file, compiled from the rule's source."""
    from rules.launch_bound_inference import helper_source

    namespace = {"torch": torch, "weakref": weakref, "warnings": warnings}
    exec(helper_source("torch"), namespace)
    return namespace["cuda_graph_inference"]


class _SyncingNet(torch.nn.Module):
    """A forward that reads a value on the host: it cannot be captured, so the helper must run it eagerly."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.linear(x)
        return y * 2 if y.sum().item() > 0 else y


def check_helper_edges(graph_call, device):
    """The helper's promises on CUDA: equal outputs, kept outputs not overwritten by later replays, eager
    fallback for a forward that syncs, a new capture after the weights move, a layer or parameter is replaced or the
    mode changes; loaded weights are read."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Dropout(0.5), torch.nn.Linear(64, 4)).to(device).eval()
    a, b = torch.randn(1, 16, device=device), torch.randn(1, 16, device=device)
    with torch.no_grad():
        first = graph_call(net, a)
        second = graph_call(net, b)
        assert torch.equal(first, net(a)) and torch.equal(second, net(b)), "replay differs from eager"
        syncing = _SyncingNet().to(device)
        assert torch.equal(graph_call(syncing, a), syncing(a)), "fallback differs from eager"
        net.cpu().to(device)  # new weight storage: the old graph would read freed memory
        assert torch.equal(graph_call(net, a), net(a)), "stale graph after the weights moved"
        net.load_state_dict({k: v + 1 for k, v in net.state_dict().items()})  # copied into the same storage
        assert torch.equal(graph_call(net, a), net(a)), "stale weights after load_state_dict"
        net[2] = torch.nn.Linear(64, 4).to(device)  # a new layer (a registration the helper hears of)
        assert torch.equal(graph_call(net, a), net(a)), "stale graph after a layer was replaced"
        net[0]._parameters["weight"] = torch.nn.Parameter(net[0].weight * 2)  # replaced without a registration
        assert torch.equal(graph_call(net, a), net(a)), "stale graph after a parameter was replaced"
        net.train()
        torch.manual_seed(1)
        trained = graph_call(net, a)
        assert not torch.equal(trained, first), "train mode (dropout) replayed the eval graph"
        net.eval()
    print("helper edge checks passed: equal outputs, kept outputs intact, eager fallback, loaded weights, recapture on "
          "move/replaced layer/replaced parameter/mode")


def play(sp, network, games, sims, device):
    """Self-play with the script's own search and `evaluate`, which calls `network(tokens, pad, legal)`."""
    policies, start = [], time.perf_counter()
    for g in range(games):
        rng = np.random.default_rng(g)
        policies.extend(pi for *_, pi, _ in sp.play_game(network, sims, device, rng))
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / games, policies


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--games", type=int, default=2)
    parser.add_argument("--sims", type=int, default=24)
    parser.add_argument("--skip-edge-checks", action="store_true")
    parser.add_argument("--with-compile", action="store_true",
                        help="also time torch.compile(mode='reduce-overhead') (run it without the helper's edge checks: "
                             "its CUDA-graph trees and the helper's graphs in one process ended in an illegal memory "
                             "access on an H200, torch 2.11)")
    args = parser.parse_args()
    sp = load_selfplay()
    device = torch.device("cuda")
    torch.manual_seed(0)
    net = sp.PolicyValueNet(256, 8, 4).to(device).eval()
    graph_call = shipped_helper()
    if not args.skip_edge_checks:
        check_helper_edges(graph_call, device)
    # each variant stands in for the network in the script's own `evaluate`
    variants = [("eager", net), ("cuda graph (GPU076 fix)", lambda *inputs: graph_call(net, *inputs))]
    if args.with_compile:
        variants.append(("compile reduce-overhead", torch.compile(net, mode="reduce-overhead")))
    # warm-up: one short game each (captures, compiles)
    for name, fn in variants:
        start = time.perf_counter()
        play(sp, fn, 1, 2, device)
        print(f"warm-up {name}: {time.perf_counter() - start:.1f}s", flush=True)
    reference = None
    for round_ in range(2):
        for name, fn in variants:
            print(f"round {round_} {name} ...", flush=True)
            seconds, policies = play(sp, fn, args.games, args.sims, device)
            if reference is None:
                reference = policies
            same = len(policies) == len(reference) and all(np.allclose(a, b) for a, b in zip(policies, reference))
            print(f"round {round_} {name:26s} {seconds:7.3f} s/game  same visits as eager: {same}", flush=True)
    print(torch.cuda.get_device_name(), torch.__version__)


if __name__ == "__main__":
    main()
