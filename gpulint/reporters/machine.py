"""Machine formats: JSON / JSON lines shaped like ruff's, GitHub Actions workflow commands, SARIF 2.1.0.

They are plain strings written with `stream.write`: no rich, no colour, no wrapping, no progress.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote
from typing import Callable, Sequence

from gpulint import __version__
from gpulint.diagnostics import Diagnostic, Safety, Severity
from gpulint.docs import RuleInfo, find_info
from gpulint.reporters.baseline import fingerprints
from gpulint.suppressions import noqa_rows

_APPLICABILITY = {Safety.SAFE: "safe", Safety.UNSAFE: "unsafe", Safety.SUGGEST: "display-only"}
_GITHUB_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}
_SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
GITHUB_ANNOTATION_CAP = 10  # GitHub shows at most 10 warnings and 10 errors per step
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _location(position) -> dict:
    return {"row": position.line, "column": position.col}


def _relative(path: str, root: str | None = None) -> str:
    """`path` relative to `root` (default: cwd), `/`-separated, no `./`; absolute if outside it."""
    absolute = os.path.abspath(path)
    base = os.path.abspath(root or os.getcwd())
    try:
        relative = os.path.relpath(absolute, base)
    except ValueError:
        return absolute.replace(os.sep, "/")
    if relative == ".." or relative.startswith(".." + os.sep):
        return absolute.replace(os.sep, "/")
    return relative.replace(os.sep, "/")


def diagnostic_json(d: Diagnostic, noqa_row: int | None = None) -> dict:
    fix = d.fix
    return {
        "cell": None,
        "code": d.code,
        "name": d.name,
        "message": d.message,
        "severity": d.severity.value,
        "url": None,
        "filename": os.path.abspath(d.path),
        "relative_filename": _relative(d.path),
        "location": _location(d.start),
        "end_location": _location(d.end),
        "noqa_row": noqa_row if noqa_row is not None else d.start.line,
        "note": d.note,
        "fix": None if fix is None else {
            "applicability": _APPLICABILITY[fix.safety],
            "message": fix.title,
            "edits": [{"content": e.content, "location": _location(e.start), "end_location": _location(e.end)}
                      for e in fix.edits],
        },
    }


def _json_objects(diagnostics: Sequence[Diagnostic], sources: dict[str, str]) -> list[dict]:
    rows: dict[str, Callable[[int], int]] = {}
    objects = []
    for d in diagnostics:
        mapper = rows.get(d.path)
        if mapper is None:
            text = sources.get(d.path)
            mapper = rows[d.path] = noqa_rows(text) if text else (lambda line: line)
        objects.append(diagnostic_json(d, mapper(d.start.line)))
    return objects


def render_json(diagnostics: Sequence[Diagnostic], sources: dict[str, str] | None = None) -> str:
    return json.dumps(_json_objects(diagnostics, sources or {}), indent=2, ensure_ascii=False) + "\n"


def render_json_lines(diagnostics: Sequence[Diagnostic], sources: dict[str, str] | None = None) -> str:
    return "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in _json_objects(diagnostics, sources or {}))


# -- GitHub Actions ----------------------------------------------------------------------------------------

def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(diagnostics: Sequence[Diagnostic], workspace: str | None = None) -> str:
    """One `::level title=...,file=...,line=...::message` per finding, file relative to $GITHUB_WORKSPACE
    (else the cwd). `col`/`endColumn` are left out for multi-line spans, which GitHub rejects."""
    workspace = workspace if workspace is not None else os.environ.get("GITHUB_WORKSPACE") or None
    out = []
    for d in diagnostics:
        path = _relative(d.path, workspace)
        shown = _relative(d.path)
        props = [f"title={escape_property(f'gpulint ({d.code})')}", f"file={escape_property(path)}",
                 f"line={d.start.line}"]
        if d.start.line == d.end.line:
            props.append(f"col={d.start.col}")
        props.append(f"endLine={d.end.line}")
        if d.start.line == d.end.line:
            props.append(f"endColumn={d.end.col}")
        message = f"{shown}:{d.start.line}:{d.start.col}: {d.code} {d.message}"
        if d.fix is not None:
            message += f"\n  help: {d.fix.title}"
        if d.note:
            message += f"\n  note: {d.note}"
        out.append(f"::{_GITHUB_LEVEL[d.severity]} {','.join(props)}::{escape_data(message)}\n")
    levels = [d.severity for d in diagnostics]
    over = max(sum(1 for s in levels if s is Severity.ERROR) - GITHUB_ANNOTATION_CAP, 0) + \
        max(sum(1 for s in levels if s is not Severity.ERROR) - GITHUB_ANNOTATION_CAP, 0)
    if over:
        out.append(f"::notice title=gpulint::{escape_data(f'{len(diagnostics)} findings in total; GitHub shows ')}"
                   f"{escape_data('only the first 10 warnings and 10 errors of a step: see the log or upload SARIF')}"
                   f"\n")
    return "".join(out)


# -- SARIF 2.1.0 ------------------------------------------------------------------------------------------

def _sarif_rule(info: RuleInfo) -> dict:
    what = info.section("What it does")
    why = info.section("Why is this slow")
    full = " ".join((what + ("\n\n" + why if why else "")).split()) or info.message
    safety = info.section("Fix safety")
    fix_text = ("Fix: " + ("safe" if info.safety is Safety.SAFE else "unsafe, needs --unsafe-fixes")
                + f" ({info.fix_title}).") if info.fixes else "No automatic fix."
    help_text = " ".join(what.split()) + (f" {fix_text}" if fix_text else "")
    markdown = info.docs.strip() + (f"\n\n**Fix safety:** {' '.join(safety.split())}" if safety else "")
    return {
        "id": info.code,
        "name": info.name,
        "shortDescription": {"text": info.summary[:1024]},
        "fullDescription": {"text": full},
        "help": {"text": help_text.strip() or info.message, "markdown": markdown},
        "defaultConfiguration": {"level": _SARIF_LEVEL[info.severity], "enabled": info.default_enabled},
        "properties": {
            "tags": ["performance", "gpu", info.family] if not info.meta else ["gpulint"],
            "precision": "high",
            "problem.severity": {"error": "error", "warning": "warning", "info": "recommendation"}[
                info.severity.value],
        },
    }


def _artifact(path: str, root: str | None) -> dict:
    """A SARIF artifactLocation: a percent-encoded URI reference (RFC 3986) relative to %SRCROOT%, or an
    absolute `file://` URI for a file outside the root. `my project/train.py` -> `my%20project/train.py`."""
    relative = _relative(path, root)
    if relative.startswith("/") or os.path.isabs(relative):
        return {"uri": Path(os.path.abspath(path)).as_uri()}
    return {"uri": quote(relative, safe="/"), "uriBaseId": "%SRCROOT%"}


def _region(start, end) -> dict:
    return {"startLine": start.line, "startColumn": start.col, "endLine": end.line, "endColumn": end.col}


def render_sarif(diagnostics: Sequence[Diagnostic], sources: dict[str, str], rule_codes: Sequence[str],
                 root: str | None = None) -> str:
    """One run; `rules[]` lists every enabled rule plus any other code that has a result."""
    root = root if root is not None else os.environ.get("GITHUB_WORKSPACE") or None
    codes = list(dict.fromkeys([*rule_codes, *(d.code for d in diagnostics)]))
    infos = [info for info in (find_info(code) for code in codes) if info is not None]
    index = {info.code: position for position, info in enumerate(infos)}
    results = []
    for d, fingerprint in zip(diagnostics, fingerprints(diagnostics, sources)):
        artifact = _artifact(d.path, root)
        location = {"physicalLocation": {"artifactLocation": artifact,
                                         "region": _region(d.start, d.end)}}
        result: dict = {
            "ruleId": d.code,
            "level": _SARIF_LEVEL[d.severity],
            "message": {"text": d.message + (f" Note: {d.note}" if d.note else "")},
            "locations": [location],
            "fingerprints": {"gpulint/v1": fingerprint},
        }
        if d.code in index:
            result["ruleIndex"] = index[d.code]
        if d.fix is not None:
            result["fixes"] = [{
                "description": {"text": d.fix.title + ("" if d.fix.safety is Safety.SAFE else " (unsafe)")},
                "artifactChanges": [{
                    "artifactLocation": dict(artifact),
                    "replacements": [{"deletedRegion": _region(e.start, e.end),
                                      "insertedContent": {"text": e.content}} for e in d.fix.edits],
                }],
            }]
        results.append(result)
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "gpulint", "semanticVersion": __version__, "version": __version__,
                                "rules": [_sarif_rule(i) for i in infos]}},
            "automationDetails": {"id": "gpulint/"},
            "originalUriBaseIds": {"%SRCROOT%": {"description": {"text": "The repository root"}}},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    }
    return json.dumps(log, indent=2, ensure_ascii=False) + "\n"

