import ast
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePosixPath
from typing import Iterator

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import CUDA_TEXT_PATTERN, dotted_name, walk
from gpulint.network_size import network_size
from gpulint.pins import torch_pinned_below
from gpulint.rule import is_test_path

# ---------------------------------------------------------------------------------------------
# Program-level helpers shared by the 02x precision rules (GPU020/021/023/024/025 import them).
#
# The program is what the command line names: `ctx.program.sources` holds the text of every file of the
# run. Within it, a file's *related* files are: what it imports (transitively), the files that import it,
# what the entry scripts importing it import, and the library (non-entry) files of its own folder and
# below (a module may be imported in a way the resolver misses, so its settings count). Entry scripts that
# share no import with the file, and files of other folders, are separate programs (a folder of independent
# example scripts). `reach(path)` is narrower: the file plus what it imports, transitively.

_MAIN_GUARD_TEXT = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.M)
# CUDA or possibly-CUDA evidence (`torch.accelerator` is CUDA on NVIDIA hosts)
_CUDA_TEXT = re.compile(CUDA_TEXT_PATTERN + r"""|f["']cuda|\.to\(\s*0\s*\)|"""
                        r"""torch\.accelerator\.(is_available|current_accelerator)\(""")


@dataclass(frozen=True)
class _Use:
    line: int
    what: str
    gated: bool  # under a version/feature gate (`if hasattr(...)`, `try:`), so maybe not executed


@dataclass(frozen=True)
class _Facts:
    """What one file's text says, from a cheap `ast` parse (cached by text)."""

    imports: tuple[tuple[int, str, tuple[str, ...]], ...] = ()  # (level, module, imported names)
    is_entry: bool = False  # `if __name__ == "__main__":` or a top-level training loop
    tf32_legacy: tuple[_Use, ...] = ()
    tf32_new: tuple[_Use, ...] = ()


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


_GATE_TEST = re.compile(r"hasattr|getattr|version|fp32_precision|allow_tf32|float32_matmul|TORCH_", re.I)
_NEW_TAIL = re.compile(r"(^|\.)(backends|matmul|cudnn|conv|rnn)\.fp32_precision$")
_LEGACY_ATTR = re.compile(r"(^|\.)(matmul|cudnn)\.allow_tf32$")
_LEGACY_CALL = re.compile(r"(^|\.)(set|get)_float32_matmul_precision$")


class _FactVisitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.gate = 0
        self.legacy: list[_Use] = []
        self.new: list[_Use] = []
        self.imports: list[tuple[int, str, tuple[str, ...]]] = []

    def _gated(self, node: ast.AST, gated: bool) -> None:
        self.gate += gated
        self.generic_visit(node)
        self.gate -= gated

    def visit_If(self, node: ast.If) -> None:
        self._gated(node, bool(_GATE_TEST.search(ast.unparse(node.test))))

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._gated(node, bool(_GATE_TEST.search(ast.unparse(node.test))))

    def visit_Try(self, node: ast.Try) -> None:
        self._gated(node, True)

    visit_TryStar = visit_Try

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.append((0, alias.name, ()))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.imports.append((node.level, node.module or "", tuple(a.name for a in node.names)))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted(node)
        if _LEGACY_ATTR.search(dotted):
            self.legacy.append(_Use(node.lineno, dotted, self.gate > 0))
        elif _NEW_TAIL.search(dotted) and isinstance(node.ctx, ast.Store) and (
                "backends" in dotted or "matmul" in dotted or "cudnn" in dotted):
            self.new.append(_Use(node.lineno, dotted, self.gate > 0))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        dotted = _dotted(node.func)
        if _LEGACY_CALL.search(dotted):
            self.legacy.append(_Use(node.lineno, dotted.rsplit(".", 1)[-1] + "()", self.gate > 0))
        self.generic_visit(node)


def _is_main_test(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _top_level_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _has_step_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("backward", "step")
               for n in ast.walk(node))


@lru_cache(maxsize=4096)
def _facts(text: str) -> _Facts:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _Facts(is_entry=bool(_MAIN_GUARD_TEXT.search(text)))
    visitor = _FactVisitor()
    visitor.visit(tree)
    is_entry = any(isinstance(s, ast.If) and _is_main_test(s.test) for s in tree.body) or any(
        isinstance(n, (ast.For, ast.While)) and _has_step_call(n) for n in _top_level_nodes(tree))
    return _Facts(tuple(visitor.imports), is_entry, tuple(visitor.legacy), tuple(visitor.new))


