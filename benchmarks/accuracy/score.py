"""Score `gpulint check` against blind labels of public training repositories.

    python benchmarks/accuracy/score.py --mirrors DIR [--split dev|test|all] [--repo OWNER/NAME] [--list-unlabeled] [--json OUT]

`labels/<owner>__<name>.json` pin a commit and list, for the files labeled exhaustively, every occurrence of a
catalog pattern (`clear`), every look-alike that must stay quiet (`trap`) and the judgement calls (`debatable`,
not scored). `repos.json` splits the repositories into a development half (studied site by site) and a test
half (only scored). For each repository the script materialises the whole tree at the pinned commit from a
clone or mirror under `--mirrors` (named `owner+name`, `owner__name` or `name`, bare or not; `--clone` fetches
missing ones from GitHub), runs one `gpulint check --select ALL --output-format json` over it, and matches
findings to labels: same file, same code, within two lines (program-level codes — TF32, autocast, cuDNN
autotuning, channels-last — anywhere in the file, or in a file the reporting script imports, directly or through
other files of the tree). It prints recall on clear labels per family and overall,
the share of traps flagged, and the findings in labeled files that match no label (to review).
No third-party code is committed: only label rows.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter, defaultdict
from io import BytesIO
from pathlib import Path, PurePosixPath

HERE = Path(__file__).resolve().parent
LINE_TOLERANCE = 2
PROGRAM_LEVEL = {"GPU020", "GPU021", "GPU023", "GPU033", "GPU034", "GPU035"}
FAMILIES = {"GPU00": "host sync / capture", "GPU01": "transfers", "GPU02": "precision", "GPU03": "kernels",
            "GPU04": "compile", "GPU05": "data loading", "GPU06": "multi-GPU", "GPU07": "loop structure"}


def family(code: str) -> str:
    return FAMILIES.get(code[:5], code[:5] + "x")


def load_labels(split: str) -> list[dict]:
    splits = json.loads((HERE / "repos.json").read_text())
    found = []
    for path in sorted((HERE / "labels").glob("*.json")):
        data = json.loads(path.read_text())
        data["split"] = splits.get(data["repo"], "dev")
        if split in ("all", data["split"]):
            found.append(data)
    return found


def mirror_of(mirrors: Path, repo: str, clone: bool) -> Path:
    owner, name = repo.split("/")
    for candidate in (f"{owner}+{name}", f"{owner}__{name}", name, f"{owner}+{name}.git", f"{name}.git"):
        found = mirrors / candidate
        if (found / "repo").is_dir():
            return found / "repo"  # the layout of the search tool's mirrors
        if found.exists():
            return found
    if not clone:
        raise SystemExit(f"no clone or mirror of {repo} under {mirrors} (pass --clone to fetch it)")
    target = mirrors / f"{owner}+{name}"
    subprocess.run(["git", "clone", "--bare", "--quiet", f"https://github.com/{repo}", str(target)], check=True)
    return target


LAUNCH_SUFFIXES = (".sh", ".md", ".rst", ".txt")


def materialise(mirror: Path, commit: str, into: Path) -> None:
    """Every Python, config and requirement file of the tree at `commit` (imports between files matter to the
    analysis, pinned torch versions to some rules; mirrors may lack large binary files, which gpulint never reads),
    and the launch scripts and documents up to 256 KB (the command lines that turn switches on: `--amp`, `--flash`)."""
    listing = subprocess.run(["git", "-C", str(mirror), "ls-tree", "-r", "-l", commit], check=True,
                             capture_output=True, text=True).stdout.splitlines()
    entries = {}  # path -> (blob, size)
    for line in listing:
        meta, path = line.split("\t", 1)
        _, kind, blob, size = meta.split()
        if kind == "blob":
            entries[path] = (blob, int(size) if size.isdigit() else 0)
    sources = [path for path in entries if path.endswith((".py", ".toml", ".cfg"))
               or PurePosixPath(path).name.startswith("requirements") and path.endswith(".txt")]  # torch pins
    launches = [path for path, (_, size) in entries.items()
                if path.endswith(LAUNCH_SUFFIXES) and size <= 256 * 1024 and path not in sources]
    if launches:  # a mirror may lack some blobs (large files): only those it holds
        check = subprocess.run(["git", "-C", str(mirror), "cat-file", "--batch-check"], check=True, text=True,
                               capture_output=True, input="".join(entries[path][0] + "\n" for path in launches))
        sources += [path for path, answer in zip(launches, check.stdout.splitlines()) if not answer.endswith("missing")]
    archive = subprocess.run(["git", "-C", str(mirror), "archive", "--format=tar", commit, "--", *sources],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def run_gpulint(tree: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "gpulint", "check", ".", "--select", "ALL", "--output-format",
                           "json", "--no-cache", "--isolated"], cwd=tree, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"gpulint failed on {tree}: {done.stderr.strip()[:500]}")
    findings = json.loads(done.stdout or "[]")
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*.py"))
    reached: dict[str, set[str]] = {}
    for finding in findings:
        finding["path"] = Path(finding["filename"]).resolve().relative_to(tree.resolve()).as_posix()
        if finding["code"] in PROGRAM_LEVEL:
            if finding["path"] not in reached:
                reached[finding["path"]] = reachable_files(tree, finding["path"], files)
            finding["reaches"] = reached[finding["path"]]
    return findings


IMPORT_DEPTH = 5


def reachable_files(tree: Path, start: str, files: list[str]) -> set[str]:
    """The files of the tree that `start` imports, directly or through the files it imports (first-party imports
    resolved as `module_names` names them), to IMPORT_DEPTH levels: the program a program-level finding is for."""
    found: set[str] = set()
    frontier = [start]
    for _ in range(IMPORT_DEPTH):
        following = []
        for importer in frontier:
            modules = imported_modules(tree / importer)
            for candidate in files:
                if candidate not in found and candidate != start and modules & module_names(candidate, importer):
                    found.add(candidate)
                    following.append(candidate)
        frontier = following
    return found


def imported_modules(path: Path) -> set[str]:
    """Modules a file imports (`from mingpt.trainer import Trainer` -> mingpt.trainer, mingpt.trainer.Trainer)."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, ValueError):
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def module_names(path: str, importer: str) -> set[str]:
    """The dotted names by which the file `importer` can import the file `path`: a package path
    (`mingpt/trainer.py` -> mingpt.trainer), or the bare name of a file in the importer's folder (`trainer`)."""
    parts = PurePosixPath(path).with_suffix("").parts
    names = {".".join(parts[start:]) for start in range(len(parts) - 1)}
    if PurePosixPath(path).parent == PurePosixPath(importer).parent:
        names.add(parts[-1])
    return names


