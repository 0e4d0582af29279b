"""End-to-end benchmark: training scripts as written, after `gpulint fix --apply --unsafe-fixes`, and by hand.

    python benchmarks/e2e/run.py                       # on the GPU, full sizes, 2 interleaved rounds
    python benchmarks/e2e/run.py --device cpu --small  # smoke test (tiny sizes, 1 round)

For each script in `scripts/` that has a `<name>_hand.py` twin, the runner copies the original to a temporary
folder, runs gpulint's fixer on the copy (unsafe fixes included) at run time, then times the original, the
gpulint-fixed copy and the hand-optimised twin as separate processes, in interleaved rounds (the order of the
three rotates every round, so a slow spell of the machine falls on each). Each script measures its own
training time (after imports and model construction; every script ends with a host read of the loss) and
prints its final loss; the runner takes the median over rounds and checks that the fixed and hand losses
agree with the original's within the script's stated tolerance (`TOLERANCE`: low-precision variants and, in
self-play and PPO, trajectories that fork on a flipped near-tie change the numbers).

The table gives each speed-up over the original and the share of the hand speed-up that gpulint captured,
in log terms: ln(before / gpulint) / ln(before / hand). The last row is the geometric mean.
"""

from __future__ import annotations

import argparse
import datetime
import filecmp
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCRIPTS = HERE / "scripts"
ORDER = ("selfplay", "ppo", "vision", "llm")
# relative tolerance of the final loss against the original's (see the module docstring)
TOLERANCE = {"selfplay": 0.10, "ppo": 0.15, "vision": 0.10, "llm": 0.03}
_LOSS = re.compile(r"^final loss (\S+)$", re.M)
_TIME = re.compile(r"^train time (\S+)s$", re.M)

# gpulint from this checkout, also where it is not installed (rules/ is the gpulint.rules package)
_GPULINT = f"""
import importlib.util, sys
sys.path.insert(0, {str(ROOT)!r})
import gpulint
try:
    import gpulint.rules
except ModuleNotFoundError:
    spec = importlib.util.spec_from_file_location("gpulint.rules", {str(ROOT / 'rules' / '__init__.py')!r},
                                                  submodule_search_locations=[{str(ROOT / 'rules')!r}])
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpulint.rules"] = module
    spec.loader.exec_module(module)
    gpulint.rules = module
from gpulint.cli import main
sys.exit(main(sys.argv[1:]))
"""


def gpulint(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _GPULINT, *args], cwd=cwd, capture_output=True, text=True)


def prepare(names: list[str], work: Path, fixed_dir: Path | None) -> dict[str, dict]:
    """Copy each original, fix the copy with gpulint, and record findings and diff."""
    info = {}
    (work / "fixed").mkdir()
    for name in names:
        original = SCRIPTS / f"{name}.py"
        fixed = work / "fixed" / f"{name}.py"
        shutil.copy(original, fixed)
        record = {"original": original, "fixed": fixed, "hand": SCRIPTS / f"{name}_hand.py"}
        if fixed_dir is not None:  # fixes applied elsewhere (a machine without libcst)
            shutil.copy(fixed_dir / f"{name}.py", fixed)
            record["findings"] = "(fixed copy supplied with --fixed-dir)"
        else:
            check = gpulint("check", "--isolated", "--output-format", "concise", fixed.name, cwd=fixed.parent)
            record["findings"] = check.stdout
            result = gpulint("fix", "--isolated", "--apply", "--unsafe-fixes", fixed.name, cwd=fixed.parent)
            if result.returncode not in (0, 1):
                raise SystemExit(f"gpulint fix failed on {name}:\n{result.stdout}\n{result.stderr}")
            if filecmp.cmp(original, fixed, shallow=False):  # e.g. the fixer's micro-checks could not run
                print(f"warning: gpulint changed nothing in {name}:\n{result.stdout}{result.stderr}", file=sys.stderr)
            record["fix_output"] = result.stdout + result.stderr
        record["diff"] = subprocess.run(["diff", "-u", str(original), str(fixed)], capture_output=True,
                                        text=True).stdout
        info[name] = record
    return info


