"""Soak / fuzz run: hostile generated files mixed with real code, through `check` and `fix --apply`.

    python benchmarks/soak.py REAL_DIR [REAL_DIR ...] [--generated 10000] [--kills 3] [--seed 0] [--work DIR]

REAL_DIR: folders of real Python code (e.g. unpacked sdists of timm and torchvision, pytorch/examples); they
are copied, never modified. Generated files (all in one folder, `hostile/`): deep bracket nesting, long
`and`/`+`/attribute/subscript chains (some crash libcst's native parser, some CPython rejects), huge files
(over and under the size limit), binary data, real files truncated at random bytes (mid-token, mid-UTF-8),
mixed encodings (latin-1 with and without a declaration, UTF-16, BOM + cookie, bad cookies, CR/CRLF mixes),
symlink loops, dangling links and hard links.

Checks, each printed with its figures:
1. no run prints a traceback, and every exit code is 0 or 1 (2 only with a one-line `gpulint: error:`);
2. every healthy (real) file has the same findings alone (`check real/`) as beside the hostile files;
3. `fix --apply` on a copy damages nothing: each changed file still compiles, every hostile file that has no
   fixable finding is byte-identical, links stay links;
4. `fix --apply` killed with SIGKILL at random moments (`--kills`): afterwards every file is the original or
   the fully fixed version, and no gpulint process is left.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HEADER = "import torch\ny = x.to('cuda')\n"  # makes the rules (and so libcst) look at the file
GOOD = "import torch\nfor x, y in loader:\n    x = x.to('cuda')\n    x.sum().backward()\n    opt.step()\n"


ENV = {**os.environ, "NO_COLOR": "1"}


def gpulint(*args: str, cwd: Path, timeout: float = 7200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulint", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def generate(folder: Path, count: int, real: list[Path], rng: random.Random) -> Counter:
    """`count` hostile files in `folder`; returns how many of each kind."""
    folder.mkdir(parents=True)
    kinds: Counter = Counter()
    real_bytes = [p.read_bytes() for p in real if p.stat().st_size < 400_000] or [GOOD.encode()]

    def write(kind: str, data: bytes | str) -> Path:
        path = folder / f"{kind}_{kinds[kind]:05}.py"
        kinds[kind] += 1
        if isinstance(data, str):
            path.write_text(data, encoding="utf-8")
        else:
            path.write_bytes(data)
        return path

    makers = [
        ("nested_brackets", lambda: HEADER + "z = " + "(" * (n := rng.choice([50, 150, 199, 201, 1000, 3000]))
         + "1" + ")" * n + "\n"),
        ("nested_mixed", lambda: HEADER + "z = " + "".join(rng.choice("([{") for _ in range(rng.randint(50, 400)))
         + "\n"),
        ("and_chain", lambda: HEADER + "z = " + " and ".join(["a"] * rng.choice([100, 1000, 5000, 20000])) + "\n"),
        ("sum_chain", lambda: HEADER + "z = " + "+".join(["1"] * rng.choice([100, 500, 1000, 3500])) + "\n"),
        ("attr_chain", lambda: HEADER + "z = a" + ".b" * rng.choice([100, 500, 3500]) + "\n"),
        ("not_chain", lambda: HEADER + "z = " + "not " * rng.choice([100, 1000, 30000]) + "1\n"),
        ("indent_deep", lambda: _deep_indent(rng.choice([20, 99, 150]))),
        ("binary", lambda: bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4000)))),
        ("binary_text", lambda: HEADER.encode() + bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200)))),
        ("truncated", lambda: (lambda b: b[:rng.randint(0, len(b))])(rng.choice(real_bytes))),
        ("latin1_no_cookie", lambda: (HEADER + "s = 'café'\n").encode("latin-1")),
        ("latin1_cookie", lambda: ("# -*- coding: latin-1 -*-\n" + GOOD + "s = 'café'\n").encode("latin-1")),
        ("utf16_bom", lambda: GOOD.encode("utf-16")),
        ("bom_cookie_mismatch", lambda: b"\xef\xbb\xbf# -*- coding: latin-1 -*-\n" + GOOD.encode()),
        ("bad_cookie", lambda: b"# -*- coding: klingon -*-\n" + GOOD.encode()),
        ("crlf_mix", lambda: "".join(line + rng.choice(["\n", "\r\n", "\r"]) for line in GOOD.splitlines())),
        ("nul_bytes", lambda: GOOD.encode() + b"\x00" * rng.randint(1, 10)),
        ("empty", lambda: b""),
        ("valid_fixable", lambda: GOOD),
        ("huge_line", lambda: HEADER + "z = [" + "1, " * rng.choice([2000, 50000]) + "]\n"),
    ]
    for _ in range(count):
        kind, make = rng.choice(makers)
        write(kind, make())
    # a few huge files: under and over the 5 MB limit
    block = GOOD.replace("for x", "for x") * 1
    for size in (300_000, 1_000_000, 6_000_000):
        write("huge", (block * (size // len(block) + 1))[:size].rsplit("\n", 1)[0] + "\n")
    # links
    loop = folder / "link_loop.py"
    loop.symlink_to(loop.name)
    (folder / "link_dangling.py").symlink_to("does_not_exist.py")
    target = folder / "valid_fixable_link_target.py"
    target.write_text(GOOD)
    (folder / "link_to_fixable.py").symlink_to(target.name)
    os.link(target, folder / "hardlink_to_fixable.py")
    kinds.update({"symlink_loop": 1, "symlink_dangling": 1, "symlink": 1, "hardlink": 1})
    return kinds


def _deep_indent(depth: int) -> str:
    return HEADER + "".join(" " * i + "if a:\n" for i in range(depth)) + " " * depth + "pass\n"


def findings(stdout: str) -> dict[str, list[tuple]]:
    by_file: dict[str, list[tuple]] = {}
    for item in json.loads(stdout or "[]"):
        by_file.setdefault(item["relative_filename"], []).append(
            (item["code"], item["location"]["row"], item["location"]["column"], item["message"]))
    return {path: sorted(items) for path, items in by_file.items()}


def snapshot(folder: Path) -> dict[str, bytes | str]:
    state: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            state[key] = "-> " + os.readlink(path)
        elif path.is_file():
            state[key] = path.read_bytes()
    return state


def no_traceback(label: str, result: subprocess.CompletedProcess, problems: list[str]) -> None:
    text = result.stdout + result.stderr
    if "Traceback" in text:
        problems.append(f"{label}: traceback: {text[text.index('Traceback'):][:600]}")
    if result.returncode not in (0, 1):
        errors = [line for line in result.stderr.splitlines() if line.startswith("gpulint: error:")]
        if result.returncode != 2 or not errors:
            problems.append(f"{label}: exit {result.returncode}: {result.stderr[-600:]}")
        else:
            print(f"  {label}: exit 2 with {len(errors)} error line(s), e.g. {errors[0][:200]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("real", nargs="+", type=Path)
    parser.add_argument("--generated", type=int, default=10_000)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000,
                        help="hostile files per run (each run also holds every real file); program-level analyses "
                             "make one 10,000-file program slow, and real projects are smaller")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--file-timeout", type=float, default=60.0,
                        help="gpulint's time limit per file for these runs (GPULINT_FILE_TIMEOUT; default 60 s)")
    args = parser.parse_args()
    ENV["GPULINT_FILE_TIMEOUT"] = str(args.file_timeout)
    rng = random.Random(args.seed)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpulint-soak-"))
    if work.exists():
        shutil.rmtree(work)
    base = work / "tree"
    real_root = base / "real"
    for index, folder in enumerate(args.real):
        shutil.copytree(folder, real_root / f"{index}_{folder.name}", symlinks=False,
                        ignore=shutil.ignore_patterns(".git", "__pycache__"))
    real_files = sorted(real_root.rglob("*.py"))
    started = time.monotonic()
    kinds = generate(base / "hostile", args.generated, real_files, rng)
    hostile_count = sum(kinds.values())
    print(f"soak: {len(real_files)} real files, {hostile_count} generated files in {work} "
          f"({time.monotonic() - started:.0f} s to generate)")
    print("  kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    problems: list[str] = []
    common = ["--select", "ALL", "--output-format", "json", "--no-cache", "--isolated"]
    started = time.monotonic()
    alone = gpulint("check", "real", *common, cwd=base)
    no_traceback("check real/", alone, problems)
    real_alone = findings(alone.stdout)
    print(f"  check real/: {sum(map(len, real_alone.values()))} findings in {len(real_alone)} files, "
          f"{time.monotonic() - started:.0f} s, exit {alone.returncode}")
    hostile = sorted(p.name for p in (base / "hostile").iterdir())
    batches = [hostile[i:i + args.batch] for i in range(0, len(hostile), args.batch)]
    totals: Counter = Counter()
    reasons: Counter = Counter()
    for number, names in enumerate(batches):
        tree = work / f"batch{number}"
        (tree / "hostile").mkdir(parents=True)
        shutil.copytree(real_root, tree / "real")
        for name in names:
            source = base / "hostile" / name
            target = tree / "hostile" / name
            if source.is_symlink():
                target.symlink_to(os.readlink(source))
            elif name in ("valid_fixable_link_target.py", "hardlink_to_fixable.py"):
                shutil.copy2(source, target)
            else:
                shutil.copy2(source, target)
        if "hardlink_to_fixable.py" in names and "valid_fixable_link_target.py" in names:
            (tree / "hostile" / "hardlink_to_fixable.py").unlink()
            os.link(tree / "hostile" / "valid_fixable_link_target.py", tree / "hostile" / "hardlink_to_fixable.py")
        started = time.monotonic()
        mixed = gpulint("check", "real", "hostile", *common, cwd=tree)
        no_traceback(f"batch {number}: check", mixed, problems)
        everything = findings(mixed.stdout)
        real_mixed = {p: f for p, f in everything.items() if p.startswith("real/")}
        lost = {p: (real_alone.get(p), real_mixed.get(p)) for p in set(real_alone) | set(real_mixed)
                if real_alone.get(p) != real_mixed.get(p)}
        for path, (before_, after_) in list(lost.items())[:3]:
            problems.append(f"batch {number}: findings of {path} differ: alone {before_}, beside hostile {after_}")
        for path, items in everything.items():
            if path.startswith("hostile/"):
                totals.update(item[0] for item in items)
                reasons.update(_reason(item[3]) for item in items if item[0] in ("GPU900", "GPU901"))
        check_time = time.monotonic() - started
        # fix --apply on the batch: nothing damaged, links kept (the real files are fixed too: a copy)
        before = snapshot(tree)
        started = time.monotonic()
        fix = gpulint("fix", "--apply", "--no-verify", "real", "hostile", "--select", "ALL", "--unsafe-fixes",
                      "--no-cache", "--isolated", "--output-format", "concise", cwd=tree)
        no_traceback(f"batch {number}: fix --apply", fix, problems)
        after = snapshot(tree)
        changed = [k for k in before if before[k] != after.get(k)]
        broken = []
        for key in changed:
            value = after.get(key)
            if not isinstance(value, bytes):
                broken.append(f"{key}: link replaced")
                continue
            try:
                compile(value, key, "exec", dont_inherit=True)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
                broken.append(f"{key}: {type(error).__name__}")
        links = [k for k, v in before.items() if isinstance(v, str)]
        links_kept = all(isinstance(after.get(k), str) for k in links)
        print(f"  batch {number}: {len(names)} hostile files beside the real ones: check {check_time:.0f} s, exit "
              f"{mixed.returncode}, healthy files whose findings differ: {len(lost)}; fix --apply {len(changed)} "
              f"files changed in {time.monotonic() - started:.0f} s, exit {fix.returncode}, changed files that no "
              f"longer compile: {len(broken)}, symlinks kept: {links_kept} ({len(links)})")
        problems.extend(f"batch {number}: fix damaged {b}" for b in broken[:10])
        if not links_kept:
            problems.append(f"batch {number}: a symlink was replaced by fix --apply")
        # interrupted fix runs on the first batches: every file is the original or the fully fixed version
        if number < args.kills:
            killed = work / f"killed{number}"
            shutil.copytree(tree, killed, symlinks=True)
            for key, value in before.items():  # back to the unfixed files
                path = killed / key
                if isinstance(value, bytes):
                    path.write_bytes(value)
            kill_before = snapshot(killed)
            process = subprocess.Popen([sys.executable, "-m", "gpulint", "fix", "--apply", "--no-verify", "real",
                                        "hostile", "--select", "ALL", "--unsafe-fixes", "--no-cache", "--isolated",
                                        "-j", "2"], cwd=killed, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       env=ENV)
            time.sleep(rng.uniform(2.0, max(3.0, check_time * 0.8)))
            children = _children(process.pid)
            process.send_signal(signal.SIGKILL)
            process.wait()
            state = snapshot(killed)
            time.sleep(2.0)
            later = snapshot(killed)
            survivors = [pid for pid in children if _alive(pid)]
            odd = [k for k in kill_before if state.get(k) not in (before.get(k), after.get(k))]
            written_after = [k for k in state if state[k] != later.get(k)]
            print(f"  kill -9 during batch {number}'s fix: {sum(state.get(k) != kill_before[k] for k in kill_before)} "
                  f"files fixed before the kill, neither original nor fully fixed: {len(odd)}, written after the "
                  f"kill: {len(written_after)}, workers left: {len(survivors)} of {len(children)}")
            if odd or written_after or survivors:
                problems.append(f"kill {number}: odd {odd[:3]}, written after {written_after[:3]}, "
                                f"workers {survivors}")
            shutil.rmtree(killed)
        shutil.rmtree(tree)
    print("  findings on hostile files by code: " + ", ".join(f"{c} {n}" for c, n in sorted(totals.items())))
    print("  GPU900/GPU901 by reason: " + "; ".join(f"{r} {n}" for r, n in reasons.most_common()))
    print(f"soak: {'OK' if not problems else 'FAILED'}")
    for problem in problems:
        print(f"  problem: {problem}")
    return 0 if not problems else 1


def _reason(message: str) -> str:
    for key in ("crashed", "still running", "over gpulint's limit", "nested parentheses", "RecursionError",
                "MemoryError", "NUL", "UTF-8", "declares", "encoding", "symbolic link", "libcst", "SyntaxError"):
        if key in message:
            return key
    return message[:40]


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found |= {int(p) for p in (task / "children").read_text().split()}
    except OSError:
        pass
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
