"""Where does low precision pay? Time one training step (forward, backward, SGD update) of a 3-layer MLP of
width w on r rows in fp32, TF32 and bf16 autocast, and print the speed-ups against the work of the largest GEMM
(r x w x w multiply-adds). The threshold in gpulint/network_size.py (WORK_PAYS) comes from this table.

    python benchmarks/e2e/precision_sweep.py
"""
import torch
import torch.nn as nn

CASES = [(100, 512), (256, 256), (1024, 256), (4096, 256), (600, 1024), (20, 1024), (4096, 512), (16384, 256),
         (22016, 256), (8192, 1024)]


def step_time(rows, width, mode, reps=50):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, width)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(rows, width, device="cuda"), torch.randn(rows, width, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps * 1000)
    torch.backends.cuda.matmul.allow_tf32 = False
    return sorted(times)[len(times) // 2]


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: one MLP training step, median of 5 x 50")
    print("| rows | width | GEMM multiply-adds | fp32 us | TF32 speed-up | bf16 autocast speed-up |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for rows, width in CASES:
        fp32, tf32, bf16 = (step_time(rows, width, m) for m in ("fp32", "tf32", "bf16"))
        print(f"| {rows} | {width} | {rows * width * width:.1e} | {fp32:.0f} | {fp32 / tf32:.2f}x | {fp32 / bf16:.2f}x |")


if __name__ == "__main__":
    main()