def run_once(path: Path, device: str, small: bool, timeout: float) -> tuple[float, float, float]:
    """(train time, final loss, wall time) of one run."""
    command = [sys.executable, str(path), "--device", device] + (["--small"] if small else [])
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # shared small machines: threads fight each other
    start = datetime.datetime.now()
    result = subprocess.run(command, cwd=path.parent, capture_output=True, text=True, env=env, timeout=timeout)
    wall = (datetime.datetime.now() - start).total_seconds()
    loss, train = _LOSS.search(result.stdout), _TIME.search(result.stdout)
    if result.returncode != 0 or loss is None or train is None:
        raise RuntimeError(f"{path} failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n"
                           f"{result.stderr[-4000:]}")
    return float(train.group(1)), float(loss.group(1)), wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--small", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2, 1 with --small)")
    parser.add_argument("--scripts", default=",".join(ORDER), help="comma-separated subset of " + ",".join(ORDER))
    parser.add_argument("--fixed-dir", type=Path, help="use these gpulint-fixed copies instead of fixing here")
    parser.add_argument("--json", type=Path, help="write all measurements here")
    parser.add_argument("--save-fixed", type=Path, help="copy the fixed scripts and their diffs here")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    if args.device is None:
        try:
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            args.device = "cpu"
    rounds = args.rounds or (1 if args.small else 2)
    names = [n for n in args.scripts.split(",") if n]
    unknown = [n for n in names if n not in ORDER]
    if unknown:
        parser.error(f"unknown script(s): {', '.join(unknown)}")

    with tempfile.TemporaryDirectory(prefix="gpulint-e2e-") as tmp:
        info = prepare(names, Path(tmp), args.fixed_dir)
        if args.save_fixed:
            args.save_fixed.mkdir(parents=True, exist_ok=True)
            for name, record in info.items():
                shutil.copy(record["fixed"], args.save_fixed / f"{name}.py")
                (args.save_fixed / f"{name}.diff").write_text(record["diff"])
                (args.save_fixed / f"{name}.findings.txt").write_text(record["findings"] + record.get("fix_output", ""))
        variants = ("original", "fixed", "hand")
        times = {n: {v: [] for v in variants} for n in names}
        losses = {n: {v: [] for v in variants} for n in names}
        for r in range(rounds):
            for name in names:
                order = variants[r % 3:] + variants[:r % 3]
                for variant in order:
                    train, loss, wall = run_once(info[name][variant], args.device, args.small, args.timeout)
                    times[name][variant].append(train)
                    losses[name][variant].append(loss)
                    print(f"round {r} {name:9s} {variant:8s} {train:8.3f}s  loss {loss:.4f}  (wall {wall:.1f}s)",
                          flush=True)

    rows, ok = [], True
    for name in names:
        t = {v: statistics.median(times[name][v]) for v in variants}
        spread = {v: (max(times[name][v]) - min(times[name][v])) / t[v] for v in variants}
        loss = {v: losses[name][v][0] for v in variants}
        tol = TOLERANCE[name]
        agree = all(abs(loss[v] - loss["original"]) <= tol * abs(loss["original"]) for v in ("fixed", "hand"))
        ok &= agree
        s_fix, s_hand = t["original"] / t["fixed"], t["original"] / t["hand"]
        share = math.log(s_fix) / math.log(s_hand) if s_hand > 1.0 else float("nan")
        rows.append(dict(script=name, times=t, spread=spread, losses=loss, tolerance=tol, agree=agree,
                         speedup_gpulint=s_fix, speedup_hand=s_hand, captured=share))
    geo_fix = math.exp(statistics.fmean(math.log(r["speedup_gpulint"]) for r in rows))
    geo_hand = math.exp(statistics.fmean(math.log(r["speedup_hand"]) for r in rows))
    geo_share = math.log(geo_fix) / math.log(geo_hand) if geo_hand > 1.0 else float("nan")

    device_name = args.device
    try:
        import torch

        version = torch.__version__
        if args.device.startswith("cuda"):
            device_name = torch.cuda.get_device_name()
    except ImportError:
        version = "?"
    print()
    print(f"{device_name}, torch {version}, {datetime.date.today().isoformat()}, {rounds} interleaved round(s), "
          f"median train time in seconds{' (--small)' if args.small else ''}")
    print()
    print("| script | before | gpulint | hand | gpulint speed-up | hand speed-up | captured (log) "
          "| final loss before / gpulint / hand (tolerance) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        t, l = r["times"], r["losses"]
        print(f"| {r['script']} | {t['original']:.2f} | {t['fixed']:.2f} | {t['hand']:.2f} | "
              f"{r['speedup_gpulint']:.2f}x | {r['speedup_hand']:.2f}x | {r['captured']:.0%} | "
              f"{l['original']:.4f} / {l['fixed']:.4f} / {l['hand']:.4f} "
              f"({'ok' if r['agree'] else 'DIFFERS'}, ±{r['tolerance']:.0%}) |")
    print(f"| geometric mean | | | | {geo_fix:.2f}x | {geo_hand:.2f}x | {geo_share:.0%} | |")
    print()
    print("run-to-run spread (max-min)/median: " + "; ".join(
        f"{r['script']} " + "/".join(f"{r['spread'][v]:.0%}" for v in variants) for r in rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(dict(
            device=device_name, torch=version, date=datetime.date.today().isoformat(), rounds=rounds,
            small=args.small, rows=rows, times=times, losses=losses, geomean_gpulint=geo_fix,
            geomean_hand=geo_hand, captured=geo_share), indent=2, default=str))
    if not ok:
        print("losses differ beyond the tolerance")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
