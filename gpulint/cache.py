"""Results cache for `check`: unchanged files are not parsed again.

An entry is keyed by the file's content hash, gpulint's version, the effective settings (rules and options)
and the program facts the file's rules saw. A file whose rules looked at other files of the program
(program-level rules) is also keyed by a digest of the whole program.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

from gpulint import __version__

if TYPE_CHECKING:
    from pathlib import Path

    from gpulint.diagnostics import Diagnostic

# A replayed run (gpulint.cache_runs) needs only the code fingerprint from here: the rest of what the results
# cache uses is imported where it is used.

CACHE_DIR_NAME = ".gpulint_cache"


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


class ResultCache:
    def __init__(self, directory: Path, settings_key: str) -> None:
        self.directory = directory
        self.path = directory / f"results-{__version__}-{settings_key}.json"
        self.entries: dict[str, dict] = {}
        self.dirty = False
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            loaded = {}
        # a cache file is only ever a hint: anything but the expected shape (`[]`, `null`, damaged) is ignored
        self.entries = loaded if isinstance(loaded, dict) else {}

    def get(self, file_key: str, content_hash: str, facts_key: str, program_key: str) -> list[Diagnostic] | None:
        entry = self.entries.get(file_key)
        try:
            if not isinstance(entry, dict) or entry["content"] != content_hash or entry["facts"] != facts_key:
                return None
            if entry["program"] is not None and entry["program"] != program_key:
                return None
            from gpulint.diagnostics import diagnostic_from_dict

            return [diagnostic_from_dict(d) for d in entry["diagnostics"]]
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            return None  # a damaged entry: the file is linted again and the entry replaced

    # The program facts' digest depends only on the program's files (their paths and contents), which
    # `program_key` hashes: remembered per program, a warm run need not rebuild the program's call graph.
    _FACTS = "\0program-facts"

    def facts_for(self, program_key: str) -> str | None:
        memo = self.entries.get(self._FACTS)
        value = memo.get(program_key) if isinstance(memo, dict) else None
        return value if isinstance(value, str) else None

    def remember_facts(self, program_key: str, facts_key: str) -> None:
        memo = self.entries.get(self._FACTS)
        if not isinstance(memo, dict) or len(memo) > 16:
            memo = {}
        if memo.get(program_key) != facts_key:
            memo[program_key] = facts_key
            self.entries[self._FACTS] = memo
            self.dirty = True

    def put(self, file_key: str, content_hash: str, facts_key: str, program_key: str | None,
            diagnostics: list[Diagnostic]) -> None:
        from gpulint.diagnostics import diagnostic_to_dict

        self.entries[file_key] = {"content": content_hash, "facts": facts_key, "program": program_key,
                                  "diagnostics": [diagnostic_to_dict(d) for d in diagnostics]}
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            ignore = self.directory / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# created by gpulint\n*\n")
            import tempfile

            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".results.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(self.entries, handle)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only checkout just runs without a cache


def _code_folders() -> list[str]:
    """gpulint's package folder and the rules' (`gpulint.rules` is a folder of its own in a development
    checkout), found without importing the rules."""
    import importlib.util

    import gpulint

    folders = [os.path.dirname(gpulint.__file__)]
    spec = importlib.util.find_spec("gpulint.rules")
    if spec is not None and spec.submodule_search_locations:
        folders.extend(spec.submodule_search_locations)
    return folders


def _code_stats() -> dict[tuple[int, int], tuple[str, int, int]]:
    """(device, inode) -> (path, size, modification time) of every Python source file of gpulint: the package
    with all its subpackages (`semantic`, `reporters`, ...) and the rules. A file reached twice (the rules inside
    an installed package) counts once."""
    found: dict[tuple[int, int], tuple[str, int, int]] = {}
    pending = list(_code_folders())
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.name.endswith(".py") and entry.is_file():
                    info = entry.stat()
                    found.setdefault((info.st_dev, info.st_ino), (entry.path, info.st_size, info.st_mtime_ns))
                elif entry.is_dir() and entry.name != "__pycache__" and not entry.name.startswith("."):
                    pending.append(entry.path)
            except OSError:
                continue
    return found


def code_files() -> list[Path]:
    from pathlib import Path

    return sorted(Path(path) for path, _, _ in _code_stats().values())


def code_fingerprint() -> str:
    """Changes whenever one of gpulint's own source files (any subpackage, any rule) is edited, added or
    removed, so that a results cache never serves findings of other code: the version plus the path, size and
    modification time of each file (a stat per file, no reading)."""
    return digest(__version__, sorted(_code_stats().values()))


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]
