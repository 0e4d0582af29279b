"""The program a file belongs to, read from the text of the files of one run (no parse).

The run is what the command line names: `ProgramFacts.sources` holds the text of every file. Within it, a file's
*related* files are: what it imports (transitively), the files that import it, what the entry scripts importing
it import, and the library (non-entry) files of its own folder and below (a module may be imported in a way the
resolver misses, so its settings count). Entry scripts that share no import with the file, and files of other
folders, are separate programs (a folder of independent example scripts). `reach(path)` is narrower: the file
plus what it imports, transitively.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Iterable

from gpulint.textscan import quick

MAIN_GUARD_TEXT = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.M)

_IMPORT_TEXT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)"
                          r"|import[ \t]+([^\n#;]+))", re.M)
_TOP_LOOP_TEXT = re.compile(r"^(for|while)\b", re.M)
_STEP_TEXT = re.compile(r"\.backward\(|\.step\(")


@dataclass(frozen=True)
class _GraphFacts:
    imports: tuple[tuple[int, str, tuple[str, ...]], ...]
    is_entry: bool


@lru_cache(maxsize=8192)
def _graph_facts(text: str) -> _GraphFacts:
    """Imports and entry-ness of a file from its text alone (cheap: no parse; used for every file of a run)."""
    imports = []
    for match in _IMPORT_TEXT.finditer(text):
        dots, module, names, plain = match.groups()
        if plain is not None:
            for part in plain.split(","):
                name = part.strip().split(" as ")[0].strip()
                if re.fullmatch(r"[\w.]+", name):
                    imports.append((0, name, ()))
        else:
            listed = tuple(n.strip().split(" as ")[0].strip() for n in names.strip("()").replace("\\", "").split(","))
            imports.append((len(dots), module, tuple(n for n in listed if re.fullmatch(r"\w+", n))))
    is_entry = bool(MAIN_GUARD_TEXT.search(text)) or bool(_TOP_LOOP_TEXT.search(text) and _STEP_TEXT.search(text))
    return _GraphFacts(tuple(imports), is_entry)


def _norm(path: str) -> str:
    return PurePosixPath(os.path.normpath(path.replace("\\", "/"))).as_posix()


class ProgramIndex:
    """Import graph over the files of one run (first-party imports resolved to files of the run)."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources
        self.paths = list(sources)
        self.facts = {path: _graph_facts(text) for path, text in sources.items()}
        self.normal_of = {path: _norm(path) for path in self.paths}
        normal = {self.normal_of[path]: path for path in self.paths}
        by_module: dict[str, list[str]] = {}
        for path in self.paths:
            parts = PurePosixPath(self.normal_of[path]).with_suffix("").parts
            parts = tuple(p for p in parts if p not in ("", "/", ".", ".."))
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            for start in range(len(parts)):
                by_module.setdefault(".".join(parts[start:]), []).append(path)
        self.edges: dict[str, set[str]] = {path: set() for path in self.paths}
        for path in self.paths:
            here = PurePosixPath(self.normal_of[path]).parent.parts
            for level, module, names in self.facts[path].imports:
                targets: set[str] = set()
                if level:
                    base = here[:len(here) - (level - 1)] if level > 1 else here
                    stem = list(base) + (module.split(".") if module else [])
                    for extra in ([[]] + [[name] for name in names]):
                        joined = "/".join(stem + extra)
                        for candidate in (joined + ".py", joined + "/__init__.py"):
                            if candidate in normal:
                                targets.add(normal[candidate])
                else:
                    dotted = [module] + [f"{module}.{name}" for name in names]
                    pieces = module.split(".")
                    dotted += [".".join(pieces[:i]) for i in range(1, len(pieces))]
                    for name in dotted:
                        targets.update(self._closest(by_module.get(name, []), here, name))
                targets.discard(path)
                self.edges[path] |= targets
        self._reach: dict[str, frozenset[str]] = {}
        self._definitions: dict[str, dict[str, list[str]]] = {}
        self._related: dict[str, frozenset[str]] = {}
        self.cuda_related: dict[str, bool] = {}  # path -> a related file names CUDA (RuleContext.targets_cuda)
        self.hogwild: dict[str, bool] = {}  # path -> its program trains shared-memory CPU workers (hogwild_program)

    @staticmethod
    def _closest(candidates: list[str], here: tuple[str, ...], module: str) -> list[str]:
        """Of several files with the same module name, those nearest to the importing file, among those Python
        could import from there: the module's root folder (the file's folder less the package folders of the
        dotted name) is the importer's folder or one above it (the script's folder or the working directory on
        the path), not a sibling project's (`from train import train` in one example folder is not another
        example's `train.py`)."""
        if len(candidates) <= 1:
            return candidates

        def root(path: str) -> tuple[str, ...]:
            parts = PurePosixPath(_norm(path)).parts
            depth = module.count(".") + (2 if parts[-1] == "__init__.py" else 1)
            return parts[:-depth]

        candidates = [c for c in candidates if here[:len(root(c))] == root(c)]
        if len(candidates) <= 1:
            return candidates

        def shared(path: str) -> int:
            parts = PurePosixPath(_norm(path)).parent.parts
            count = 0
            for a, b in zip(parts, here):
                if a != b:
                    break
                count += 1
            return count

        best = max(shared(c) for c in candidates)
        return [c for c in candidates if shared(c) == best]

    def definitions(self, keyword: str) -> dict[str, list[str]]:
        """name -> the files (sorted) that define it at the start of a line with `keyword` (`class`, `def`):
        every text is scanned once per run, not once per name asked."""
        found = self._definitions.get(keyword)
        if found is None:
            found = self._definitions[keyword] = {}
            pattern = re.compile(rf"^{keyword}\s+(\w+)", re.M)
            for path in sorted(self.paths):
                for name in dict.fromkeys(pattern.findall(self.sources[path])):
                    found.setdefault(name, []).append(path)
        return found

    def reach(self, path: str) -> frozenset[str]:
        if path not in self._reach:
            self._reach[path] = _reachable(self.edges, path)
        return self._reach[path]

    def importers(self, path: str) -> frozenset[str]:
        """Files that import `path`, transitively."""
        return frozenset(p for p in self.paths if p != path and path in self.reach(p))

    def linked(self, path: str) -> frozenset[str]:
        """`related` without the neighbouring library files: what `path` imports, what imports it and what the
        entry scripts that import it import -- the code a run of this file's program certainly loads."""
        found = set(self.reach(path)) | self.importers(path)
        for entry in self.entries_reaching(path):
            found |= self.reach(entry)
        return frozenset(found)

    def related(self, path: str) -> frozenset[str]:
        """The files of the program `path` belongs to: what it imports, what imports it, what the entry
        scripts that import it import, and the library (non-entry) files of its own folder and below."""
        if path not in self._related:
            found = set(self.linked(path))
            folder = PurePosixPath(_norm(path)).parent.as_posix()
            prefix = "" if folder in (".", "") else folder + "/"
            found |= {p for p in self.paths if not self.facts[p].is_entry and self.normal_of[p].startswith(prefix)}
            self._related[path] = frozenset(found)
        return self._related[path]

    def entries_reaching(self, path: str) -> list[str]:
        return [p for p in self.paths if self.facts[p].is_entry and path in self.reach(p)]


