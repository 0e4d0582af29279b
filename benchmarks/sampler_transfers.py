"""Time of a diffusion sampler's denoising loop with per-step host tensors (GPU015, GPU013) and without, on CUDA.

    python benchmarks/sampler_transfers.py [--steps 1000] [--batch 16] [--size 32] [--repeat 5]

The shape gpulint reports in diffusion samplers of the accuracy benchmark's development repositories: every
denoising step builds its timestep tensor on the CPU and copies it over, `(torch.ones(n) * i).long().to(dev)`
(GPU015), and reads a noise schedule kept as a CPU tensor on the sampler, `self.betas.to(x.device)[t]` (GPU013).
Each copy from pageable memory makes the host wait until the GPU has drained the work queued before it, so the
host can no longer run ahead of the GPU. The fixed loop makes the timestep on the device (`torch.full(...,
device=)`) and keeps the schedule there. Both loops run the same small convolutional denoiser from the same
starting noise with a deterministic (DDIM-like) update, so their outputs must be equal; the script checks that,
then prints the median wall time of a whole sampling run for each and their ratio. Standalone: needs torch only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn


class Denoiser(nn.Module):
    def __init__(self, channels: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, channels)
        self.inp = nn.Conv2d(3, channels, 3, padding=1)
        self.mid = nn.Conv2d(channels, channels, 3, padding=1)
        self.out = nn.Conv2d(channels, 3, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x) + self.embed(t)[:, :, None, None])
        return self.out(torch.relu(self.mid(h)))


class HostSchedule:
    """The sampler as written: schedule on the CPU, timestep built on the CPU, both copied every step."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.alphas = 1.0 - torch.linspace(1e-4, 0.02, steps)

    @torch.no_grad()
    def sample(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        for i in reversed(range(self.steps)):
            t = (torch.ones(n) * i).long().to(x.device)
            alpha = self.alphas.to(x.device)[t][:, None, None, None]
            x = alpha.sqrt() * x - (1 - alpha).sqrt() * model(x, t)
        return x


class DeviceSchedule:
    """The fix: the schedule lives on the device, the timestep is made there."""

    def __init__(self, steps: int, device: torch.device) -> None:
        self.steps = steps
        self.alphas = 1.0 - torch.linspace(1e-4, 0.02, steps, device=device)

    @torch.no_grad()
    def sample(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        for i in reversed(range(self.steps)):
            t = torch.full((n,), i, dtype=torch.long, device=x.device)
            alpha = self.alphas[t][:, None, None, None]
            x = alpha.sqrt() * x - (1 - alpha).sqrt() * model(x, t)
        return x


def run(sampler, model: nn.Module, start: torch.Tensor) -> tuple[float, torch.Tensor]:
    torch.cuda.synchronize()
    began = time.perf_counter()
    out = sampler.sample(model, start.clone())
    torch.cuda.synchronize()
    return time.perf_counter() - began, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = Denoiser().to(device).eval()
    start = torch.randn(args.batch, 3, args.size, args.size, device=device)
    host, fixed = HostSchedule(args.steps), DeviceSchedule(args.steps, device)
    _, expected = run(host, model, start)  # warm-up, and the reference output
    _, got = run(fixed, model, start)
    difference = (expected - got).abs().max().item()
    times: dict[str, list[float]] = {"host tensors per step": [], "made on the device": []}
    for _ in range(args.repeat):  # interleaved, so a noisy spell falls on both
        times["host tensors per step"].append(run(host, model, start)[0])
        times["made on the device"].append(run(fixed, model, start)[0])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {args.steps} steps, batch {args.batch}, "
          f"{args.size}x{args.size}; max |difference| {difference:.2e}")
    baseline = statistics.median(times["host tensors per step"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:24} {median * 1e3:9.1f} ms per sampling run  ({baseline / median:.2f}x)")


if __name__ == "__main__":
    main()
