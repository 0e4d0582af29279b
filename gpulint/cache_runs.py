"""Replaying a `gpulint check` whose inputs have not changed, without loading the analyzer.

A `check` run in which every file was a results-cache hit is recorded beside the results cache: its exact
output (stdout and stderr, in order) and exit code, keyed by the command line, the working directory, how the
output streams look (terminal or not, encoding), gpulint's code fingerprint and Python's module search path,
together with every fact of the file system and the environment the run read while it ran:

- each file it opened for reading (size, modification and change times, inode);
- each path it tested with `stat`/`lstat`/`access` (what was there, or that nothing was: a config file or a
  module created later must be seen);
- each folder it listed (the names and kinds of its entries: a new file is seen);
- each symbolic link it read, and each environment variable it read (set or not).

Each fact is taken as the run reads it. A run that read a file changed less than two seconds before it started
is not recorded (two writes that close may share a timestamp); nor is one whose facts changed while it ran.

The next `check` with the same key verifies those facts (a `stat` per path, a listing per folder) and, when all
hold, prints the recorded output: no libcst, no rules, no config parsing. Any fact that differs sends it down
the ordinary path (which may record again). A run that did something the recorder cannot see -- linted a file
(workers), started a process, listed the whole environment, wrote outside the cache -- is not recorded.

Only the reading side of the run is traced, in this process, through the `os`/`io` functions every path of
gpulint goes through (pathlib, `os.walk`, `open`); facts reached any other way would make a replay stale, so
tests pin that the recorded facts cover configs, sources, ignore files and new files.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import stat
import sys
import time
from typing import Any, Callable

RUNS_DIR = "runs"
_KEEP = 32  # recorded runs kept per cache folder (the oldest go first)
_RECENT_NS = 2_000_000_000  # a run that read a file changed this shortly before it started is not recorded
_FORMAT = 1


# -- keys and facts -------------------------------------------------------------------------------------------

def run_key(argv: list[str]) -> str:
    """Everything that picks a recording before its facts are checked: the command, where it runs, what the
    output streams are, gpulint's own code and the modules Python would import."""
    from gpulint import __version__
    from gpulint.cache import code_fingerprint

    streams = []
    for stream in (sys.stdout, sys.stderr):
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = None
        streams.append((tty, getattr(stream, "encoding", None), getattr(stream, "errors", None)))
    if any(tty for tty, _, _ in streams):
        try:
            streams.append(tuple(os.get_terminal_size(sys.__stdout__.fileno())))  # type: ignore[union-attr]
        except (OSError, AttributeError, ValueError):
            streams.append(None)
    cwd = os.getcwd()
    search = []
    for entry in sys.path:  # an installed or upgraded package changes its folder's modification time
        if entry and os.path.abspath(entry) != cwd:
            try:
                search.append((entry, os.stat(entry).st_mtime_ns))
            except OSError:
                search.append((entry, None))
    payload = json.dumps([_FORMAT, __version__, code_fingerprint(), sys.version, sys.executable, argv, cwd,
                          streams, search])
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _of(info: os.stat_result) -> list:
    """What a replay compares of a path's status. A folder is its kind only: what it holds is a listing of its
    own, where the run read one."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return ["f", info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
    if stat.S_ISDIR(mode):
        return ["d"]
    if stat.S_ISLNK(mode):
        return ["l", info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
    return ["o", stat.S_IFMT(mode)]


def _signature(path: str, follow: bool) -> list:
    try:
        return _of(os.stat(path) if follow else os.lstat(path))
    except OSError as error:
        return ["x", error.errno or 0]


def _entries(entries: Any) -> list:
    return sorted([entry.name, entry.is_dir(follow_symlinks=False), entry.is_symlink()] for entry in entries)


def _listing(path: str) -> list | None:
    try:
        with os.scandir(path) as entries:
            return _entries(entries)
    except OSError:
        return None


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _path(value: Any) -> str | None:
    if isinstance(value, int):
        return None  # a file descriptor: opened before, or by the recorder's own machinery
    try:
        path = os.fsdecode(os.fspath(value))
    except TypeError:
        return None
    return os.path.abspath(path)


# -- recording ------------------------------------------------------------------------------------------------

class _Tee:
    """An output stream that also keeps what was written, in order, beside the other stream's writes."""

    def __init__(self, stream: Any, name: str, log: list[tuple[str, str]]) -> None:
        self._stream, self._name, self._log = stream, name, log

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._log.append((self._name, text))
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        if name == "buffer":  # bytes written past the text layer would not be replayed
            raise AttributeError(name)
        return getattr(self._stream, name)


