"""The rule contract: one subclass of `Rule` per file in `rules/`, validated when it is defined."""

from __future__ import annotations

import posixpath
import re
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from gpulint.diagnostics import Safety, Severity

if TYPE_CHECKING:
    import libcst as cst

    from gpulint.analysis import Confidence, Device, Evidence, FileAnalysis, HotKind
    from gpulint.engine import ProgramFacts

# libcst and the shared analyses are imported where a rule's context uses them, not here: the command line reads
# the rules' metadata and resolves settings without them (a warm `check` imports neither).


class RuleDefinitionError(TypeError):
    """A rule file breaks the contract; raised when the class is defined (at import)."""


@dataclass(frozen=True)
class Valid:
    code: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", textwrap.dedent(self.code).lstrip("\n"))


@dataclass(frozen=True)
class Invalid:
    code: str
    fixed: str | None = None  # expected source after fixing (unsafe fixes included); None: no fix expected
    count: int | None = None  # exact number of findings, when it matters

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", textwrap.dedent(self.code).lstrip("\n"))
        if self.fixed is not None:
            object.__setattr__(self, "fixed", textwrap.dedent(self.fixed).lstrip("\n"))


@dataclass(frozen=True)
class MicroCheck:
    """Runtime check of a rewrite on real tensors (filled in by the verifier). `kinds` uses catalog §0.4 names."""

    kinds: tuple[str, ...] = ()
    setup: str = ""
    before: str = ""
    after: str = ""
    compare: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportRequest:
    """`import module` (or `import module as asname`) to be added once if the file lacks it."""

    module: str
    asname: str | None = None

    def statement(self) -> str:
        return f"import {self.module}" + (f" as {self.asname}" if self.asname else "")


@dataclass(frozen=True)
class DefinitionRequest:
    """A top-level definition a fix relies on (`code` defines `name`), added once, before the first statement
    that follows the file's imports. The rule asks only when the file does not define `name` yet."""

    name: str
    code: str

    def statement(self) -> str:
        return self.code + "\n\n\n"


@dataclass
class Report:
    """What a rule reports during traversal; the engine turns it into a Diagnostic with positions."""

    node: cst.CSTNode
    message: str
    severity: Severity
    safety: Safety | None  # None: no fix at this site
    replacements: tuple[tuple[cst.CSTNode, cst.CSTNode | str], ...]
    imports: tuple[ImportRequest | DefinitionRequest, ...]
    note: str | None


_DOC_HEADINGS = ("## What it does", "## Why is this slow", "## Example", "## Use instead", "## Fix safety")
_CODE = re.compile(r"^GPU\d{3}$")
_TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_test\.py$|(^|/)(conftest|tests)\.py$")
_TEST_FUNCTION = re.compile(r"^_?test_|^test$")
_TEST_FRAMEWORKS = ("pytest", "unittest")