def _reachable(edges: dict[str, set[str]], start: str) -> frozenset[str]:
    """`start` and every node reachable from it along `edges`."""
    seen = {start}
    stack = [start]
    while stack:
        for target in edges.get(stack.pop(), ()):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return frozenset(seen)


def program_index(ctx) -> ProgramIndex:
    """The import graph of the run, built once per program (cached on the ProgramFacts object)."""
    program = ctx.program
    program.searched = True  # the result depends on other files: the results cache keys it by the program
    index = getattr(program, "_gpulint_precision_index", None)
    if index is None or index.sources is not program.sources or ctx.path not in index.facts:
        sources = program.sources if ctx.path in program.sources else {**program.sources, ctx.path: current_text(ctx)}
        index = ProgramIndex(sources)
        setattr(program, "_gpulint_precision_index", index)
    return index


def defining_files(ctx, keyword: str, name: str) -> list[str]:
    """The files of the current file's reach (itself included) that define `name` at the start of a line with
    `keyword` (`class` or `def`)."""
    index = program_index(ctx)
    reach = index.reach(ctx.path)
    return [path for path in index.definitions(keyword).get(name, ()) if path in reach]


def function_calls(ctx, name: str) -> frozenset[str] | None:
    """The names called (last part: `seed` for `np.random.seed(...)`) by the top-level function `name` of the
    current file or, failing that, of the one file it imports that defines it; None when it is not found."""
    files = defining_files(ctx, "def", name)
    here = [path for path in files if path == ctx.path]
    files = here or files
    if len(files) != 1:
        return None
    from gpulint.semantic.pyast import top_level_calls

    return top_level_calls(program_index(ctx).sources[files[0]]).get(name)