def matches(finding: dict, label: dict) -> bool:
    if finding["code"] != label["code"]:
        return False
    if label["code"] in PROGRAM_LEVEL:
        # a program-level finding is reported once for the program: in the file of the training step the label
        # points at, or in the entry script that imports it (directly or through other files) and starts the training
        return finding["path"] == label["path"] or label["path"] in finding.get("reaches", ())
    return finding["path"] == label["path"] and abs(finding["location"]["row"] - label["line"]) <= LINE_TOLERANCE


def _distance(finding: dict, label: dict) -> int:
    """How far a matching label is from the finding: lines in the same file (none for a program-level code,
    reported once per file), farther than any of those in another file."""
    if finding["path"] != label["path"]:
        return LINE_TOLERANCE + 1
    return 0 if label["code"] in PROGRAM_LEVEL else abs(finding["location"]["row"] - label["line"])


def score_repo(data: dict, findings: list[dict]) -> dict:
    labeled_files = set(data["files"])
    relevant = [f for f in findings if f["path"] in labeled_files and not f["code"].startswith("GPU9")]
    # each finding explains the label it is nearest to (an `.item()` two lines above a trap on the progress
    # bar that prints its result is that `.item()`'s finding, not the trap's)
    hits: set[int] = set()
    outside = []
    for finding in relevant:
        candidates = [(_distance(finding, label), index) for index, label in enumerate(data["labels"])
                      if matches(finding, label)]
        if candidates:
            hits.add(min(candidates)[1])
        else:
            outside.append(finding)
    rows = [{**label, "found": index in hits} for index, label in enumerate(data["labels"])]
    return {"repo": data["repo"], "split": data["split"], "rows": rows, "outside": outside,
            "findings": len(relevant)}


