"""Output formats. Machine formats (json, github) are plain text, never touched by rich."""

from __future__ import annotations

from gpulint.reporters.machine import render_github, render_json
from gpulint.reporters.text import TextReporter

FORMATS = ("full", "concise", "json", "github")

__all__ = ["FORMATS", "TextReporter", "render_github", "render_json"]
