"""Profile one method of a training script's class on the device: where the host time of its calls goes.

    python benchmarks/e2e/profile_method.py SCRIPT Class.method [--warmup 5] [--calls 3] [-- SCRIPT_ARGS]

Runs the script's `main()` with the method wrapped: after `--warmup` calls, the next `--calls` are recorded
with torch.profiler, and the 25 operators with the most host time are printed (then the script goes on).
`--json FILE` also writes every operator's calls and self host/device time, for comparing two versions.
"""
import argparse
import importlib.util
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    argv = sys.argv[1:]
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser()
    parser.add_argument("script")
    parser.add_argument("method")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--json", help="write per-operator calls and self times (us) here")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    spec = importlib.util.spec_from_file_location("script", args.script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    class_name, method_name = args.method.split(".")
    owner = getattr(module, class_name)
    inner = getattr(owner, method_name)
    calls = {"n": 0}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    recorder = profile(activities=activities)

    def wrapped(*call_args, **kwargs):
        calls["n"] += 1
        if calls["n"] == args.warmup + 1:
            recorder.__enter__()
        result = inner(*call_args, **kwargs)
        if calls["n"] == args.warmup + args.calls:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            recorder.__exit__(None, None, None)
            averages = recorder.key_averages()
            print(averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=40))
            if args.json:
                rows = {event.key: {"calls": event.count, "self_cpu_us": event.self_cpu_time_total,
                                    "self_device_us": getattr(event, "self_device_time_total", 0)}
                        for event in averages}
                with open(args.json, "w") as out:
                    json.dump(rows, out, indent=0)
        return result
    setattr(owner, method_name, wrapped)
    sys.argv = [args.script, *script_args]
    module.main()


if __name__ == "__main__":
    main()