def summarise(results: list[dict]) -> dict:
    clear = [r for res in results for r in res["rows"] if r["kind"] == "clear"]
    traps = [r for res in results for r in res["rows"] if r["kind"] == "trap"]
    per_family: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in clear:
        per_family[family(row["code"])][0] += row["found"]
        per_family[family(row["code"])][1] += 1
    return {
        "repos": len(results),
        "clear": len(clear), "recall": sum(r["found"] for r in clear) / max(1, len(clear)),
        "traps": len(traps), "traps_flagged": sum(r["found"] for r in traps) / max(1, len(traps)),
        "findings": sum(res["findings"] for res in results),
        "outside_labels": sum(len(res["outside"]) for res in results),
        "per_family": {name: {"found": f, "of": n} for name, (f, n) in sorted(per_family.items())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirrors", type=Path, required=True, help="folder of clones/mirrors of the repositories")
    parser.add_argument("--clone", action="store_true", help="clone missing repositories from GitHub")
    parser.add_argument("--split", choices=("dev", "test", "all"), default="all")
    parser.add_argument("--repo", action="append", default=[], metavar="OWNER/NAME",
                        help="score only this repository (repeatable)")
    parser.add_argument("--list-unlabeled", action="store_true",
                        help="print findings outside any label (never do this for the test split)")
    parser.add_argument("--list-missed", action="store_true", help="print clear labels gpulint missed (dev only)")
    parser.add_argument("--json", type=Path, help="write the full results here")
    args = parser.parse_args()
    results = []
    for data in load_labels(args.split):
        if args.repo and data["repo"] not in args.repo:
            continue
        with tempfile.TemporaryDirectory(prefix="gpulint-accuracy-") as tmp:
            tree = Path(tmp) / data["repo"].replace("/", "__")
            tree.mkdir()
            materialise(mirror_of(args.mirrors, data["repo"], args.clone), data["commit"], tree)
            results.append(score_repo(data, run_gpulint(tree)))
    print(f"{'repository':52} {'split':5} {'clear':>5} {'found':>5} {'recall':>6} {'traps':>5} {'flagged':>7} "
          f"{'outside':>7}")
    for res in results:
        clear = [r for r in res["rows"] if r["kind"] == "clear"]
        traps = [r for r in res["rows"] if r["kind"] == "trap"]
        found = sum(r["found"] for r in clear)
        print(f"{res['repo']:52} {res['split']:5} {len(clear):5} {found:5} {found / max(1, len(clear)):6.2f} "
              f"{len(traps):5} {sum(r['found'] for r in traps):7} {len(res['outside']):7}")
    for split in ("dev", "test"):
        chosen = [res for res in results if res["split"] == split]
        if not chosen:
            continue
        summary = summarise(chosen)
        print(f"\n{split}: {summary['repos']} repositories, recall {summary['recall']:.2f} on {summary['clear']} clear "
              f"labels, traps flagged {summary['traps_flagged']:.2f} of {summary['traps']}, "
              f"{summary['findings']} findings, {summary['outside_labels']} outside labels")
        for name, counts in summary["per_family"].items():
            share = counts["found"] / counts["of"] if counts["of"] else math.nan
            print(f"  {name:22} {counts['found']:4}/{counts['of']:<4} {share:.2f}")
    if args.list_missed:
        for res in results:
            if res["split"] == "dev":
                for row in res["rows"]:
                    if not row["found"] and row["kind"] == "clear":
                        print(f"MISSED {res['repo']} {row['path']}:{row['line']} {row['code']} {row.get('note', '')}")
                    if row["found"] and row["kind"] == "trap":
                        print(f"TRAP   {res['repo']} {row['path']}:{row['line']} {row['code']} {row.get('note', '')}")
    if args.list_unlabeled:
        for res in results:
            for f in res["outside"]:
                print(f"OUTSIDE {res['repo']} {f['path']}:{f['location']['row']} {f['code']} {f['message'][:100]}")
    if args.json:
        args.json.write_text(json.dumps({"results": results}, indent=1, default=sorted))  # sets: the files a program-level finding reaches
    print("\nby code (clear labels): " + ", ".join(
        f"{code} {n}" for code, n in Counter(r["code"] for res in results for r in res["rows"]
                                                if r["kind"] == "clear").most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
