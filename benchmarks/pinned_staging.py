"""Host data copied to the GPU every step: the copy spellings GPU011 and GPU013 choose between, timed on one GPU.

    python benchmarks/pinned_staging.py [--out results.md]

Each step takes a fresh NumPy array (a pool of 8, so no step reuses the last one's memory), copies it to the
GPU and runs a fixed amount of GPU work that reads it (two 4096x4096 bf16 matrix products, about 0.4 ms on an
H100), with no host sync inside the loop; the time per step is the wall clock over 200 steps, synchronized,
median of 3 runs. "alone" repeats the copy with no GPU work between copies (the host cost of the copy itself).

- pageable: `torch.from_numpy(a).to(dev)`
- pageable, non_blocking: `torch.from_numpy(a).to(dev, non_blocking=True)` (GPU011's fix; the copy from pageable
  memory still blocks the host)
- pinned per call: `torch.from_numpy(a).pin_memory().to(dev, non_blocking=True)` (a pinned copy from PyTorch's
  caching host allocator, which recycles pinned blocks once their copies are done)
- staging x2: two preallocated pinned buffers used in turn, each refilled after an event says its last copy is done
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from results_table import emit  # benchmarks/, the script's own folder

SIZES = (("344 B (43 int64)", (43,), np.int64), ("176 KB (512x43 int64)", (512, 43), np.int64),
         ("4 MB (1024x1024 fp32)", (1024, 1024), np.float32), ("32 MB (8M fp32)", (8 * 1024 * 1024,), np.float32))
STEPS = 200


class Staging:
    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        host = torch.from_numpy(np.zeros(shape, dtype))
        self.buffers = [torch.empty_like(host).pin_memory() for _ in range(2)]
        self.events = [None, None]
        self.turn = 0

    def __call__(self, array: np.ndarray) -> torch.Tensor:
        i, self.turn = self.turn, 1 - self.turn
        if self.events[i] is not None:
            self.events[i].synchronize()
        self.buffers[i].copy_(torch.from_numpy(array))
        out = self.buffers[i].to("cuda", non_blocking=True)
        self.events[i] = torch.cuda.Event()
        self.events[i].record()
        return out


def variants(shape: tuple[int, ...], dtype: np.dtype) -> dict:
    staging = Staging(shape, dtype)
    return {
        "pageable": lambda a: torch.from_numpy(a).to("cuda"),
        "pageable, non_blocking": lambda a: torch.from_numpy(a).to("cuda", non_blocking=True),
        "pinned per call": lambda a: torch.from_numpy(a).pin_memory().to("cuda", non_blocking=True),
        "staging x2": staging,
    }


def run(copy, pool: list[np.ndarray], work: bool, w: torch.Tensor) -> float:
    sink = torch.zeros((), device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(STEPS):
        t = copy(pool[step % len(pool)])
        if work:
            y = w @ w
            y = y @ w
            sink += t.view(-1)[:1].float().sum() + y[0, 0].float()
        else:
            sink += t.view(-1)[:1].float().sum()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / STEPS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}; microseconds per step "
             f"({STEPS} steps, median of 3)", "",
             "| size | variant | with 0.4 ms of GPU work | copy alone |", "| --- | --- | ---: | ---: |"]
    for label, shape, dtype in SIZES:
        rng = np.random.default_rng(0)
        pool = [(rng.standard_normal(shape) * 10).astype(dtype) for _ in range(8)]
        for name, copy in variants(shape, dtype).items():
            for work in (True, False):
                run(copy, pool, work, w)  # warm-up (allocator caches, kernels)
            with_work = statistics.median(run(copy, pool, True, w) for _ in range(3))
            alone = statistics.median(run(copy, pool, False, w) for _ in range(3))
            lines.append(f"| {label} | {name} | {with_work:.1f} | {alone:.1f} |")
            print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
