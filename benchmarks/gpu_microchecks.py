"""Run every rule's micro-check on a GPU and write the measured table (markdown).

    python benchmarks/gpu_microchecks.py --out benchmarks/results/gpu_microchecks.md

Each row: equivalence of original vs rewritten code, graph breaks before->after (torch._dynamo.explain),
synchronizing calls before->after (torch.cuda.set_sync_debug_mode), and the speed-up of the rewrite (CUDA
events, 5 warm-up runs, median of 30, on the check's `perf_setup` sizes when it has them). Numbers are
measured here, never typed in.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rules_from_checkout() -> None:
    """Make `gpulint.rules` importable from the checkout's rules/ without installing (the GPU machine)."""
    import importlib.util

    import gpulint

    try:
        importlib.import_module("gpulint.rules")
    except ModuleNotFoundError:
        spec = importlib.util.spec_from_file_location("gpulint.rules", ROOT / "rules" / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / "rules")])
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpulint.rules"] = module
        spec.loader.exec_module(module)
        gpulint.rules = module


_rules_from_checkout()

import torch  # noqa: E402

from gpulint.registry import all_rules  # noqa: E402
from gpulint.verify import render_table, run_check  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    rules = [r for r in all_rules() if r.micro_check is not None and r.micro_check.before]
    results = [run_check(rule, args.device) for rule in rules]
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    header = (f"Measured on {card}, torch {torch.__version__}, {datetime.date.today().isoformat()} "
              f"(`python benchmarks/gpu_microchecks.py`).\n\n")
    table = header + render_table(results)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
