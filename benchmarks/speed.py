"""Wall time of gpulint (cold and warm cache) against TorchFix, Fixit and ruff on the same code, same run.

    python benchmarks/speed.py CORPUS_DIR [--peers-bin DIR] [--repeat 3]

CORPUS_DIR is any tree of real Python code (e.g. the unpacked wheels of timm, lightning and torchvision and a
checkout of pytorch/examples). `--peers-bin` is the bin/ folder of a virtualenv with `torchfix`, `fixit` and
`ruff` installed (`python -m venv peers && peers/bin/pip install torchfix fixit ruff`); tools that are not
found are skipped. Each tool runs `--repeat` times, in rounds (every tool once per round, so that a noisy spell
of a shared machine falls on all of them); the table gives the median and the ratio to TorchFix. Machines are
shared and noisy, so only ratios from one run are meaningful.

`--baseline DIR` adds a cold run of another gpulint (a folder holding a `gpulint` package with its rules in
`gpulint/rules`, e.g. an earlier version of this checkout), imported through PYTHONPATH, so that a change is
measured before and after in the same rounds. Python's byte-code cache is allowed (PYTHONDONTWRITEBYTECODE is
removed from the environment, as on a user's machine, where pip compiles the installed modules), and each
gpulint command runs once before the timed rounds.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


PARSE_FLOOR = """
import sys, pathlib, libcst
for path in pathlib.Path(sys.argv[1]).rglob("*.py"):
    try:
        libcst.parse_module(path.read_bytes())
    except Exception:
        pass
"""


def timed(command: list[str], cwd: Path, env: dict[str, str], timeout: float | None = None) -> float:
    """Seconds the command took; math.inf when it ran past `timeout` (it is stopped)."""
    start = time.perf_counter()
    # Own process group: a tool's worker processes (Fixit spawns some) are stopped with it on timeout and cannot
    # keep the stderr pipe open.
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return math.inf
    elapsed = time.perf_counter() - start
    if process.returncode not in (0, 1):
        raise RuntimeError(f"{command[0]} failed ({process.returncode}): {stderr.decode()[-500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--peers-bin", type=Path, help="bin/ of a venv with torchfix, fixit and ruff")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900, help="stop a run after this many seconds")
    parser.add_argument("--baseline", type=Path, help="folder holding another gpulint package, timed cold too")
    args = parser.parse_args()
    corpus = args.corpus.resolve()
    files = sum(1 for _ in corpus.rglob("*.py"))
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "NO_COLOR": "1"}

    def peer(name: str) -> str | None:
        candidate = args.peers_bin / name if args.peers_bin else None
        return str(candidate) if candidate and candidate.exists() else shutil.which(name)

    cache = Path(tempfile.mkdtemp(prefix="gpulint-bench-cache-"))
    gpulint = [sys.executable, "-m", "gpulint", "check", str(corpus), "--exit-zero", "--quiet",
               "--output-format", "concise"]
    tools: list[tuple[str, list[str]]] = [
        ("gpulint cold", [*gpulint, "--no-cache"]),
        ("gpulint warm", [*gpulint, "--cache-dir", str(cache)]),
        ("floor: libcst parse only, 1 process", [sys.executable, "-c", PARSE_FLOOR, str(corpus)]),
    ]
    if args.baseline:
        baseline = args.baseline.resolve()
        if not (baseline / "gpulint" / "rules").is_dir():
            parser.error(f"--baseline: {baseline} holds no gpulint package with its rules in gpulint/rules")
        # `env` runs the command with the baseline package first on the module search path
        tools.insert(1, ("gpulint cold, baseline", ["env", f"PYTHONPATH={baseline}", *gpulint, "--no-cache"]))
    for name, command in (("torchfix", ["torchfix", str(corpus)]),
                          ("fixit", ["fixit", "lint", str(corpus)]),
                          ("ruff --select ALL", ["ruff", "check", "--select", "ALL", "--no-cache", "--exit-zero",
                                                 "--quiet", str(corpus)])):
        binary = peer(command[0])
        if binary:
            tools.append((name, [binary, *command[1:]]))
        else:
            print(f"skipping {name}: not installed", file=sys.stderr)
    for name, command in tools:  # gpulint's byte-code compiled, its warm cache filled, the corpus in the page cache
        if name.startswith("gpulint"):
            timed(command, corpus, env, args.timeout)
    # Rounds: every tool once per round, so that a noisy spell of the shared machine falls on all tools alike
    # rather than on the repetitions of one.
    runs: dict[str, list[float]] = {name: [] for name, _ in tools}
    for round_index in range(args.repeat):
        for name, command in tools:
            if math.inf in runs[name]:
                continue  # a run past the timeout is not repeated
            runs[name].append(timed(command, corpus, env, args.timeout))
        print(f"round {round_index + 1}: " + ", ".join(f"{name} {runs[name][-1]:.2f}" for name, _ in tools),
              file=sys.stderr)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    shutil.rmtree(cache, ignore_errors=True)
    base = medians.get("torchfix")
    ruff = medians.get("ruff --select ALL")
    print(f"{files} files, {os.cpu_count()} cores, median of {args.repeat} interleaved runs\n")
    print("| tool | median wall time (s) | vs TorchFix | vs ruff |")
    print("| --- | --- | --- | --- |")
    def ratio(value: float, reference: float | None, digits: int) -> str:
        if not reference or value == math.inf:
            return "-"
        if reference == math.inf:  # the reference was stopped: the ratio is at most value / timeout
            return f"< {value / args.timeout:.{digits}f}x"
        return f"{value / reference:.{digits}f}x"

    for name, value in medians.items():
        versus_torchfix, versus_ruff = ratio(value, base, 3), ratio(value, ruff, 2)
        shown = f"> {args.timeout:.0f} (stopped)" if value == math.inf else f"{value:.2f}"
        print(f"| {name} | {shown} | {versus_torchfix} | {versus_ruff} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
