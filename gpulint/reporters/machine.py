"""JSON shaped like ruff's, and GitHub Actions workflow-command annotations."""

from __future__ import annotations

import json
from typing import Sequence

from gpulint.diagnostics import Diagnostic, Severity

_GITHUB_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _location(position) -> dict:
    return {"row": position.line, "column": position.col}


def diagnostic_json(diagnostic: Diagnostic) -> dict:
    fix = diagnostic.fix
    return {
        "code": diagnostic.code,
        "name": diagnostic.name,
        "message": diagnostic.message,
        "severity": diagnostic.severity.value,
        "filename": diagnostic.path,
        "location": _location(diagnostic.start),
        "end_location": _location(diagnostic.end),
        "noqa_row": diagnostic.start.line,
        "note": diagnostic.note,
        "fix": None if fix is None else {
            "message": fix.title,
            "applicability": fix.safety.value,
            "edits": [{"content": e.content, "location": _location(e.start), "end_location": _location(e.end)}
                      for e in fix.edits],
        },
    }


def render_json(diagnostics: Sequence[Diagnostic]) -> str:
    return json.dumps([diagnostic_json(d) for d in diagnostics], indent=2) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(diagnostics: Sequence[Diagnostic]) -> str:
    lines = []
    for d in diagnostics:
        props = (f"title={_escape_property(f'gpulint ({d.code})')},file={_escape_property(d.path)},"
                 f"line={d.start.line},col={d.start.col},endLine={d.end.line},endColumn={d.end.col}")
        lines.append(f"::{_GITHUB_LEVEL[d.severity]} {props}::{_escape_data(f'{d.code} {d.message}')}")
    return "".join(line + "\n" for line in lines)