_IMPORT_TEXT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)"
                          r"|import[ \t]+([^\n#;]+))", re.M)
_TOP_LOOP_TEXT = re.compile(r"^(for|while)\b", re.M)
_STEP_TEXT = re.compile(r"\.backward\(|\.step\(")
_TF32_TEXT = re.compile(r"allow_tf32|float32_matmul_precision|fp32_precision")


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
    is_entry = bool(_MAIN_GUARD_TEXT.search(text)) or bool(_TOP_LOOP_TEXT.search(text) and _STEP_TEXT.search(text))
    return _GraphFacts(tuple(imports), is_entry)


def _norm(path: str) -> str:
    return PurePosixPath(os.path.normpath(path.replace("\\", "/"))).as_posix()


class _ProgramIndex:
    """Import graph over the files of one run (first-party imports resolved to files of the run)."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources
        self.paths = list(sources)
        self.facts = {path: _graph_facts(text) for path, text in sources.items()}
        normal = {_norm(path): path for path in self.paths}
        by_module: dict[str, list[str]] = {}
        for path in self.paths:
            parts = PurePosixPath(_norm(path)).with_suffix("").parts
            parts = tuple(p for p in parts if p not in ("", "/", ".", ".."))
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            for start in range(len(parts)):
                by_module.setdefault(".".join(parts[start:]), []).append(path)
        self.edges: dict[str, set[str]] = {path: set() for path in self.paths}
        for path in self.paths:
            here = PurePosixPath(_norm(path)).parent.parts
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
                        targets.update(self._closest(by_module.get(name, []), here))
                targets.discard(path)
                self.edges[path] |= targets
        self._reach: dict[str, frozenset[str]] = {}
        self._components: dict[str, frozenset[str]] = {}
        self._related: dict[str, frozenset[str]] = {}

    @staticmethod
    def _closest(candidates: list[str], here: tuple[str, ...]) -> list[str]:
        """Of several files with the same module name, those nearest to the importing file."""
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

    def reach(self, path: str) -> frozenset[str]:
        if path not in self._reach:
            seen = {path}
            stack = [path]
            while stack:
                for target in self.edges.get(stack.pop(), ()):
                    if target not in seen:
                        seen.add(target)
                        stack.append(target)
            self._reach[path] = frozenset(seen)
        return self._reach[path]

    def component(self, path: str) -> frozenset[str]:
        if path not in self._components:
            undirected: dict[str, set[str]] = {p: set(t) for p, t in self.edges.items()}
            for source, targets in self.edges.items():
                for target in targets:
                    undirected[target].add(source)
            seen = {path}
            stack = [path]
            while stack:
                for target in undirected.get(stack.pop(), ()):
                    if target not in seen:
                        seen.add(target)
                        stack.append(target)
            self._components[path] = frozenset(seen)
        return self._components[path]

    def importers(self, path: str) -> frozenset[str]:
        """Files that import `path`, transitively."""
        return frozenset(p for p in self.paths if p != path and path in self.reach(p))

    def related(self, path: str) -> frozenset[str]:
        """The files of the program `path` belongs to: what it imports, what imports it, what the entry
        scripts that import it import, and the library (non-entry) files of its own folder and below."""
        if path not in self._related:
            found = set(self.reach(path)) | self.importers(path)
            for entry in self.entries_reaching(path):
                found |= self.reach(entry)
            folder = PurePosixPath(_norm(path)).parent.as_posix()
            prefix = "" if folder in (".", "") else folder + "/"
            found |= {p for p in self.paths if not self.facts[p].is_entry and _norm(p).startswith(prefix)}
            self._related[path] = frozenset(found)
        return self._related[path]

    def entries_reaching(self, path: str) -> list[str]:
        return [p for p in self.paths if self.facts[p].is_entry and path in self.reach(p)]


def _program_index(ctx) -> _ProgramIndex:
    """The import graph of the run, built once per program (cached on the ProgramFacts object)."""
    program = ctx.program
    program.searched = True  # the result depends on other files: the results cache keys it by the program
    index = getattr(program, "_gpulint_precision_index", None)
    if index is None or index.sources is not program.sources or ctx.path not in index.facts:
        sources = program.sources if ctx.path in program.sources else {**program.sources, ctx.path: current_text(ctx)}
        index = _ProgramIndex(sources)
        setattr(program, "_gpulint_precision_index", index)
    return index


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


def tf32_facts(path: str, text: str) -> _Facts:
    """TF32 API uses of one file (parsed only when its text names a TF32 API)."""
    return _facts(text) if _TF32_TEXT.search(text) else _Facts()


def related_texts(ctx) -> dict[str, str]:
    """path -> text of the files that belong to the same program as the current file (itself included)."""
    index = _program_index(ctx)
    texts = {path: index.sources[path] for path in index.related(ctx.path)}
    texts[ctx.path] = current_text(ctx)
    return texts


def reach_texts(ctx) -> dict[str, str]:
    """path -> text of the current file and the first-party modules it imports (transitively)."""
    index = _program_index(ctx)
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


def training_entry_anchor(ctx, *, any_main_guard: bool = False) -> cst.CSTNode | None:
    """Where a program-level finding is reported: the `if __name__ == "__main__":` statement of a file that
    has a training loop (hot region of kind step-loop/step-function); in a script without a guard, its
    first top-level training loop, or the first top-level statement that calls a function of the file
    containing one (`for epoch in ...: train()`). None when the current file is not a training entry."""
    analysis = ctx.analysis
    steps = (HotKind.STEP_LOOP, HotKind.STEP_FUNCTION)
    trains = any(kind in steps for kind in analysis.hot.values())
    if analysis.main_guard is not None and (trains or any_main_guard):
        return analysis.main_guard
    if not trains:
        return None
    training_functions = {name for name, defs in analysis.functions.items()
                          if any(analysis.hot.get(id(n)) in steps for fn in defs for n in walk(fn, into_functions=False)
                                 if n is fn or isinstance(n, (cst.For, cst.While)))}
    for statement in ctx.module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        for node in walk(statement):
            if isinstance(node, (cst.For, cst.While)) and analysis.hot.get(id(node)) is HotKind.STEP_LOOP:
                return node
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) \
                    and node.func.value in training_functions:
                return statement
    return None


def location(ctx, path: str, line: int) -> str:
    return f"line {line}" if path == ctx.path else f"{path}:{line}"


# Text markers (comments included: a mention only ever makes the rules more careful).
LOW_PRECISION = re.compile(
    r"autocast|\.half\(|\btorch\.half\b|float16|bfloat16|\bbf16\b|\bfp16\b|mixed_precision|GradScaler|"
    r"\bapex\b|deepspeed|\baccelerate\b|\bprecision\s*=|set_default_dtype|\bamp\b|_amp\b|\bamp_|\.to\(\s*dtype\s*=")
FP64 = re.compile(r"float64|\.double\(|torch\.double\b|complex128|set_default_dtype")
TF32_MATMUL_SET = re.compile(
    r"float32_matmul_precision|\bmatmul\.allow_tf32|\bmatmul\.fp32_precision|\bbackends\.fp32_precision|"
    r"\btf32\s*=|['\"]--?tf32")
_NEW_API_TEXT = re.compile(r"\bfp32_precision\b")
_LEGACY_API_TEXT = re.compile(r"\ballow_tf32\b|float32_matmul_precision")


class Tf32NotEnabled(Rule):
    """
    ## What it does
    Finds CUDA training programs that train in plain fp32 (no autocast, no `.half()`/`.bfloat16()` model)
    and never enable TF32 for float32 matrix multiplications.

    The check is program-level. The program is every file named on the command line
    (`gpulint check train.py model.py` or a folder): a TF32 setting or an autocast counts when it is in the
    entry script, in a file it imports or that imports it (transitively, first-party imports resolved to
    files of the run), or in a library (non-entry) module of the entry's folder or below. An unrelated
    entry script (its own `if __name__ == "__main__":` or top-level loop, sharing no import) is a separate
    program, so a folder of independent examples is checked script by script. The finding is reported once, on the entry point: the `if __name__ == "__main__":` statement
    of a file that contains a training loop (a loop or step function that calls `.backward()` /
    `optimizer.step()`), or the first top-level training loop of a script without a guard. Library
    modules, test files and fp64/scientific programs are never reported.

    ## Why is this slow
    By default PyTorch computes fp32 matmuls in full IEEE fp32, which uses a small fraction of an Ampere+
    GPU's tensor-core throughput. TF32 keeps fp32 storage and range and rounds the inputs of the matmul to a
    10-bit mantissa. Measured on an H100: an 8192^2 matmul runs 7.9x faster (2.3x at 1024^2), a 6-layer
    d1024 transformer training step 2.61x faster; a small RL MLP does not gain (0.99x). The relative error
    of a matmul grows from about 2e-5 to 2e-3. Convolutions already use TF32 by default.

    ## Example
    ```python
    import torch

    def main():
        model = Net().cuda()
        for x, y in loader:
            loss = F.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            optimizer.step()

    if __name__ == "__main__":
        main()
    ```

    ## Use instead
    ```python
    import torch
    torch.set_float32_matmul_precision("high")
    ```
    If the program already uses the new `fp32_precision` API, gpulint inserts
    `torch.backends.cuda.matmul.fp32_precision = "tf32"` instead, so that the two API families are never
    mixed (GPU021).

    ## Fix safety
    Unsafe: it changes the numerics of every fp32 matmul of the program (relative error about 1e-3). The
    statement is inserted after the last top-level import of the entry script, which must import `torch`
    at top level; when other files of the program import the entry script, it goes at the top of the
    `if __name__ == "__main__":` block instead, so that importing the script does not change a global
    setting. If the program already mixes both TF32 API families, no fix is offered.
    """

    code = "GPU020"
    name = "tf32-not-enabled"
    message = "CUDA fp32 training without TF32: fp32 matmuls do not use tensor cores"
    fix_title = 'Insert `torch.set_float32_matmul_precision("high")` after the imports'
    severity = Severity.INFO
    safety = Safety.UNSAFE
    priority = "P1"
    triggers = ("backward", ".step(")
    examples = [
        Valid(
            """
            import torch
            torch.backends.cuda.matmul.allow_tf32 = True

            def main():
                model = Net().cuda()
                for x, y in loader:
                    model(x).sum().backward()
                    optimizer.step()

            if __name__ == "__main__":
                main()
            """
        ),
        Valid(  # every layer is small (a GRU of width 20): launch-bound, TF32 changes nothing measurable
            """
            import torch
            from torch import nn
            model = nn.Sequential(nn.GRU(28, 20, 4), nn.Linear(20, 10)).cuda()
            for x, y in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # a network of convolutions only: cuDNN already runs them in TF32
            """
            import torch
            from torch import nn
            model = nn.Sequential(nn.Conv2d(3, 512, 3), nn.ReLU(), nn.Conv2d(512, 512, 3)).cuda()
            for x, y in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # mixed precision already in effect
            """
            import torch

            def main():
                model = Net().cuda()
                for x, y in loader:
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        loss = model(x).sum()
                    loss.backward()
                    optimizer.step()

            if __name__ == "__main__":
                main()
            """
        ),
        Valid(  # a library module: no entry point
            """
            import torch

            def train(model, loader, optimizer):
                for x, y in loader:
                    model(x.cuda()).sum().backward()
                    optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F


            def main():
                device = torch.device("cuda")
                model = Net().to(device)
                for x, y in loader:
                    loss = F.cross_entropy(model(x.to(device)), y.to(device))
                    loss.backward()
                    optimizer.step()


            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import torch
            import torch.nn.functional as F
            torch.set_float32_matmul_precision("high")


            def main():
                device = torch.device("cuda")
                model = Net().to(device)
                for x, y in loader:
                    loss = F.cross_entropy(model(x.to(device)), y.to(device))
                    loss.backward()
                    optimizer.step()


            if __name__ == "__main__":
                main()
            """,
        ),
        Invalid(  # the program already uses the new API (for cuDNN): the fix stays in that family
            """
            import torch as t
            t.backends.cudnn.conv.fp32_precision = "tf32"
            model = Net().cuda()
            for x, y in loader:
                model(x).sum().backward()
                opt.step()
            """,
            fixed="""
            import torch as t
            t.backends.cuda.matmul.fp32_precision = "tf32"
            t.backends.cudnn.conv.fp32_precision = "tf32"
            model = Net().cuda()
            for x, y in loader:
                model(x).sum().backward()
                opt.step()
            """,
        ),
    ]
    # Catalog check "flag read-back": the rewritten snippet asserts that the matmul TF32 flag is on (it restores
    # the global setting afterwards); TF32 has no effect on CPU, so EQ only bounds the GPU rounding; PERF on GPU.
    micro_check = MicroCheck(
        kinds=("EQ", "PERF"),
        setup="a = torch.randn(256, 256)\nb = torch.randn(256, 256)",
        before="y = a @ b",
        after=('previous = torch.get_float32_matmul_precision()\n'
               'torch.set_float32_matmul_precision("high")\n'
               'try:\n'
               '    assert torch.get_float32_matmul_precision() == "high"\n'
               '    assert torch.backends.cuda.matmul.allow_tf32\n'
               '    y = a @ b\n'
               'finally:\n'
               '    torch.set_float32_matmul_precision(previous)'),
        compare=("y",),
        options={"rtol": 1e-2, "atol": 0.5, "perf_setup": "a = torch.randn(4096, 4096)\nb = torch.randn(4096, 4096)"},
    )

    def finish(self) -> None:
        ctx = self.ctx
        anchor = training_entry_anchor(ctx)
        if anchor is None or is_test_path(ctx.path) or torch_pinned_below(ctx.path, (1, 12)):
            return  # `set_float32_matmul_precision` arrived in torch 1.12
        texts = related_texts(ctx)
        joined = list(texts.values())
        if not (ctx.analysis.cuda_evidence or ctx.analysis.maybe_cuda_evidence
                or any(_CUDA_TEXT.search(text) for text in joined)):
            return
        for pattern in (TF32_MATMUL_SET, LOW_PRECISION, FP64):
            if any(pattern.search(text) for text in joined):
                return
        if network_size(texts, matmul_only=True) == "small":
            return  # every GEMM is small (and RNNs/convs already use TF32 through cuDNN): nothing to gain
        if _sets_tf32(ctx.module):
            return  # set since the run read the file (an earlier fix pass)
        uses_new = any(_NEW_API_TEXT.search(text) for text in joined)
        uses_legacy = any(_LEGACY_API_TEXT.search(text) for text in joined)
        edit = None if uses_new and uses_legacy else self._insertion(anchor, new_api=uses_new)
        if edit is None:
            self.report(anchor)
        else:
            self.report(anchor, replacements=[edit])

    def _insertion(self, anchor: cst.CSTNode, *, new_api: bool) -> tuple[cst.CSTNode, str] | None:
        """Replace the newline of the last top-level import before `anchor` with newline + statement."""
        analysis = self.ctx.analysis
        order = analysis.order.get(id(anchor), 1 << 30)
        imports = [n for n in analysis.import_nodes if analysis.order.get(id(n), 0) < order
                   and isinstance(n, cst.SimpleStatementLine)]
        torch_name = _top_level_torch_name(imports)
        if not imports or torch_name is None:
            return None
        if new_api:
            statement = f'{torch_name}.backends.cuda.matmul.fp32_precision = "tf32"'
        else:
            statement = f'{torch_name}.set_float32_matmul_precision("high")'
        guard = self.ctx.analysis.main_guard
        if anchor is guard and isinstance(guard.body, cst.IndentedBlock) and _program_index(self.ctx).importers(
                self.ctx.path):
            # other files of the program import this script: keep the global setting out of their import
            indent = guard.body.indent if guard.body.indent is not None else self.ctx.module.default_indent
            return guard.body.header.newline, "\n" + indent + statement + "\n"
        newline = imports[-1].trailing_whitespace.newline
        return newline, "\n" + statement + "\n"


def _sets_tf32(module: cst.Module) -> bool:
    for node in walk(module, into_functions=True):
        if isinstance(node, cst.Call) and (dotted_name(node.func) or "").endswith("set_float32_matmul_precision"):
            return True
        if isinstance(node, cst.AssignTarget) and (dotted_name(node.target) or "").endswith(
                ("matmul.fp32_precision", "backends.fp32_precision", "matmul.allow_tf32")):
            return True
    return False


def _top_level_torch_name(import_lines: list[cst.SimpleStatementLine]) -> str | None:
    """The name under which a top-level `import torch` / `import torch as t` / `import torch.x` binds torch."""
    for line in import_lines:
        for small in line.body:
            if not isinstance(small, cst.Import):
                continue
            for alias in small.names:
                name = dotted_name(alias.name) or ""
                if alias.asname is not None:
                    if name == "torch" and isinstance(alias.asname.name, cst.Name):
                        return alias.asname.name.value
                elif name == "torch" or name.startswith("torch."):
                    return "torch"
    return None
