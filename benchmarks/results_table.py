"""Shared by the GPU measurement scripts: print a finished markdown table and write it where `--out` says."""

from __future__ import annotations


def emit(lines: list[str], out: str | None) -> None:
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as handle:
            handle.write(text)
