"""Start-up and small-run wall times of gpulint against ruff, same run, interleaved rounds.

    python benchmarks/startup.py SMALL_REPO [--ruff PATH] [--repeat 7]

Times `gpulint --version`, `gpulint check` on an empty folder, a warm `gpulint check SMALL_REPO` (results cache
filled by a first run) and `ruff check --select ALL --no-cache SMALL_REPO` (ruff cold), plus `ruff --version`.
Every command runs once per round, so a noisy spell of a shared machine falls on all of them. Python's own
byte-code cache is allowed (PYTHONDONTWRITEBYTECODE is removed from the environment, as on a user's machine),
and a priming round is not counted. Prints a Markdown table with medians and the ratio to ruff cold.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--ruff", default=shutil.which("ruff") or "ruff")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("GPULINT_")}
    gpulint = [sys.executable, "-m", "gpulint"]
    with tempfile.TemporaryDirectory(prefix="gpulint-startup-") as scratch:
        empty = Path(scratch) / "empty"
        empty.mkdir()
        repo = Path(scratch) / "repo"
        shutil.copytree(args.repo, repo, ignore=shutil.ignore_patterns(".gpulint_cache", "__pycache__", ".git"))
        commands = {
            "gpulint --version": (gpulint + ["--version"], empty),
            "gpulint check (empty folder)": (gpulint + ["check", "."], empty),
            f"gpulint check {args.repo.name} (warm cache)": (gpulint + ["check", ".", "-q"], repo),
            f"ruff check --select ALL --no-cache {args.repo.name} (cold)":
                ([args.ruff, "check", "--select", "ALL", "--no-cache", "-q", "."], repo),
            "ruff --version": ([args.ruff, "--version"], empty),
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for round_ in range(args.repeat + 1):
            for name, (command, cwd) in commands.items():
                start = time.perf_counter()
                subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if round_:  # round 0 primes byte-code and the results cache
                    times[name].append(time.perf_counter() - start)
    ruff_cold = statistics.median(times[next(n for n in times if n.startswith("ruff check"))])
    files = sum(1 for _ in args.repo.rglob("*.py"))
    print(f"{args.repo.name}: {files} files, {args.repeat} rounds, Python {sys.version.split()[0]}")
    print("| command | median (s) | runs (s) | vs ruff cold |")
    print("| --- | --- | --- | --- |")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"| {name} | {median:.3f} | {', '.join(f'{r:.2f}' for r in runs)} | {median / ruff_cold:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