def current_text(ctx) -> str:
    """The text of the file being linted, as the run read it. During fix passes the file may have changed
    since; rules that fix make their own idempotency checks on the syntax tree. (Regenerating the text from
    the tree costs a full code generation per file, so it is only done for a file the run did not read.)"""
    text = ctx.program.sources.get(ctx.path)
    if text is not None:
        return text
    cached = getattr(ctx, "_gpulint_current_text", None)
    if cached is None or cached[0] is not ctx.module:
        cached = (ctx.module, ctx.module.code)
        setattr(ctx, "_gpulint_current_text", cached)
    return cached[1]


@lru_cache(maxsize=1 << 16)
def mentions(pattern: re.Pattern[str], text: str) -> bool:
    """Does `pattern` occur in `text`? Remembered per process: program-level checks ask it of every related file
    for every file of the program (a folder of N library files would otherwise cost N^2 scans)."""
    return quick(pattern).search(text) is not None


def related_texts(ctx) -> dict[str, str]:
    """path -> text of the files that belong to the same program as the current file (itself included)."""
    index = program_index(ctx)
    texts = {path: index.sources[path] for path in index.related(ctx.path)}
    texts[ctx.path] = current_text(ctx)
    return texts


_CLASS_TEXT = re.compile(r"^\s*class\s+(\w+)\s*\(([^)]*)\)", re.M)


def subclasses_in_text(texts: Iterable[str], roots: set[str]) -> set[str]:
    """Classes of the program derived, directly or through each other, from a class named in `roots` (by the last
    dotted part of a base: `class Net(nn.Module)`, `class BalancedDataParallel(DataParallel)`), read from the text."""
    classes: dict[str, str] = {name: bases for text in texts for name, bases in _CLASS_TEXT.findall(text)}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, bases in classes.items():
            if name not in found and any(part.strip().rsplit(".", 1)[-1] in roots | found
                                         for part in bases.split(",")):
                found.add(name)
                changed = True
    return found


# Something placed on a device, or handed to a framework that places it: a program that does none of this trains on
# the CPU whatever it says of CUDA (a self-test seeding `torch.cuda.manual_seed(0)` when CUDA is available)
PLACEMENT_TEXT = re.compile(r"\.cuda\(|\.to\(|\bdevice\s*=|set_default_(device|tensor_type)|cuda\.\w*Tensor\b|"
                            r"DataParallel|\b(gpus|accelerator|devices)\s*=|\.prepare\(")


def _self_test_texts(ctx, in_main_guard: bool) -> dict[str, str] | None:
    """The `__main__` block of a module other files import runs as a script of its own (a self-test or demo): the
    file and what it imports. None elsewhere."""
    if in_main_guard and program_index(ctx).importers(ctx.path):
        return reach_texts(ctx)
    return None


def in_cpu_self_test(ctx) -> bool:
    """At the current node: inside the `__main__` block of a module other files import, whose own run (the file and
    what it imports) places nothing on a device -- a CPU self-test beside code that runs on the GPU when imported."""
    guard = ctx.analysis.main_guard
    texts = _self_test_texts(ctx, guard is not None and any(node is guard for node in ctx.ancestors))
    return texts is not None and not any(mentions(PLACEMENT_TEXT, text) for text in texts.values())


def site_program_texts(ctx, in_main_guard: bool) -> dict[str, str]:
    """The files of the program that runs code of the current file: `related_texts`, or for the `__main__` block of a
    module other files import, the file and what it imports."""
    texts = _self_test_texts(ctx, in_main_guard)
    return related_texts(ctx) if texts is None else texts


def linked_texts(ctx) -> dict[str, str]:
    """path -> text of the files a run of the current file's program certainly loads (`ProgramIndex.linked`)."""
    index = program_index(ctx)
    texts = {path: index.sources[path] for path in index.linked(ctx.path)}
    texts[ctx.path] = current_text(ctx)
    return texts