class _Listing:
    """`os.scandir`'s iterator, keeping the entries the run saw (the run's own view of the folder)."""

    def __init__(self, iterator: Any, done: Callable[[list], None]) -> None:
        self._iterator, self._done, self._seen = iterator, done, []

    def __iter__(self) -> "_Listing":
        return self

    def __next__(self) -> Any:
        try:
            entry = next(self._iterator)
        except StopIteration:
            self._done(self._seen)
            raise
        self._seen.append(entry)
        return entry

    def __enter__(self) -> "_Listing":
        return self

    def __exit__(self, *exc: object) -> None:
        self._iterator.close()

    def close(self) -> None:
        self._iterator.close()


class Recorder:
    """Traces what one `check` reads, as it reads it, captures what it prints, and stores both when the run
    qualifies. Each fact is taken when the run looks (a file's status when it is opened or tested, a folder's
    entries as they are listed), so a change made while the run goes on is not recorded as what it saw."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.stats: dict[tuple[str, bool], list] = {}
        self.listed: dict[str, list | None] = {}
        self.links: dict[str, str | None] = {}
        self.writes: set[str] = set()
        self.env: dict[str, str | None] = {}
        self.untraceable: list[str] = []  # why this run cannot be replayed
        self.output: list[tuple[str, str]] = []
        self.started_ns = time.time_ns()
        self._pid = os.getpid()
        self._undo: list[Callable[[], None]] = []

    # -- tracing ----------------------------------------------------------------------------------------------

    def _mine(self) -> bool:
        return os.getpid() == self._pid  # a forked child's reads are not this run's (and it is untraceable)

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return  # not on this platform (os.fork on Windows): nothing can call it
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def _saw(self, where: str, follow: bool, signature: list) -> None:
        self.stats.setdefault((where, follow), signature)

    def start(self) -> "Recorder":
        recorder = self

        def traced_stat(original: Any, follow_default: bool) -> Any:
            def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
                where = _path(path) if recorder._mine() else None
                if where is not None and kwargs.get("dir_fd") is not None:
                    recorder.untraceable.append("stat relative to a folder descriptor")
                follow = bool(kwargs.get("follow_symlinks", follow_default))
                try:
                    result = original(path, *args, **kwargs)
                except OSError as error:
                    if where is not None:
                        recorder._saw(where, follow, ["x", error.errno or 0])
                    raise
                if where is not None:
                    recorder._saw(where, follow, _of(result))
                return result
            return wrapper

        def traced_access(original: Any) -> Any:
            def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
                where = _path(path) if recorder._mine() else None
                if where is not None:
                    recorder._saw(where, True, _signature(where, True))
                return original(path, *args, **kwargs)
            return wrapper

        def traced_open(original: Any) -> Any:
            def wrapper(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
                where = _path(file) if recorder._mine() else None
                try:
                    handle = original(file, mode, *args, **kwargs)
                except OSError as error:
                    if where is not None:
                        recorder._saw(where, True, ["x", error.errno or 0])
                    raise
                if where is not None:
                    if any(c in mode for c in "wax+"):
                        recorder.writes.add(where)
                    else:
                        recorder._saw(where, True, _of(os.fstat(handle.fileno())))
                return handle
            return wrapper

        def traced_os_open(original: Any) -> Any:
            writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

            def wrapper(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
                where = _path(path) if recorder._mine() else None
                try:
                    fd = original(path, flags, *args, **kwargs)
                except OSError as error:
                    if where is not None and not flags & writing:
                        recorder._saw(where, True, ["x", error.errno or 0])
                    raise
                if where is not None:
                    if kwargs.get("dir_fd") is not None:
                        recorder.untraceable.append("open relative to a folder descriptor")
                    elif flags & writing:
                        recorder.writes.add(where)
                    else:
                        recorder._saw(where, True, _of(os.fstat(fd)))
                return fd
            return wrapper

        def traced_listdir(original: Any) -> Any:
            def wrapper(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
                names = original(path, *args, **kwargs)
                where = _path(path) if recorder._mine() else None
                if where is not None and where not in recorder.listed:
                    recorder.listed[where] = _listing(where)  # names only here: the kinds are read at once
                return names
            return wrapper

        def traced_scandir(original: Any) -> Any:
            def wrapper(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
                iterator = original(path, *args, **kwargs)
                where = _path(path) if recorder._mine() else None
                if where is None:
                    if recorder._mine():
                        recorder.untraceable.append("listing of a folder descriptor")
                    return iterator
                recorder.listed.setdefault(where, None)  # a listing not read to its end is no fact

                def done(entries: list) -> None:
                    if recorder.listed.get(where) is None:
                        recorder.listed[where] = _entries(entries)
                return _Listing(iterator, done)
            return wrapper

        def traced_readlink(original: Any) -> Any:
            def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
                where = _path(path) if recorder._mine() else None
                try:
                    target = original(path, *args, **kwargs)
                except OSError:
                    target = None
                    raise
                finally:
                    if where is not None:
                        recorder.links.setdefault(where, target)
                return target
            return wrapper

        def traced_change(original: Any) -> Any:
            def wrapper(*paths: Any, **kwargs: Any) -> Any:
                if recorder._mine():
                    recorder.writes.update(p for p in (_path(path) for path in paths[:2]) if p is not None)
                return original(*paths, **kwargs)
            return wrapper

        def untraceable(why: str) -> Callable[[Any], Any]:
            def make(original: Any) -> Any:
                def wrapper(*args: Any, **kwargs: Any) -> Any:
                    if recorder._mine():
                        recorder.untraceable.append(why)
                    return original(*args, **kwargs)
                return wrapper
            return make

        def traced_getitem(original: Any) -> Any:
            def wrapper(environ: Any, key: str) -> Any:
                try:
                    value = original(environ, key)
                except KeyError:
                    if environ is os.environ and recorder._mine():
                        recorder.env.setdefault(key, None)
                    raise
                if environ is os.environ and recorder._mine():
                    recorder.env.setdefault(key, value)
                return value
            return wrapper

        self._patch(os, "stat", lambda o: traced_stat(o, True))
        self._patch(os, "lstat", lambda o: traced_stat(o, False))
        self._patch(os, "access", traced_access)
        self._patch(builtins, "open", traced_open)
        self._patch(io, "open", traced_open)
        self._patch(os, "open", traced_os_open)
        self._patch(os, "listdir", traced_listdir)
        self._patch(os, "scandir", traced_scandir)
        self._patch(os, "readlink", traced_readlink)
        for name in ("replace", "rename", "unlink", "remove", "mkdir", "rmdir", "makedirs", "chmod", "utime",
                     "truncate", "symlink", "link"):
            self._patch(os, name, traced_change)
        self._patch(os, "fork", untraceable("a process was forked (files were linted)"))
        import subprocess

        self._patch(subprocess.Popen, "__init__", untraceable("a process was started"))
        environ_type = type(os.environ)
        self._patch(environ_type, "__getitem__", traced_getitem)
        self._patch(environ_type, "__setitem__", untraceable("the environment was changed"))
        self._patch(environ_type, "__delitem__", untraceable("the environment was changed"))
        self._patch(environ_type, "__iter__", untraceable("the whole environment was read"))
        self._patch(sys, "stdout", lambda stream: _Tee(stream, "out", self.output))
        self._patch(sys, "stderr", lambda stream: _Tee(stream, "err", self.output))
        return self

    def stop(self) -> None:
        while self._undo:
            self._undo.pop()()

    # -- storing ----------------------------------------------------------------------------------------------

    def facts(self, cache_dir: str) -> dict[str, Any] | None:
        """What the run read, outside the cache folder; None if the run cannot be replayed."""
        cache = os.path.abspath(cache_dir)

        def outside(path: str) -> bool:
            return path != cache and not path.startswith(cache + os.sep)

        if self.untraceable or any(outside(p) for p in self.writes) or None in self.listed.values():
            return None
        facts: dict[str, Any] = {
            "stat": [[where, follow, signature] for (where, follow), signature in sorted(self.stats.items())
                     if outside(where)],
            "listed": {where: entries for where, entries in sorted(self.listed.items()) if outside(where)},
            "links": {where: target for where, target in sorted(self.links.items()) if outside(where)},
        }
        # A file changed within a timestamp's granularity of the run could change again, unseen by a replay's
        # comparison of timestamps: such a run is not recorded (the next one will be).
        recent = self.started_ns - _RECENT_NS
        if any(signature[0] in "fl" and max(signature[2], signature[3]) >= recent
               for _, _, signature in facts["stat"]):
            return None
        return facts

    def save(self, cache_dir: str, exit_code: int) -> bool:
        """Store the run under `cache_dir` if everything it depended on was seen and has not changed since it
        was read. Returns whether it was stored."""
        self.stop()
        facts = self.facts(cache_dir) if exit_code in (0, 1) else None
        if facts is None:
            return False
        record = {"format": _FORMAT, "argv": self.argv, "env": self.env, "facts": facts, "output": self.output,
                  "exit": exit_code}
        if not _holds(record, self.argv):
            return False  # something changed while the run went on
        folder = os.path.join(os.path.abspath(cache_dir), RUNS_DIR)
        import tempfile

        try:
            os.makedirs(folder, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=folder, prefix=".run.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
            os.replace(temporary, os.path.join(folder, run_key(self.argv) + ".json"))
        except OSError:
            return False
        _prune(folder)
        return True


def _prune(folder: str) -> None:
    try:
        runs = sorted((entry.stat().st_mtime_ns, entry.path) for entry in os.scandir(folder)
                      if entry.name.endswith(".json"))
        for _, path in runs[:-_KEEP]:
            os.unlink(path)
    except OSError:
        pass


# -- replaying ------------------------------------------------------------------------------------------------

def _candidates(argv: list[str]) -> list[str]:
    """Where a recording of this command may be: the cache folder it names, or `.gpulint_cache` in the working
    directory or a folder above it (the default lies beside the nearest config file)."""
    from gpulint.cache import CACHE_DIR_NAME

    for index, arg in enumerate(argv):
        if arg == "--cache-dir" and index + 1 < len(argv):
            return [argv[index + 1]]
        if arg.startswith("--cache-dir="):
            return [arg.split("=", 1)[1]]
    chosen = os.environ.get("GPULINT_CACHE_DIR")
    if chosen:
        return [chosen]
    found, current = [], os.getcwd()
    while True:
        found.append(os.path.join(current, CACHE_DIR_NAME))
        parent = os.path.dirname(current)
        if parent == current:
            return found
        current = parent


def _holds(record: dict, argv: list[str]) -> bool:
    if record.get("format") != _FORMAT or record.get("argv") != argv or record.get("exit") not in (0, 1):
        return False
    for name, value in record["env"].items():
        if os.environ.get(name) != value:
            return False
    facts = record["facts"]
    for where, follow, signature in facts["stat"]:
        if _signature(where, follow) != signature:
            return False
    for where, listing in facts["listed"].items():
        if _listing(where) != listing:
            return False
    for where, target in facts["links"].items():
        if _readlink(where) != target:
            return False
    return True


def replay(argv: list[str]) -> int | None:
    """Print the recorded output of this exact `check` and return its exit code, if a recording exists and every
    fact it rests on still holds; None otherwise (run it)."""
    if os.environ.get("GPULINT_NO_CACHE", "") not in ("", "0") or os.environ.get("GPULINT_DEBUG"):
        return None
    try:
        key = run_key(argv)
        for folder in _candidates(argv):
            try:
                with open(os.path.join(folder, RUNS_DIR, key + ".json"), encoding="utf-8") as handle:
                    record = json.load(handle)
            except (OSError, ValueError):
                continue
            if not isinstance(record, dict) or not _holds(record, argv):
                return None
            streams = {"out": sys.stdout, "err": sys.stderr}
            for name, text in record["output"]:
                streams[name].write(text)
            return int(record["exit"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a damaged recording: run the command
    return None


def findable(argv: list[str], cache_dir: str) -> bool:
    """Would `replay` look for this command's recording in `cache_dir`?"""
    return os.path.abspath(cache_dir) in {os.path.abspath(folder) for folder in _candidates(argv)}

