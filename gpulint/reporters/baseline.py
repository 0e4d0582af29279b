"""Baselines: a legacy repo records today's findings once, and only new findings fail afterwards.

A finding's fingerprint hashes its code, the text of the line it starts on (whitespace collapsed, so
re-indenting does not matter) and its occurrence index among findings with the same code and line text in
that file. Line numbers are not part of it, so editing code above a finding keeps it matched. The baseline
file stores paths relative to its own folder, so it works from any working directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from gpulint import __version__
from gpulint.diagnostics import Diagnostic

FORMAT_VERSION = 1


class BaselineError(ValueError):
    """A baseline file that cannot be read; one line."""


def _normalized(line: str) -> str:
    return " ".join(line.split())


def fingerprints(diagnostics: Sequence[Diagnostic], sources: dict[str, str]) -> list[str]:
    """One fingerprint per diagnostic, in order."""
    lines_of: dict[str, list[str]] = {}
    seen: Counter = Counter()
    result = []
    for d in sorted(range(len(diagnostics)), key=lambda i: diagnostics[i].sort_key()):
        diagnostic = diagnostics[d]
        lines = lines_of.get(diagnostic.path)
        if lines is None:
            lines = lines_of[diagnostic.path] = (sources.get(diagnostic.path) or "").splitlines()
        text = _normalized(lines[diagnostic.start.line - 1]) if 0 < diagnostic.start.line <= len(lines) else ""
        key = (diagnostic.path, diagnostic.code, text)
        occurrence = seen[key]
        seen[key] += 1
        digest = hashlib.sha256(f"{diagnostic.code}\0{text}\0{occurrence}".encode()).hexdigest()[:20]
        result.append((d, digest))
    result.sort()
    return [digest for _, digest in result]


def _key_path(path: str, root: Path) -> str:
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(root).as_posix()
    except ValueError:
        return os.path.relpath(absolute, root).replace(os.sep, "/")


def write_baseline(file: Path, diagnostics: Sequence[Diagnostic], sources: dict[str, str]) -> int:
    root = Path(os.path.abspath(file)).parent
    entries = []
    for diagnostic, fingerprint in zip(diagnostics, fingerprints(diagnostics, sources)):
        entries.append({"path": _key_path(diagnostic.path, root), "code": diagnostic.code,
                        "fingerprint": fingerprint, "line": diagnostic.start.line, "message": diagnostic.message})
    entries.sort(key=lambda e: (e["path"], e["line"], e["code"], e["fingerprint"]))
    payload = {"gpulint_baseline": FORMAT_VERSION, "gpulint_version": __version__, "findings": entries}
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, file)
    return len(entries)


@dataclass
class Baseline:
    root: Path
    counts: Counter  # (path, code, fingerprint) -> how many

    @classmethod
    def load(cls, file: Path) -> "Baseline":
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except OSError as error:
            raise BaselineError(f"{file}: cannot read baseline: {error.strerror or error}") from None
        except json.JSONDecodeError as error:
            raise BaselineError(f"{file}: not a gpulint baseline (invalid JSON: {error})") from None
        if not isinstance(data, dict) or data.get("gpulint_baseline") != FORMAT_VERSION or \
                not isinstance(data.get("findings"), list):
            raise BaselineError(f"{file}: not a gpulint baseline (version {FORMAT_VERSION})")
        counts: Counter = Counter()
        for entry in data["findings"]:
            try:
                counts[(entry["path"], entry["code"], entry["fingerprint"])] += 1
            except (KeyError, TypeError):
                raise BaselineError(f"{file}: malformed baseline entry {entry!r}") from None
        return cls(Path(os.path.abspath(file)).parent, counts)

    def filter(self, diagnostics: Sequence[Diagnostic], sources: dict[str, str]) -> tuple[list[Diagnostic], int]:
        """Findings not in the baseline, and how many were hidden."""
        remaining = Counter(self.counts)
        kept = []
        hidden = 0
        for diagnostic, fingerprint in zip(diagnostics, fingerprints(diagnostics, sources)):
            key = (_key_path(diagnostic.path, self.root), diagnostic.code, fingerprint)
            if remaining[key] > 0:
                remaining[key] -= 1
                hidden += 1
            else:
                kept.append(diagnostic)
        return kept, hidden
