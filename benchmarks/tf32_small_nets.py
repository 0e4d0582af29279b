"""Does TF32 pay on small, launch-bound networks? fp32 against TF32 matmuls on MLP training steps.

    python benchmarks/tf32_small_nets.py [--steps 300] [--rounds 5]

For each (input, width, batch) an actor-critic-sized MLP takes forward, backward and a fused Adam step, timed
per step over `--steps` steps with the two precisions interleaved in `--rounds` rounds (median), and the host
API calls that launch work (kernel launches and memsets) are counted over 10 steps with torch.profiler: the
TF32 kernels cuBLAS picks need no split-K reduction, so the host issues fewer launches per matmul.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaMemsetAsync")


def build(inputs: int, width: int, outputs: int) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, outputs)).cuda()


def steps(net: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, target: torch.Tensor, n: int) -> None:
    for _ in range(n):
        loss = (net(x) - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def set_tf32(enabled: bool) -> None:
    torch.set_float32_matmul_precision("high" if enabled else "highest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| input | width | batch | fp32 ms/step | TF32 ms/step | speed-up | launches/step fp32 | TF32 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for inputs, width, batch in [(8, 64, 64), (8, 256, 256), (8, 256, 2048), (64, 512, 512), (512, 1024, 4096)]:
        torch.manual_seed(0)
        net = build(inputs, width, 5)
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, fused=True)
        x = torch.randn(batch, inputs, device="cuda")
        target = torch.randn(batch, 5, device="cuda")
        times = {False: [], True: []}
        launches = {}
        for enabled in (False, True):
            set_tf32(enabled)
            steps(net, optimizer, x, target, 20)  # warm-up: cuBLAS heuristics, allocator
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU]) as recorder:
                steps(net, optimizer, x, target, 10)
                torch.cuda.synchronize()
            launches[enabled] = sum(e.count for e in recorder.key_averages() if e.key in _LAUNCHES) / 10
        for _ in range(args.rounds):
            for enabled in (False, True):
                set_tf32(enabled)
                torch.cuda.synchronize()
                start = time.perf_counter()
                steps(net, optimizer, x, target, args.steps)
                torch.cuda.synchronize()
                times[enabled].append((time.perf_counter() - start) / args.steps * 1e3)
        fp32, tf32 = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {inputs} | {width} | {batch} | {fp32:.3f} | {tf32:.3f} | {fp32 / tf32:.2f}x | "
              f"{launches[False]:.0f} | {launches[True]:.0f} |")
    set_tf32(False)


if __name__ == "__main__":
    main()