def reach_texts(ctx) -> dict[str, str]:
    """path -> text of the current file and the first-party modules it imports (transitively)."""
    index = program_index(ctx)
    texts = {path: index.sources[path] for path in index.reach(ctx.path)}
    texts[ctx.path] = current_text(ctx)
    return texts


def search_texts(texts: dict[str, str], pattern: re.Pattern[str]) -> list[tuple[str, int]]:
    """(path, line) of every match of `pattern` in `texts`."""
    found = []
    for path, text in texts.items():
        for match in pattern.finditer(text):
            found.append((path, text.count("\n", 0, match.start()) + 1))
    return found


def related_targets_cuda(ctx) -> bool:
    """Does a file of the current file's program (itself excluded) name CUDA? Remembered per file for the run."""
    from gpulint.analysis import PROGRAM_CUDA_TEXT  # here: the command line reads imports without libcst

    index = program_index(ctx)
    cached = index.cuda_related.get(ctx.path)
    if cached is None:
        cached = index.cuda_related[ctx.path] = any(
            quick(PROGRAM_CUDA_TEXT).search(index.sources[path]) for path in index.related(ctx.path) if path != ctx.path)
    return cached


_SHARES_MEMORY = re.compile(r"\.share_memory\(\)")
_PROCESS = re.compile(r"\bProcess\b")  # a worker process: `class Worker(mp.Process)`, `mp.Process(target=...)`
# a network moved to a GPU: `.cuda(`, a module moving itself (`self.to(...)`), or `.to(` on a name that says it is
# a network or on what is assigned to one (`learner_model = Net(shape).to(device=flags.device)`)
_NETWORK_TO_GPU = re.compile(r"\.cuda\(|\bself\.to\(|\b\w*(model|net|network|policy|actor|critic|agent)\w*"
                             r"(\.to\(|\s*=(?!=)\s*[\w.]+\((?:[^()]|\([^()]*\))*\)\s*\.to\()", re.I)


def hogwild_program(ctx) -> bool:
    """Is the current file part of a Hogwild trainer: it, or a file importing it, shares a network's memory
    (`.share_memory()`); it names worker processes (or, when it shares the memory itself, a file it imports does);
    and no file among them and what they import moves a network to a GPU? Remembered per file for the run."""
    index = program_index(ctx)
    cached = index.hogwild.get(ctx.path)
    if cached is None:
        text = current_text(ctx)
        sharing = [path for path in {ctx.path} | index.importers(ctx.path)
                   if mentions(_SHARES_MEMORY, text if path == ctx.path else index.sources[path])]
        imported = {p for path in sharing for p in index.reach(path)} | index.reach(ctx.path)
        processes = mentions(_PROCESS, text) or ctx.path in sharing and any(
            mentions(_PROCESS, index.sources[path]) for path in index.reach(ctx.path) if path != ctx.path)
        cached = index.hogwild[ctx.path] = bool(sharing) and processes and not any(
            mentions(_NETWORK_TO_GPU, text if path == ctx.path else index.sources[path])
            for path in imported | {ctx.path})
    return cached


def imported_files(path: Path, text: str, root: Path, *, resolved: bool = False) -> list[Path]:
    """First-party modules `path` imports that exist on disk: `import a.b` / `from a.b import c` resolved from
    the file's folder and each folder above it up to `root`, relative imports from its package. `resolved`:
    `path` is resolved already."""
    here = (path if resolved else path.resolve()).parent
    bases = tuple([here, *[p for p in here.parents if p == root or root in p.parents]])
    found: list[Path] = []
    for level, module, names in _graph_facts(text).imports:
        found.extend(_resolve_import(here, bases, level, module, names))
    return found


@lru_cache(maxsize=16384)
def _resolve_import(here: Path, bases: tuple[Path, ...], level: int, module: str, names: tuple[str, ...]
                    ) -> tuple[Path, ...]:
    """The files one import statement names (the files of a folder import the same modules: asked once)."""
    parts = [p for p in module.split(".") if p]
    if level:
        package = here
        for _ in range(level - 1):
            package = package.parent
        starts: tuple[Path, ...] = (package,)
    else:
        starts = bases
    for start in starts:
        stem = start.joinpath(*parts)
        candidates = [stem.with_suffix(".py"), stem / "__init__.py"] if parts else []
        candidates += [stem / f"{name}.py" for name in names]
        hits = tuple(c for c in candidates if c.is_file())
        if hits:
            return hits
    return ()