def is_test_path(path: str) -> bool:
    """A file under tests/ or named like a test (`test_x.py`, `x_test.py`, `tests.py`, `conftest.py`); not
    `test.py`, which in training code is usually the evaluation script."""
    return bool(_TEST_PATH.search(posixpath.normpath(path.replace("\\", "/"))))
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class Rule:
    """Base class of every rule. Subclasses define metadata and `visit_<Node>` / `leave_<Node>` methods.

    One instance lints one file; `self.ctx` gives the shared analyses at the current traversal position.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    message: ClassVar[str]
    fix_title: ClassVar[str | None] = None
    severity: ClassVar[Severity] = Severity.WARNING
    safety: ClassVar[Safety] = Safety.SUGGEST
    priority: ClassVar[str] = "P2"
    default_enabled: ClassVar[bool] = True
    examples: ClassVar[Sequence[Valid | Invalid]] = ()
    micro_check: ClassVar[MicroCheck | None] = None
    # Substrings of which at least one must occur in a file for this rule to possibly match (cheap skip).
    triggers: ClassVar[tuple[str, ...]] = ()
    # The waste it finds costs on a CPU too (autograd recording): it also runs on programs that train on CPUs
    on_cpu_too: ClassVar[bool] = False
    # Reported at a program's training entry, which may be a script that only calls first-party PyTorch code and
    # names no torch itself (`agent.learn()` in `main.py`): it also runs on files that are no PyTorch code
    at_training_entry: ClassVar[bool] = False
    options: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _validate(cls)

    def __init__(self, ctx: "RuleContext") -> None:
        self.ctx = ctx
        self.reports: list[Report] = []

    # -- reporting ---------------------------------------------------------------------------

    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        *,
        replacement: cst.CSTNode | str | None = None,
        replacements: Sequence[tuple[cst.CSTNode, cst.CSTNode | str]] = (),
        safety: Safety | None = None,
        severity: Severity | None = None,
        imports: Sequence[ImportRequest | DefinitionRequest] = (),
        note: str | None = None,
    ) -> None:
        """Report `node`. A fix is `replacement` (for `node`) and/or `replacements` (node, new) pairs."""
        edits = tuple(replacements) + (((node, replacement),) if replacement is not None else ())
        fix_safety = (safety or self.safety) if edits else None
        if edits and fix_safety is Safety.SUGGEST:
            edits, fix_safety = (), None
        if fix_safety is not None and self.fix_title is None:
            raise RuleDefinitionError(f"{self.code} reported a fix but has no fix_title")
        self.reports.append(Report(node, message or self.message, severity or self.severity, fix_safety,
                                   edits, tuple(imports), note))

    def finish(self) -> None:
        """Called after the traversal; override for rules that decide at the end of a file."""

    @classmethod
    def option(cls, ctx: "RuleContext", key: str) -> Any:
        return ctx.rule_options.get(cls.code, {}).get(key, cls.options[key])

    @classmethod
    def docs(cls) -> str:
        return textwrap.dedent(cls.__doc__ or "").strip()

    @classmethod
    def family(cls) -> str:
        return cls.code[:5] + "x"


def _validate(cls: type[Rule]) -> None:
    where = f"{cls.__module__}.{cls.__qualname__}"
    for attr in ("code", "name", "message"):
        if not isinstance(getattr(cls, attr, None), str):
            raise RuleDefinitionError(f"{where}: missing class attribute `{attr}`")
    if not _CODE.match(cls.code):
        raise RuleDefinitionError(f"{where}: code {cls.code!r} is not GPU + 3 digits")
    if not _NAME.match(cls.name):
        raise RuleDefinitionError(f"{where}: name {cls.name!r} is not kebab-case")
    module_stem = cls.__module__.rsplit(".", 1)[-1]
    if cls.__module__.startswith("gpulint.rules.") and module_stem.replace("_", "-") != cls.name:
        raise RuleDefinitionError(f"{where}: file name {module_stem}.py does not match rule name {cls.name!r}")
    doc = cls.docs()
    missing = [h for h in _DOC_HEADINGS if h not in doc]
    if missing:
        raise RuleDefinitionError(f"{where}: docstring lacks {', '.join(missing)}")
    if not isinstance(cls.severity, Severity) or not isinstance(cls.safety, Safety):
        raise RuleDefinitionError(f"{where}: severity/safety must be Severity/Safety members")
    if cls.priority not in ("P1", "P2", "P3"):
        raise RuleDefinitionError(f"{where}: priority must be P1, P2 or P3")
    if not any(isinstance(e, Valid) for e in cls.examples) or not any(isinstance(e, Invalid) for e in cls.examples):
        raise RuleDefinitionError(f"{where}: needs at least one Valid and one Invalid example")
    fixes = cls.safety is not Safety.SUGGEST
    if fixes and not cls.fix_title:
        raise RuleDefinitionError(f"{where}: a fixing rule needs a fix_title")
    if fixes and not any(isinstance(e, Invalid) and e.fixed is not None for e in cls.examples):
        raise RuleDefinitionError(f"{where}: a fixing rule needs an Invalid example with `fixed=`")
    if not fixes and any(isinstance(e, Invalid) and e.fixed is not None for e in cls.examples):
        raise RuleDefinitionError(f"{where}: a suggest-only rule cannot have `fixed=` examples")


class RuleContext:
    """What a rule sees: the file's analyses at the current traversal position, plus program facts."""

    def __init__(self, path: str, module: cst.Module, analysis: FileAnalysis, program: "ProgramFacts",
                 rule_options: dict[str, dict[str, Any]]) -> None:
        self.path = path
        self.module = module
        self.analysis = analysis
        self.program = program
        self.rule_options = rule_options
        self.ancestors: list[cst.CSTNode] = []  # maintained by the engine; last item is the current node

    # names
    def qualname(self, node: cst.BaseExpression | None) -> str | None:
        return self.analysis.qualname(node)

    def spell(self, qualified: str) -> tuple[str, tuple[ImportRequest, ...]]:
        """How to write `qualified` in this file, and the import to add if the file does not import it."""
        local = self.analysis.local_name_for(qualified)
        if local is not None:
            return local, ()
        top = qualified.split(".")[0]
        return qualified, (ImportRequest(top),)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # regions
    @property
    def evidence(self) -> Evidence:
        from gpulint.analysis import Evidence

        return Evidence(self.analysis, self.ancestors)

    def hot_kind(self) -> HotKind | None:
        return self.analysis.hot_kind(self.ancestors)

    def in_hot_region(self) -> bool:
        return self.hot_kind() is not None

    def is_compiled(self) -> bool:
        return self.analysis.is_compiled(self.ancestors)

    def in_loop(self) -> bool:
        return self.analysis.in_loop(self.ancestors)

    def parent(self, levels: int = 1) -> cst.CSTNode | None:
        index = len(self.ancestors) - 1 - levels
        return self.ancestors[index] if index >= 0 else None

    def enclosing(self, *types: type[cst.CSTNode]) -> cst.CSTNode | None:
        for node in reversed(self.ancestors[:-1]):
            if isinstance(node, types):
                return node
        return None

    def targets_cuda(self) -> bool:
        """CUDA (or maybe-CUDA) evidence in the file or in the files of its program (`gpulint.program`: what it
        imports, what imports it, ...). Another script of the run that shares no import with this one lends no
        evidence, and no file lends any to one that picks another accelerator itself (it imports torch_xla)."""
        analysis, program = self.analysis, self.program
        if analysis.cuda_evidence or analysis.maybe_cuda_evidence:
            return True
        if self.imports_xla():
            return False
        if "torch.accelerator" in program.sources.get(self.path, ""):
            return True
        if not (program.cuda_evidence or program.maybe_cuda_evidence):
            return False  # no file of the run names CUDA: no need for the import graph
        from gpulint.program import related_targets_cuda

        return related_targets_cuda(self)

    def in_no_grad_function(self) -> bool:
        """Inside a function decorated `@torch.no_grad()` / `@torch.inference_mode()`: inference, not training."""
        import libcst as cst

        for node in reversed(self.ancestors):
            if isinstance(node, cst.FunctionDef):
                for decorator in node.decorators:
                    target = decorator.decorator
                    target = target.func if isinstance(target, cst.Call) else target
                    if self.qualname(target) in ("torch.no_grad", "torch.inference_mode"):
                        return True
                return False
        return False

    def imports_xla(self) -> bool:
        return any(target.split(".")[0] == "torch_xla" for target in self.analysis.aliases.values())

    def in_test_code(self) -> bool:
        """Inside a test: a function named `test_*`, or a test-named file that imports pytest or unittest.
        A `*_test.py` training script that imports neither is not test code."""
        import libcst as cst

        fn = self.enclosing(cst.FunctionDef)
        if isinstance(fn, cst.FunctionDef) and _TEST_FUNCTION.match(fn.name.value):
            return True
        return is_test_path(self.path) and any(
            target.split(".")[0] in _TEST_FRAMEWORKS for target in self.analysis.aliases.values())

    def inside_with(self, *qualnames: str) -> bool:
        """Is the current node in the body of `with <one of qualnames>(...)` within the same function?"""
        import libcst as cst

        for node in reversed(self.ancestors[:-1]):
            if isinstance(node, (cst.FunctionDef, cst.Lambda)):
                return False
            if isinstance(node, cst.With):
                for item in node.items:
                    expr = item.item.func if isinstance(item.item, cst.Call) else item.item
                    if self.qualname(expr) in qualnames:
                        return True
        return False

    # shortcuts to evidence
    def mask_confidence(self, node: cst.BaseExpression) -> Confidence | None:
        return self.evidence.mask_confidence(node)

    def device_of(self, node: cst.BaseExpression | None) -> Device | None:
        return self.evidence.device_of(node)
