"""Output formats. Human formats (full, concise) may use colour on a terminal; machine formats (json,
json-lines, github, sarif) are plain text written directly, never touched by rich."""

from __future__ import annotations

from gpulint.reporters.machine import render_github, render_json, render_json_lines, render_sarif
from gpulint.reporters.text import (
    Writer, render_concise, render_diff, render_fixed, render_full, render_statistics, render_summary,
    unified_diff, use_color,
)

from gpulint.cli import MACHINE_FORMATS, OUTPUT_FORMATS as FORMATS  # noqa: E402

__all__ = [
    "FORMATS", "MACHINE_FORMATS", "Writer", "render_concise", "render_diff", "render_fixed", "render_full",
    "render_github", "render_json", "render_json_lines", "render_sarif", "render_statistics", "render_summary",
    "unified_diff", "use_color",
]
