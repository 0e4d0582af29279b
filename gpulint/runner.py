"""Orchestrates a run: discover files, gather program facts, lint or fix each file, collect results."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import pickle
import re
import selectors
import signal
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from typing import TYPE_CHECKING

from gpulint.cache import ResultCache, code_fingerprint, content_hash, digest
from gpulint.diagnostics import Diagnostic, Position, Safety, Severity
from gpulint.discovery import discover_resolved, find_project_root
from gpulint.program import imported_files, subclasses_in_text
from gpulint.registry import META_CODES, all_rules, rule_by_code
from gpulint.source import SourceError, SourceFile, read_source, write_source_atomically

if TYPE_CHECKING:
    from gpulint.engine import ProgramFacts
    from gpulint.fixer import FixOutcome
    from gpulint.rule import Rule

# libcst, the engine and the rules are imported where a file is linted (`_execute_all` imports them once, before
# workers are forked): a run whose files are all results-cache hits needs none of them.

@dataclass
class FileReport:
    path: str  # as shown to the user
    diagnostics: list[Diagnostic] = field(default_factory=list)
    fix: FixOutcome | None = None
    original: str | None = None  # text as read (code frames, diffs)
    written: bool = False
    error: str | None = None  # one-line problem with this file (fix not written, ...)
    cacheable: bool = True  # False for a file not checked this time (crash, time limit): never cached


@dataclass
class RunResult:
    files: list[FileReport]
    errors: list[str]  # internal errors (rule crashes): exit code 2

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return [d for f in self.files for d in f.diagnostics]


def display_path(path: Path) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative


def program_facts(sources: Sequence[tuple[str, SourceFile]]) -> ProgramFacts:
    """Cheap text-level facts about all files of the run, so that no file is parsed twice."""
    from gpulint.analysis import IS_AVAILABLE_TEXT, PROGRAM_CUDA_TEXT, PROGRAM_CUDA_WORDS
    from gpulint.engine import ProgramFacts

    maybe_cuda_text = re.compile(IS_AVAILABLE_TEXT)
    facts = ProgramFacts()
    for path, source in sources:
        text = facts.sources[path] = source.text
        # the literal tests first: most files name neither, and the regexes have no literal prefix to skip by
        facts.cuda_evidence |= any(word in text for word in PROGRAM_CUDA_WORDS) and bool(PROGRAM_CUDA_TEXT.search(text))
        facts.maybe_cuda_evidence |= "is_available" in text and bool(maybe_cuda_text.search(text))
    facts.module_classes.update(_module_classes(facts.sources.values()))
    return facts


def _module_classes(texts: Iterable[str]) -> set[str]:
    """Classes of the program that are networks by their bases' names (`class Net(nn.Module)`, a Hugging Face
    `PreTrainedModel`, and classes derived from those), read from the text."""
    return subclasses_in_text(texts, {"Module", "LightningModule", "PreTrainedModel"})


_CONTEXT_DEPTH = 3  # import levels followed from the files named on the command line
_CONTEXT_LIMIT = 300  # files read for context at most


def _imported_context(sources: Sequence[tuple[str, SourceFile]], real: dict[str, Path]
                      ) -> list[tuple[str, SourceFile]]:
    """First-party modules the run's files import (transitively) that the run does not lint: read, not linted,
    so that `gpulint check train.py` (or a pre-commit hook given only the changed files) sees the same program
    as `gpulint check .`: TF32 set in an imported config module, the network defined in `models.py`."""
    frontier = [(real[shown], source) for shown, source in sources]
    seen = {str(real) for real, _ in frontier}
    roots: dict[Path, Path] = {}
    context: list[tuple[str, SourceFile]] = []
    for _ in range(_CONTEXT_DEPTH):
        following: list[tuple[Path, SourceFile]] = []
        shown: list[str] = []
        for real, source in frontier:
            root = roots.get(real.parent)
            if root is None:
                root = roots[real.parent] = find_project_root(real.parent)
            for found in imported_files(real, source.text, root, resolved=True):
                found_real = found.resolve()
                key = str(found_real)
                if key in seen or len(context) >= _CONTEXT_LIMIT:
                    continue
                seen.add(key)
                try:
                    read = read_source(found)
                except SourceError:
                    continue  # context only: a file the run cannot read is simply not consulted
                if _size_problem(read.raw) is not None:
                    continue
                following.append((found_real, read))
                shown.append(display_path(found))
        context.extend(zip(shown, (read for _, read in following)))
        frontier = following
    return context


def _always(diagnostic: Diagnostic) -> bool:
    return True


def _io_error(path: str, message: str) -> Diagnostic:
    start = Position(1, 1)
    return Diagnostic(path, start, start, "GPU901", META_CODES["GPU901"], message, Severity.ERROR)


MAX_FILE_SIZE = 5 * 1024 * 1024  # bytes; larger files are not checked (env GPULINT_MAX_FILE_SIZE)
_STARVED_GRACE = 4  # times the per-file limit a worker starved of CPU may run in wall time
_STARVED_POLL = 0.5  # seconds between looks at a starved worker's CPU time
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") and "SC_CLK_TCK" in os.sysconf_names else 100


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of a process (Linux `/proc`); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


FILE_TIME_LIMIT = 300.0  # seconds of work on one file before it is given up (env GPULINT_FILE_TIMEOUT)


def _limit(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def _size_problem(raw: bytes) -> str | None:
    limit = int(_limit("GPULINT_MAX_FILE_SIZE", MAX_FILE_SIZE))
    if len(raw) <= limit:
        return None
    return (f"file is {_megabytes(len(raw))}, over gpulint's limit of {_megabytes(limit)} per file "
            f"(GPULINT_MAX_FILE_SIZE); not checked")


def _megabytes(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB" if size >= 100 * 1024 else f"{size} bytes"


def run(
    paths: Sequence[str],
    rules: Sequence[type[Rule]],
    *,
    fix: bool = False,
    write: bool = False,
    min_safety: Safety = Safety.SAFE,
    excludes: Sequence[str] | None = None,
    respect_gitignore: bool = True,
    rule_options: dict[str, dict[str, Any]] | None = None,
    can_fix: Callable[[Diagnostic], bool] = _always,
    file_filter: Callable[[Path], Sequence[type[Rule]]] | None = None,
    options_for: Callable[[Path], dict[str, dict[str, Any]]] | None = None,  # per-file rule options (config)
    progress: Callable[[str], None] | None = None,  # called after each file (progress bar)
    cache_dir: Path | None = None,  # `check` results cache; None disables it
    jobs: int | None = None,  # worker processes; None: automatic
    isolate: bool = False,  # lint each file in a forked worker that may crash or time out alone (the CLI's way)
) -> RunResult:
    kwargs = {"excludes": excludes} if excludes is not None else {}
    files, problems = discover_resolved(paths, respect_gitignore=respect_gitignore, **kwargs)
    reports: list[FileReport] = [FileReport(shown, [_io_error(shown, p.message)], cacheable=False)
                                 for p in problems for shown in [display_path(Path(p.path))]]
    sources: list[tuple[str, SourceFile]] = []
    real: dict[str, Path] = {}  # shown -> the file resolved (its results-cache key)
    for path, resolved in files:
        shown = display_path(path)
        try:
            source = read_source(path)
        except SourceError as error:
            reports.append(FileReport(shown, [_io_error(shown, str(error))]))
            continue
        too_large = _size_problem(source.raw)
        if too_large is not None:
            reports.append(FileReport(shown, [_io_error(shown, too_large)], cacheable=False))
            continue
        sources.append((shown, source))
        real[shown] = resolved
    program_files = [*sources, *_imported_context(sources, real)]
    tasks = [_Task(shown, source, tuple(r.code for r in (file_filter(source.path) if file_filter else rules)),
                   options_for(source.path) if options_for else (rule_options or {}), str(real[shown]))
             for shown, source in sources]
    settings = _Settings(fix, write, min_safety, can_fix)
    cache = _open_cache(cache_dir, tasks, fix) if cache_dir is not None else None
    program_key = digest(sorted((shown, content_hash(s.raw)) for shown, s in program_files))
    remembered = cache.facts_for(program_key) if cache is not None else None
    # The program's facts key the results cache: without a cache, or with the key remembered, neither they nor the
    # call graph are needed here (the workers get the graph from a process that builds it while they parse).
    program: ProgramFacts | None = None
    if cache is not None and remembered is None:
        program = program_facts(program_files)
        facts_key = digest(program.summary())
    else:
        facts_key = remembered or ""
    pending: list[_Task] = []
    for task in tasks:
        cached = cache.get(_file_key(task), content_hash(task.source.raw), facts_key, program_key) if cache else None
        if cached is None:
            pending.append(task)
        else:
            reports.append(FileReport(task.shown, cached, original=task.source.text))
            if progress:
                progress(task.shown)
    if cache is not None:
        cache.remember_facts(program_key, facts_key)
    errors: list[str] = []
    graph: _GraphBuilder | None = None
    if pending and program is None and isolate and not fix and _isolating():
        # the call graph needs no libcst: its builder starts before libcst, the engine and the rules are imported
        from gpulint.semantic.callgraph import call_graph_state

        texts = {shown: source.text for shown, source in program_files}
        graph = _GraphBuilder(lambda: call_graph_state(texts, frozenset(_module_classes(texts.values()))), set())
    try:
        if pending and program is None:
            program = program_facts(program_files)
        for task, outcome, searched in _execute_all(pending, program, settings, jobs, isolate, graph):  # type: ignore[arg-type]
            if isinstance(outcome, str):
                errors.append(outcome)
            else:
                reports.append(outcome)
                if write:  # only this process writes: a worker never writes, so none can after gpulint is gone
                    _write(outcome, task.source)
                if cache is not None and outcome.cacheable:
                    cache.put(_file_key(task), content_hash(task.source.raw), facts_key,
                              program_key if searched else None, outcome.diagnostics)
            if progress:
                progress(task.shown)
    finally:
        if graph is not None:
            graph.stop()
    if cache is not None:
        cache.save()
    reports.sort(key=lambda r: r.path)
    return RunResult(reports, errors)


@dataclass(frozen=True)
class _Task:
    shown: str
    source: SourceFile
    codes: tuple[str, ...]
    options: dict[str, dict[str, Any]]
    key: str  # the file resolved: its results-cache key


@dataclass(frozen=True)
class _Settings:
    fix: bool
    write: bool
    min_safety: Safety
    can_fix: Callable[[Diagnostic], bool]


def _file_key(task: _Task) -> str:
    return task.key


def _open_cache(directory: Path, tasks: Sequence[_Task], fix: bool) -> ResultCache | None:
    if fix:
        return None  # fixing re-lints as it goes; the cache serves `check`
    settings = sorted({(t.codes, json.dumps(t.options, sort_keys=True)) for t in tasks})
    return ResultCache(directory, digest(code_fingerprint(), settings))


# Worker state: set once per process by the pool initializer (program facts are large; send them once).
_WORKER: dict[str, Any] = {}


def _init_worker(program: ProgramFacts, settings: _Settings) -> None:
    _WORKER["program"], _WORKER["settings"] = program, settings


def _execute(task: _Task, program: ProgramFacts | None = None, settings: _Settings | None = None,
             module: Any = None) -> tuple[_Task, FileReport | str, bool]:
    """Lint (or fix) one file; `module` is its syntax tree when a worker parsed it ahead (`_preparse`)."""
    from gpulint.engine import RuleCrash, cyclic_gc_paused

    program = program or _WORKER["program"]
    settings = settings or _WORKER["settings"]
    program.searched = False
    rules = [rule_by_code(code) for code in task.codes]
    try:
        with cyclic_gc_paused():  # also over the fixer's codegen and re-lints
            report = _run_file(task.shown, task.source, rules, program, settings.fix, settings.min_safety,
                               task.options, settings.can_fix, module)
    except RuleCrash as crash:
        return task, str(crash), False
    except RecursionError:
        return task, _not_checked(task, "too deeply nested for gpulint's analysis (RecursionError); not checked"), False
    except Exception as error:  # noqa: BLE001 - a gpulint bug on one file: that file's error, the run goes on
        return task, f"{task.shown}: internal error: {type(error).__name__}: {' '.join(str(error).split())}", False
    return task, report, program.searched


def _worker_count(jobs: int | None, tasks: Sequence[_Task], settings: _Settings, forked: bool = False) -> int:
    if jobs is not None:
        return max(1, jobs)
    if os.environ.get("PRE_COMMIT"):
        return 1  # pre-commit already runs hooks in parallel: no nested pools
    if len(tasks) < 2 or sum(len(task.source.text) for task in tasks) < _PARALLEL_TEXT:
        return 1  # a second worker would repeat the program-level work (indexes, searches) for little gain
    if not forked:
        try:
            pickle.dumps(settings)
        except (pickle.PicklingError, AttributeError, TypeError):
            return 1  # a per-run callback (e.g. from a test) cannot travel to workers
    return min(os.cpu_count() or 1, 8)


# Characters of source to check below which one worker is used: about a second of work (8-13 ms per KB on
# pytorch/examples and alpha_zero). A 3-file, 35 KB program took 0.98 s of CPU with two workers, 0.86 s with one.
_PARALLEL_TEXT = 96 * 1024


def _isolating() -> bool:
    """Can files be linted in forked workers (the CLI's way)? Not where fork is missing, nor when turned off."""
    return _CAN_FORK and os.environ.get("GPULINT_NO_ISOLATION", "") in ("", "0")


def _execute_all(tasks: Sequence[_Task], program: ProgramFacts, settings: _Settings, jobs: int | None,
                 isolate: bool = False, graph: "_GraphBuilder | None" = None
                 ) -> Iterator[tuple[_Task, FileReport | str, bool]]:
    """Each task's outcome. `graph`: a builder of the program's call graph started already (isolated runs)."""
    if not tasks:
        return
    all_rules()  # the rules and libcst, imported once here: forked workers inherit them
    workers = _worker_count(jobs, tasks, settings, isolate)
    if isolate and _isolating():
        yield from _Isolated(tasks, program, settings, min(workers, len(tasks)), graph).results()
        return
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield _execute(task, program, settings)
        return
    program.call_graph_state()  # the call graph is built here, once, before the pool's workers start
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    done: set[int] = set()
    try:
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                 initargs=(program, settings)) as pool:
            for index, result in enumerate(pool.map(_execute, tasks, chunksize=max(1, len(tasks) // (workers * 8)))):
                done.add(index)
                yield result
    except BrokenProcessPool:
        for index, task in enumerate(tasks):
            if index not in done:
                yield task, _not_checked(task, "a worker process died while checking this file or one beside it; "
                                               "not checked"), False


def _not_checked(task: _Task, message: str) -> FileReport:
    return FileReport(task.shown, [_io_error(task.shown, message)], original=task.source.text, cacheable=False)


# -- isolation: each file's work runs in a forked worker process ----------------------------------------------
#
# libcst's native parser can crash the whole process (a stack overflow on deep input), and some inputs take
# very long. Every file is therefore linted in a forked child: a child that dies takes only its current file
# with it (reported as that file's GPU900/GPU901, the run goes on in a new child), a file that runs past the
# time limit is given up the same way, and children die with their parent (PR_SET_PDEATHSIG, and EOF on their
# task pipe). Children never write files: fixes are written by this process as results arrive.

_CAN_FORK = sys.platform == "linux" and hasattr(os, "fork")
_FRAME = 8  # bytes of a result frame's length prefix


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (best effort; a no-op elsewhere)."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _flush_before_fork() -> None:
    """Nothing buffered in this process may be written twice, by it and by a forked child."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def call_isolated(function: Callable[[], Any], path: str, text: str) -> tuple[bool, Any]:
    """`function()` in a forked child (Linux; in-process elsewhere): (True, its result) or, when the child died
    (a crash of the native parser), (False, the diagnostic that reports it: GPU900 where CPython rejects `text`
    too, else GPU901). The result must pickle."""
    from gpulint.engine import python_syntax_error, syntax_error_diagnostic

    if not _isolating():
        return True, function()
    _flush_before_fork()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            os.close(read_end)
            die_with_parent()
            data = pickle.dumps(function(), protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view):]
        except BaseException:  # noqa: BLE001 - re-raised in the parent by running the function there
            status = 3
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as pipe:
        while chunk := pipe.read(1 << 20):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return True, pickle.loads(b"".join(chunks))
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3:
        return True, function()  # a Python exception: raise it here, where the caller handles it
    rejected = python_syntax_error(text, path)
    if rejected is not None:
        return False, syntax_error_diagnostic(path, rejected)
    signal_number = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    how = f"signal {signal.Signals(signal_number).name}" if signal_number in signal.valid_signals() \
        else f"exit status {os.WEXITSTATUS(status)}"
    return False, _io_error(path, f"gpulint's parser crashed on this file ({how}); not checked")


class _Worker:
    def __init__(self, pool: "_Isolated") -> None:
        task_read, task_write = os.pipe()
        result_read, result_write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            status = 0
            try:
                os.close(task_write)
                os.close(result_read)
                _child_setup(pool.parent_fds)
                if os.getppid() == parent:
                    _worker_loop(task_read, result_write, pool.tasks, pool.program, pool.settings)
            except BaseException:  # noqa: BLE001 - a child never unwinds into the parent's code
                status = 1
            finally:
                os._exit(status)
        os.close(task_read)
        os.close(result_write)
        self.pid = pid
        self.tasks_fd = task_write
        self.results_fd = result_read
        self.current: int | None = None
        self.started = 0.0
        self.cpu_started: float | None = None  # the worker's CPU seconds when its current file began
        self.buffer = bytearray()
        self.has_graph = pool.graph is None  # no graph being built: it is in this process already (inherited)
        self.paused: tuple[float, float | None] | None = None  # (when, CPU seconds) program-wide work began
        self.parsed: list[int] = []  # files this worker parsed ahead, waiting for the call graph
        self.parse_time: dict[int, float] = {}  # seconds each of them took (counted against the time limit)
        pool.parent_fds.update((task_write, result_read))


def _child_setup(parent_fds: set[int]) -> None:
    """First steps of a forked child of `_Isolated` (a worker or the call-graph builder)."""
    for fd in parent_fds:  # siblings' pipe ends: a child must not keep them open
        try:
            os.close(fd)
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    die_with_parent()
    gc.freeze()  # what the parent built (modules, sources, the call graph) is never scanned here: a full
    # collection over it cost about 0.12 s per worker on pytorch/examples, and would copy its pages


# Task words, parent to worker (4 bytes): a file's index (lint it), the index with _PARSE_AHEAD set (parse it and
# keep the tree: the call graph is not there yet), or _GRAPH followed by a frame holding the call graph.
_PARSE_AHEAD = 1 << 31
_GRAPH = (1 << 32) - 1
_PARSE_AHEAD_TEXT = 1 << 20  # characters of source a worker parses ahead at most (its trees: about 30x that)


def _worker_loop(task_fd: int, result_fd: int, tasks: Sequence[_Task], program: ProgramFacts,
                 settings: _Settings) -> None:
    from gpulint import engine

    engine.PROGRAM_WORK_LISTENER = lambda started: _send(result_fd, ("program", started))
    parsed: dict[int, Any] = {}  # index -> syntax tree parsed ahead
    while True:
        header = _read_exactly(task_fd, 4)
        if header is None:  # the parent closed the pipe (done) or died
            return
        word = int.from_bytes(header, "big")
        if word == _GRAPH:
            size = _read_exactly(task_fd, _FRAME)
            data = _read_exactly(task_fd, int.from_bytes(size, "big")) if size is not None else None
            if data is None:
                return
            program.set_call_graph_state(pickle.loads(data))
            continue
        if word & _PARSE_AHEAD:
            index = word & ~_PARSE_AHEAD
            tree = _preparse(tasks[index])
            if tree is not None:
                gc.disable()  # a tree kept between files is millions of objects: no collector passes over them
                parsed[index] = tree
            _send(result_fd, ("parsed", index))
            continue
        index = word
        _, outcome, searched = _execute(tasks[index], program, settings, parsed.pop(index, None))
        if not parsed and not gc.isenabled():
            gc.freeze()  # what the files parsed ahead left (the program's indexes and caches) is kept to the end:
            gc.enable()  # moved out of the collector's way, as the inherited heap was
        try:
            payload = pickle.dumps((index, outcome, searched), protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as error:
            payload = pickle.dumps((index, f"{tasks[index].shown}: internal error: result cannot be sent "
                                           f"({type(error).__name__})", False))
        _write_frame(result_fd, payload)


def _preparse(task: _Task) -> Any:
    """The syntax tree `lint_text` would parse for this file, or None (no rule can match it, a syntax error, a
    file the parse guard sends elsewhere: the lint then goes its ordinary way)."""
    from gpulint.engine import cyclic_gc_paused, might_match, parse

    rules = [rule_by_code(code) for code in task.codes]
    if not might_match(task.source.text, rules):
        return None
    try:
        with cyclic_gc_paused():
            return parse(task.source.text)
    except Exception:  # noqa: BLE001 - the lint parses again and reports what this was
        return None


def _send(fd: int, message: Any) -> None:
    _write_frame(fd, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _write_frame(fd: int, payload: bytes) -> None:
    view = memoryview(len(payload).to_bytes(_FRAME, "big") + payload)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class _GraphBuilder:
    """Builds the program's call graph in a forked child while the workers parse their first files (it needs
    no parse, they need it only once parsed), and hands it over when it arrives. If the child fails, the
    parent builds the graph itself, as it did before the workers started."""

    def __init__(self, build: Callable[[], tuple], parent_fds: set[int]) -> None:
        _flush_before_fork()
        read_end, write_end = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                os.close(read_end)
                _child_setup(parent_fds)
                if os.getppid() == parent:
                    gc.disable()  # syntax trees of every file (ast): no reference cycles; the child exits after
                    state = build()
                    _write_frame(write_end, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
            except BaseException:  # noqa: BLE001
                status = 1
            finally:
                os._exit(status)
        os.close(write_end)
        self.pid = pid
        self.fd = read_end
        self.buffer = bytearray()
        self.finished = False

    def read(self) -> bool:
        """Read what is there; True once the child is done (its state is then in `state()`)."""
        try:
            chunk = os.read(self.fd, 1 << 20)
        except OSError:
            chunk = b""
        self.buffer += chunk
        return not chunk

    def state(self) -> tuple | None:
        """The graph the child sent, or None if it failed."""
        self._close()
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = 1
        if status != 0 or len(self.buffer) < _FRAME:
            return None
        size = int.from_bytes(self.buffer[:_FRAME], "big")
        if len(self.buffer) != _FRAME + size:
            return None
        try:
            return pickle.loads(self.buffer[_FRAME:])
        except Exception:  # noqa: BLE001 - rebuilt here instead
            return None

    def stop(self) -> None:
        """End the child if it still runs (a run that ends early); nothing once its state was taken."""
        if self.finished:
            return
        self._close()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass

    def _close(self) -> None:
        if not self.finished:
            self.finished = True
            os.close(self.fd)


class _Isolated:
    """Runs tasks in forked workers, one file at a time per worker, handing out the next file as one is done.

    While the call graph is still being built (by `_GraphBuilder`, for a `check` whose graph was not needed
    before), the workers are handed files to parse ahead, one at a time like the rest: a crash or the time
    limit in that parse is that file's, as it would be in its lint. Each worker then gets the graph and lints
    the files it parsed (the time they took counts against the limit), then the rest."""

    def __init__(self, tasks: Sequence[_Task], program: ProgramFacts, settings: _Settings, workers: int,
                 graph: "_GraphBuilder | None" = None) -> None:
        self.tasks, self.program, self.settings = tasks, program, settings
        self.workers = max(1, workers)
        self.limit = _limit("GPULINT_FILE_TIMEOUT", FILE_TIME_LIMIT)
        # largest files first: the last files handed out are small, so the workers finish together
        self.queue: deque[int] = deque(sorted(range(len(tasks)), key=lambda i: -len(tasks[i].source.text)))
        self.parent_fds: set[int] = set()
        self.live: list[_Worker] = []
        self.selector = selectors.DefaultSelector()
        self.graph: _GraphBuilder | None = None  # the call graph's builder while it runs
        if graph is not None:
            self._watch_graph(graph)
        self.graph_frame = b""

    def _spawn(self) -> _Worker:
        _flush_before_fork()
        worker = _Worker(self)
        self.live.append(worker)
        self.selector.register(worker.results_fd, selectors.EVENT_READ, worker)
        return worker

    def _start_graph(self) -> None:
        if self.program.has_call_graph or self.graph is not None:
            return  # built already (it keys the results cache), or being built since the run began
        if self.settings.fix:
            self.program.call_graph_state()  # fixing: the fixer parses for itself, there is nothing to parse ahead
            return
        self._watch_graph(_GraphBuilder(self.program.call_graph_state, self.parent_fds))

    def _watch_graph(self, graph: _GraphBuilder) -> None:
        self.graph = graph
        self.selector.register(graph.fd, selectors.EVENT_READ, graph)
        self.parent_fds.add(graph.fd)  # workers forked later close it

    def _graph_done(self) -> None:
        """The builder finished: take its graph (or build it here), then hand it to every idle worker."""
        graph = self.graph
        assert graph is not None
        self.selector.unregister(graph.fd)
        self.parent_fds.discard(graph.fd)
        state = graph.state()
        self.graph = None
        if state is not None:
            self.program.set_call_graph_state(state)
        else:
            self.program.call_graph_state()
        for worker in list(self.live):
            if worker.current is None:
                self._assign(worker)

    def _assign(self, worker: _Worker) -> bool:
        """Give `worker` its next instruction: the call graph if it lacks it and it is there, then the next file
        to lint (one it parsed ahead first), or, while the graph is not there, the next file to parse ahead.
        False if the worker is gone (its pipe broke): the file goes back to the queue."""
        now = time.monotonic()
        words = b""
        if not worker.has_graph and self.graph is None:
            if not self.graph_frame:
                data = pickle.dumps(self.program.call_graph_state(), protocol=pickle.HIGHEST_PROTOCOL)
                self.graph_frame = _GRAPH.to_bytes(4, "big") + len(data).to_bytes(_FRAME, "big") + data
            words = self.graph_frame
            worker.has_graph = True
        if worker.has_graph and worker.parsed:
            index = worker.parsed.pop(0)
            word, started = index, now - worker.parse_time.pop(index, 0.0)
        elif self.queue and (worker.has_graph or sum(len(self.tasks[i].source.text) for i in worker.parsed)
                             < _PARSE_AHEAD_TEXT):
            index = self.queue.popleft()
            word, started = (index, now) if worker.has_graph else (index | _PARSE_AHEAD, now)
        elif worker.has_graph and (stolen := self._steal_for(worker)) is not None:
            index, word, started = stolen, stolen, now
        else:
            worker.current = None
            index = None
        if index is not None:
            worker.current, worker.started, worker.paused = index, started, None
            cpu = _cpu_seconds(worker.pid)
            worker.cpu_started = None if cpu is None else cpu - (now - started)  # a parse ahead counts in full
            words += word.to_bytes(4, "big")
        if not words:
            return True
        try:
            view = memoryview(words)
            while view:  # the worker waits for this (it is idle or just reported): a large graph frame cannot block
                view = view[os.write(worker.tasks_fd, view):]
        except OSError:
            if worker.current is not None:
                self.queue.appendleft(worker.current)
            worker.current = None
            return False  # it died between files: its EOF retires it
        return True

    def _steal_for(self, idle: _Worker) -> int | None:
        """A file another worker parsed ahead and has not begun, for an idle worker to parse and lint itself once
        the queue is empty: files parsed ahead are divided before their lint times are known, and parsing one
        again costs a fraction of what leaving a worker idle while another lints its backlog does. Taken from
        the worker with the most text waiting, which keeps at least the one it will lint next."""
        waiting = [w for w in self.live if w is not idle and len(w.parsed) >= 2]
        if not waiting:
            return None
        victim = max(waiting, key=lambda w: sum(len(self.tasks[i].source.text) for i in w.parsed))
        index = victim.parsed.pop()
        victim.parse_time.pop(index, None)
        return index

    def _retire(self, worker: _Worker, kill: bool) -> int:
        """Close a worker's pipes and reap it; its exit status (negative: the signal that ended it). The files it
        parsed ahead go back to the queue (a new worker parses them again)."""
        if kill:
            try:
                os.kill(worker.pid, signal.SIGKILL)
            except OSError:
                pass
        self.selector.unregister(worker.results_fd)
        for fd in (worker.tasks_fd, worker.results_fd):
            self.parent_fds.discard(fd)
            try:
                os.close(fd)
            except OSError:
                pass
        self.live.remove(worker)
        self.queue.extendleft(reversed(worker.parsed))
        worker.parsed = []
        try:
            _, status = os.waitpid(worker.pid, 0)
        except ChildProcessError:
            return 0
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def results(self) -> Iterator[tuple[_Task, FileReport | str, bool]]:
        remaining = len(self.tasks)
        try:
            self._start_graph()
            for _ in range(min(self.workers, remaining)):
                self._assign(self._spawn())
            while remaining:
                busy = [w for w in self.live if w.current is not None]
                now = time.monotonic()
                # past the limit in wall time but starved of CPU (an oversubscribed machine), a worker is looked
                # at again every half second
                wait = max(0.0, min(w.started + self.limit - now if now - w.started < self.limit else _STARVED_POLL
                                    for w in busy)) if busy else None
                for key, _ in self.selector.select(wait):
                    if isinstance(key.data, _GraphBuilder):
                        if key.data is self.graph and key.data.read():
                            self._graph_done()
                        continue
                    worker: _Worker = key.data
                    if worker not in self.live:
                        continue
                    try:
                        chunk = os.read(worker.results_fd, 1 << 20)
                    except OSError:
                        chunk = b""
                    if not chunk:  # the worker died
                        index = worker.current
                        status = self._retire(worker, kill=True)
                        if index is not None:
                            remaining -= 1
                            yield self.tasks[index], self._crashed(self.tasks[index], status), False
                        if self.queue:
                            self._assign(self._spawn())
                        continue
                    worker.buffer += chunk
                    while len(worker.buffer) >= _FRAME:
                        size = int.from_bytes(worker.buffer[:_FRAME], "big")
                        if len(worker.buffer) < _FRAME + size:
                            break
                        message = pickle.loads(worker.buffer[_FRAME:_FRAME + size])
                        del worker.buffer[:_FRAME + size]
                        if message[0] == "program":  # ("program", True/False): program-wide work, not the file's
                            self._program_work(worker, message[1])
                            continue
                        if message[0] == "parsed":  # ("parsed", index): parsed ahead, kept by the worker
                            index = message[1]
                            worker.parse_time[index] = time.monotonic() - worker.started
                            worker.parsed.append(index)
                            worker.current = None
                        else:
                            index, outcome, searched = message
                            remaining -= 1
                            yield self.tasks[index], outcome, searched
                        self._assign(worker)
                now = time.monotonic()
                for worker in [w for w in self.live if w.current is not None and self._over_limit(w, now)]:
                    index = worker.current
                    assert index is not None
                    self._retire(worker, kill=True)
                    remaining -= 1
                    yield self.tasks[index], _not_checked(
                        self.tasks[index], f"not checked: still running after {self.limit:g} s (gpulint's time "
                                           f"limit per file, GPULINT_FILE_TIMEOUT)"), False
                    if self.queue:
                        self._assign(self._spawn())
                if self.queue and not self.live:
                    self._assign(self._spawn())
        finally:
            if self.graph is not None:
                self.selector.unregister(self.graph.fd)
                self.parent_fds.discard(self.graph.fd)
                self.graph.stop()
                self.graph = None
            for worker in list(self.live):
                try:
                    os.close(worker.tasks_fd)  # EOF: an idle worker exits by itself
                    self.parent_fds.discard(worker.tasks_fd)
                except OSError:
                    pass
                worker.tasks_fd = -1
            for worker in list(self.live):
                self._retire(worker, kill=worker.current is not None)
            self.selector.close()

    def _program_work(self, worker: _Worker, started: bool) -> None:
        """The worker began or ended work done once per run for all files (a search of every text of the program):
        its file's clock stops meanwhile, in wall and CPU time."""
        now = time.monotonic()
        if started:
            worker.paused = (now, _cpu_seconds(worker.pid))
            return
        if worker.paused is None:
            return
        paused_at, cpu_at = worker.paused
        worker.paused = None
        worker.started += now - paused_at
        cpu = _cpu_seconds(worker.pid)
        if worker.cpu_started is not None and cpu is not None and cpu_at is not None:
            worker.cpu_started += cpu - cpu_at

    def _over_limit(self, worker: _Worker, now: float) -> bool:
        """Has the worker spent the time limit on its file? Wall time, unless the machine starved it: a worker that
        got less than half the limit in CPU time gets up to `_STARVED_GRACE` times the limit in wall time (a
        healthy file on an oversubscribed machine is not a file that takes too long)."""
        if worker.paused is not None:  # program-wide work: bounded by the program's size, given a wider limit
            return now - worker.paused[0] >= self.limit * _STARVED_GRACE
        wall = now - worker.started
        if wall < self.limit:
            return False
        if wall >= self.limit * _STARVED_GRACE or worker.cpu_started is None:
            return True
        cpu = _cpu_seconds(worker.pid)
        return cpu is None or cpu - worker.cpu_started >= self.limit / 2

    def _crashed(self, task: _Task, status: int) -> FileReport:
        """A worker died on this file. If CPython rejects the file too, it is reported as a syntax error."""
        from gpulint.engine import python_syntax_error, syntax_error_diagnostic

        rejected = python_syntax_error(task.source.text, task.shown)
        if rejected is not None:
            report = FileReport(task.shown, [syntax_error_diagnostic(task.shown, rejected)], original=task.source.text,
                                cacheable=False)
            return report
        how = f"signal {signal.Signals(-status).name}" if status < 0 and -status in signal.valid_signals() \
            else f"exit status {status}"
        return _not_checked(task, f"gpulint's parser crashed on this file ({how}); not checked. The other files "
                                  f"were checked")


def _run_file(shown: str, source: SourceFile, rules: Sequence[type[Rule]], program: ProgramFacts, fix: bool,
              min_safety: Safety, rule_options: dict[str, dict[str, Any]] | None,
              can_fix: Callable[[Diagnostic], bool], module: Any = None) -> FileReport:
    """Lint or fix one file; never writes (the caller writes, in the main process)."""
    from gpulint.engine import lint_text
    from gpulint.fixer import fix_text

    if not fix:
        result = lint_text(source.text, shown, rules, program=program, rule_options=rule_options, module=module)
        return FileReport(shown, result.diagnostics, original=source.text)
    outcome = fix_text(source.text, shown, rules, min_safety=min_safety, program=program,
                       rule_options=rule_options, can_fix=can_fix)
    report = FileReport(shown, outcome.remaining, outcome, source.text, error=outcome.error)
    if not outcome.converged:
        report.error = "fixes did not converge after the maximum number of passes; last result kept"
    return report


def _write(report: FileReport, source: SourceFile) -> None:
    outcome = report.fix
    if outcome is None or not outcome.changed or outcome.text == source.text:
        return
    try:
        write_source_atomically(source, outcome.text)
        report.written = True
    except SourceError as error:
        report.error = str(error)


def write_fixed(result: RunResult) -> RunResult:
    """Write the fixes of a run made with write=False. A file whose text changed since that run is left alone."""
    for report in result.files:
        if report.fix is None or not report.fix.changed or report.original is None:
            continue
        try:
            source = read_source(Path(report.path))
        except SourceError as error:
            report.error = str(error)
            continue
        if source.text != report.original:
            report.error = "file changed on disk while gpulint was fixing it; left untouched"
            continue
        _write(report, source)
    return result
