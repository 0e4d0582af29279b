"""Reliability suite: check + fix --apply --unsafe-fixes over large real code bases, with invariants.

    python benchmarks/reliability.py DIR [DIR ...]

For each DIR (e.g. unpacked wheels of transformers, timm, lightning, torchvision, diffusers) a scratch copy is
checked and fixed with every rule selected. It asserts: no crash (exit 0/1), every changed file still parses
and compiles, every file without a fix is byte-identical, and a second fix run changes nothing.
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def gpulint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulint", *args, "--select", "ALL", "--no-cache"],
                          capture_output=True, text=True)


def snapshot(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*.py"))}


def check_tree(source: Path) -> list[str]:
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpulint-reliability-") as scratch:
        work = Path(scratch) / source.name
        shutil.copytree(source, work, symlinks=True)
        before = snapshot(work)
        start = time.perf_counter()
        checked = gpulint("check", str(work), "--output-format", "json", "--quiet")
        if checked.returncode not in (0, 1):
            problems.append(f"check exited {checked.returncode}: {checked.stderr[-400:]}")
        diagnostics = json.loads(checked.stdout or "[]")
        fixable = {Path(d["filename"]).relative_to(work) for d in diagnostics if d["fix"]}
        fixed = gpulint("fix", "--apply", "--unsafe-fixes", str(work), "--quiet")
        if fixed.returncode not in (0, 1):
            problems.append(f"fix exited {fixed.returncode}: {fixed.stderr[-400:]}")
        after = snapshot(work)
        changed = [p for p in before if after.get(p) != before[p]]
        for path in changed:
            if path not in fixable:
                problems.append(f"{path}: changed although no finding in it has a fix")
            text = after[path]
            try:
                ast.parse(text)
                compile(text, str(path), "exec")
            except (SyntaxError, ValueError) as error:
                problems.append(f"{path}: fixed file does not compile: {error}")
        second = gpulint("fix", "--apply", "--unsafe-fixes", str(work), "--quiet")
        if snapshot(work) != after:
            problems.append("a second fix run changed files again")
        if second.returncode not in (0, 1):
            problems.append(f"second fix exited {second.returncode}")
        print(f"{source.name}: {len(before)} files, {len(diagnostics)} findings, {len(fixable)} files with fixes, "
              f"{len(changed)} files fixed, "
              f"{time.perf_counter() - start:.0f} s, {'OK' if not problems else 'FAILED'}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+", metavar="DIR", help="a code base to check and fix (a copy is used)")
    args = parser.parse_args()
    failures = 0
    for directory in args.directories:
        if not Path(directory).is_dir():
            parser.error(f"not a directory: {directory}")
        for problem in check_tree(Path(directory).resolve()):
            failures += 1
            print(f"  {problem}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
