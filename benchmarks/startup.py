"""Start-up and small-run wall times of gpulint against ruff, same run, interleaved rounds.

    python benchmarks/startup.py SMALL_REPO [--ruff PATH] [--repeat 7]

Times `gpulint --version`, `gpulint check` on an empty folder, two warm `gpulint check SMALL_REPO` (results
cache filled by a first run) and `ruff check --select ALL --no-cache SMALL_REPO` (ruff cold), plus `ruff
--version`. The two warm runs are on two copies of the repository: one unchanged since the previous run (gpulint
replays the recorded run: gpulint.cache_runs), one where a file was touched before each run (same content, new
modification time: every file is still a results-cache hit, but the recording no longer holds, so settings,
discovery and the cache lookups run, with libcst and the rules imported). Every command runs once per round, so a
noisy spell of a shared machine falls on all of them. Python's own byte-code cache is allowed
(PYTHONDONTWRITEBYTECODE is removed from the environment, as on a user's machine), and the priming rounds are not
counted. Prints a Markdown table with medians and the ratio to ruff cold.

`--baseline DIR` times every gpulint command a second time with another gpulint package (a folder holding
`gpulint`, its rules in `gpulint/rules`) first on PYTHONPATH, on copies of its own, in the same rounds.
"""

from __future__ import annotations

import argparse
import os
import random
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
    parser.add_argument("--baseline", type=Path, help="folder holding another gpulint package, timed too")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("GPULINT_")}
    gpulint = [sys.executable, "-m", "gpulint"]
    variants = [("", gpulint)]
    if args.baseline:
        variants.append((" [baseline]", ["env", f"PYTHONPATH={args.baseline.resolve()}", *gpulint]))
    with tempfile.TemporaryDirectory(prefix="gpulint-startup-") as scratch:
        empty = Path(scratch) / "empty"
        empty.mkdir()
        commands: dict[str, tuple[list[str], Path]] = {}
        touched_copies: dict[str, list[Path]] = {}
        for suffix, program in variants:
            repo = Path(scratch) / f"repo{len(commands)}"
            touched = Path(scratch) / f"touched{len(commands)}"
            for copy in (repo, touched):
                shutil.copytree(args.repo, copy, ignore=shutil.ignore_patterns(".gpulint_cache", "__pycache__", ".git"))
            warm_touched = f"gpulint check {args.repo.name} (warm, a file touched: results cache){suffix}"
            touched_copies[warm_touched] = sorted(touched.rglob("*.py"))
            commands.update({
                f"gpulint --version{suffix}": (program + ["--version"], empty),
                f"gpulint check (empty folder){suffix}": (program + ["check", "."], empty),
                f"gpulint check {args.repo.name} (warm, unchanged: replayed){suffix}": (program + ["check", ".", "-q"],
                                                                                      repo),
                warm_touched: (program + ["check", ".", "-q"], touched),
            })
        repo = Path(scratch) / "repo0"
        commands.update({
            f"ruff check --select ALL --no-cache {args.repo.name} (cold)":
                ([args.ruff, "check", "--select", "ALL", "--no-cache", "-q", "."], repo),
            "ruff --version": ([args.ruff, "--version"], empty),
        })
        rng = random.Random(0)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for round_ in range(args.repeat + 2):
            for name, (command, cwd) in commands.items():
                if name in touched_copies:
                    os.utime(rng.choice(touched_copies[name]))
                start = time.perf_counter()
                subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if round_ > 1:  # round 0 fills the results cache and byte-code; round 1 records the warm run
                    times[name].append(time.perf_counter() - start)
            if round_ == 0:
                time.sleep(2.1)  # a run reading files changed less than 2 s before it is not recorded
        replayed = all(any((Path(scratch) / f"repo{4 * index}" / ".gpulint_cache" / "runs").glob("*.json"))
                       for index in range(len(variants)))
    ruff_cold = statistics.median(times[next(n for n in times if n.startswith("ruff check"))])
    files = sum(1 for _ in args.repo.rglob("*.py"))
    print(f"{args.repo.name}: {files} files, {args.repeat} rounds, Python {sys.version.split()[0]}, "
          f"warm run recorded: {replayed}")
    print("| command | median (s) | runs (s) | vs ruff cold |")
    print("| --- | --- | --- | --- |")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"| {name} | {median:.3f} | {', '.join(f'{r:.2f}' for r in runs)} | {median / ruff_cold:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
