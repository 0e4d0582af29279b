"""Runtime micro-checks: run each rule's original and rewritten snippet on real tensors and compare.

The only gpulint module that imports torch, and only when a check runs. Check kinds (catalog §0.4):
EQ (outputs and leaf gradients; NaN positions must match), GB (graph breaks via torch._dynamo.explain),
SYNC (host syncs: sync-debug warnings on CUDA, a dispatch log of syncing ops on CPU), WARN (warning count),
PERF (CUDA wall-clock timing, informational). Results are cached per rule, torch version and device.
"""

from __future__ import annotations

import json
import sys
import math
import statistics
import textwrap
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gpulint.rule import MicroCheck, Rule

CACHE_DIR = Path(".gpulint_cache")


@dataclass
class CheckResult:
    code: str
    device: str
    ok: bool
    equal: bool | None = None
    max_abs_diff: float | None = None
    graph_breaks: tuple[int, int] | None = None
    cudagraph_unsafe: tuple[int, int] | None = None
    syncs: tuple[int, int] | None = None
    warnings: tuple[int, int] | None = None
    speedup: float | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    def reason(self) -> str:
        """Why a failed check failed, in one line."""
        return self.error or "; ".join(self.notes) or "original and rewritten code disagree"


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "no usable torch"
        return False
    return True


def _effective_device(check: MicroCheck, device: str) -> str:
    """Checks of host-side code (data loading) set `host_only`: forked DataLoader workers cannot use CUDA."""
    return "cpu" if check.options.get("host_only") else device


def _namespace(torch: Any, device: str) -> dict[str, Any]:
    import torch.nn as nn
    import torch.nn.functional as F

    return {"torch": torch, "nn": nn, "F": F, "math": math, "device": device}


def _run_snippet(check: MicroCheck, code: str, device: str, seed: int, torch: Any,
                 train_mode: bool = False) -> dict[str, Any]:
    device = _effective_device(check, device)
    namespace = _namespace(torch, device)
    torch.manual_seed(seed)
    with torch.device(device):
        exec(compile(textwrap.dedent(check.setup), "<setup>", "exec"), namespace)  # noqa: S102 - rule-owned code
        if train_mode:
            for value in list(namespace.values()):
                if isinstance(value, torch.nn.Module):
                    value.train()
        torch.manual_seed(seed + 1)
        exec(compile(textwrap.dedent(code), "<snippet>", "exec"), namespace)  # noqa: S102
    return namespace


def _leaves(namespace: dict[str, Any], torch: Any) -> list[Any]:
    return [v for k, v in sorted(namespace.items()) if isinstance(v, torch.Tensor) and v.is_leaf and v.requires_grad]


def _compare(check: MicroCheck, before: dict[str, Any], after: dict[str, Any], torch: Any) -> tuple[bool, float]:
    rtol = check.options.get("rtol", 0.0)
    atol = check.options.get("atol", 0.0)
    worst = 0.0
    for name in check.compare:
        a, b = before.get(name), after.get(name)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape or a.dtype != b.dtype:
                return False, math.inf
            if not torch.equal(torch.isnan(a), torch.isnan(b)) if a.is_floating_point() else False:
                return False, math.inf
            if a.numel():
                diff = (a.double() - b.double()).abs().nan_to_num(0.0, posinf=0.0, neginf=0.0)
                worst = max(worst, float(diff.max()))
            if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                return False, worst
        elif a != b:
            return False, math.inf
    return True, worst


def _grad_check(check: MicroCheck, device: str, seed: int, torch: Any) -> bool:
    """Leaf gradients after sum(out * g).backward() must match too (when the snippet is differentiable)."""
    results = []
    for code in (check.before, check.after):
        ns = _run_snippet(check, code, device, seed, torch)
        outputs = [ns[n] for n in check.compare if isinstance(ns.get(n), torch.Tensor) and ns[n].requires_grad]
        if not outputs:
            return True
        gen = torch.Generator(device="cpu").manual_seed(seed + 7)
        total = sum((o * torch.randn(o.shape, generator=gen).to(o)).sum() for o in outputs)
        total.backward()
        results.append([leaf.grad for leaf in _leaves(ns, torch)])
    rtol, atol = check.options.get("rtol", 0.0), check.options.get("atol", 0.0)
    if device.startswith("cuda"):  # CUDA backward kernels accumulate with atomics: order, hence rounding, varies
        rtol, atol = max(rtol, 1e-6), max(atol, 1e-7)
    return all(
        (ga is None and gb is None) or (ga is not None and gb is not None
                                        and torch.allclose(ga, gb, rtol=rtol, atol=atol, equal_nan=True))
        for ga, gb in zip(*results))


def _as_function(check: MicroCheck, code: str, device: str, torch: Any) -> tuple[Any, list[Any]]:
    """The snippet as a function of the setup's tensors returning the compared values (what torch.compile sees)."""
    namespace = _run_snippet(check, "", device, 0, torch)
    inputs = [k for k, v in namespace.items() if isinstance(v, torch.Tensor)]
    body = textwrap.indent(textwrap.dedent(code), "    ")
    returned = ", ".join(check.compare) or "None"
    source = f"def _snippet({', '.join(inputs)}):\n{body}\n    return ({returned},)\n"
    exec(compile(source, "<compile-probe>", "exec"), namespace)  # noqa: S102
    return namespace["_snippet"], [namespace[k].clone() for k in inputs]


def _equal_in_train_mode(check: MicroCheck, device: str, torch: Any) -> bool:
    """Batch statistics (BatchNorm) and dropout masks depend on what shares a forward pass: with the modules in
    train mode, one forward over the concatenated batch must still equal the separate forwards."""
    before = _run_snippet(check, check.before, device, 0, torch, train_mode=True)
    after = _run_snippet(check, check.after, device, 0, torch, train_mode=True)
    return _compare(check, before, after, torch)[0]


def _writes_through_views(check: MicroCheck, device: str, seed: int, torch: Any) -> bool:
    """ALIAS: each input that is not a grad leaf becomes a view into a larger buffer; whatever the original
    writes through it in place, the rewrite must write too (a rebinding rewrite would leave the buffer stale)."""
    buffers = []
    for code in (check.before, check.after):
        namespace = _run_snippet(check, "", device, seed, torch)
        views = {}
        for name, value in list(namespace.items()):
            if isinstance(value, torch.Tensor) and not value.requires_grad:
                buffer = torch.zeros((2, *value.shape), dtype=value.dtype, device=value.device)
                buffer[1].copy_(value)
                namespace[name] = buffer[1]
                views[name] = buffer
        torch.manual_seed(seed + 1)
        with torch.device(_effective_device(check, device)):
            exec(compile(textwrap.dedent(code), "<alias-probe>", "exec"), namespace)  # noqa: S102
        buffers.append(views)
    rtol, atol = check.options.get("rtol", 0.0), check.options.get("atol", 0.0)
    before, after = buffers
    return all(torch.allclose(before[n], after[n], rtol=rtol, atol=atol, equal_nan=True) for n in before)


def _graph_breaks(check: MicroCheck, code: str, device: str, torch: Any) -> int:
    import torch._dynamo as dynamo

    function, args = _as_function(check, code, device, torch)
    dynamo.reset()
    with torch.device(device):  # tensors the snippet itself creates live where the inputs do
        explanation = dynamo.explain(function)(*args)
    return max(explanation.graph_break_count, len(explanation.break_reasons))


def _cudagraph_unsafe_nodes(check: MicroCheck, code: str, device: str, torch: Any) -> int:
    """Compiled graphs whose AOT forward holds a node CUDA graphs cannot capture (index_put with a bool
    index, nonzero, ...). Inductor's own test; it is private API, so a torch without it fails the check."""
    import torch._dynamo as dynamo
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    unsafe: list[str] = []

    def forward_compiler(graph_module: Any, example_inputs: Any) -> Any:
        node = get_first_incompatible_cudagraph_node(graph_module)
        if node is not None:
            unsafe.append(str(node.target))
        return graph_module.forward

    function, args = _as_function(check, code, device, torch)
    dynamo.reset()
    # fullgraph: dynamic-shape ops are then captured, hence visible (catalog F2). A snippet with a data-dependent
    # branch cannot be captured whole; its check then fails rather than report a partial count.
    with torch.device(device):
        torch.compile(function, backend=aot_autograd(fw_compiler=forward_compiler), fullgraph=True)(*args)
    dynamo.reset()
    return len(unsafe)


_SYNC_OPS = {"aten.nonzero.default", "aten._local_scalar_dense.default", "aten.item.default"}


def _sync_count(check: MicroCheck, code: str, device: str, torch: Any) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        # some sync warnings are issued once per process in C++: without warn-always a check that runs after
        # another one reaching the same sync counted 0 (GPU075 read 0->0; alone it is 4->2)
        warned_always = torch._C._get_warnAlways()
        torch._C._set_warnAlways(True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                _run_snippet(check, code, device, 0, torch)
            finally:
                torch.cuda.set_sync_debug_mode(0)
                torch._C._set_warnAlways(warned_always)
        return sum("synchroniz" in str(w.message) for w in caught)
    from torch.utils._python_dispatch import TorchDispatchMode

    class SyncLog(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            bool_index = name.startswith(("aten.index.Tensor", "aten.index_put")) and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())
                if isinstance(args[1] if len(args) > 1 else None, (list, tuple)))
            if name in _SYNC_OPS or bool_index:
                SyncLog.count += 1
            return func(*args, **(kwargs or {}))

    namespace = _namespace(torch, device)
    exec(compile(textwrap.dedent(check.setup), "<setup>", "exec"), namespace)  # noqa: S102
    with SyncLog():
        exec(compile(textwrap.dedent(code), "<snippet>", "exec"), namespace)  # noqa: S102
    return SyncLog.count


def _warning_count(check: MicroCheck, code: str, device: str, torch: Any) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run_snippet(check, code, device, 0, torch)
    return sum(1 for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning, UserWarning)))


def _time(check: MicroCheck, code: str, device: str, torch: Any, repeats: int = 30) -> float:
    """Median milliseconds of `code` on CUDA, on the larger `perf_setup` inputs when the check gives them."""
    device = _effective_device(check, device)
    namespace = _namespace(torch, device)
    setup = check.options.get("perf_setup", check.setup)
    with torch.device(device):
        exec(compile(textwrap.dedent(setup), "<setup>", "exec"), namespace)  # noqa: S102
    compiled = compile(textwrap.dedent(code), "<snippet>", "exec")
    for _ in range(5):
        exec(compiled, namespace)  # noqa: S102
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):  # wall clock around a synchronized run: host-side blocking counts too
        start = time.perf_counter()
        exec(compiled, namespace)  # noqa: S102
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


_COUNTED_KINDS = (("GB", "graph_breaks", _graph_breaks), ("CG", "cudagraph_unsafe", _cudagraph_unsafe_nodes),
                  ("SYNC", "syncs", _sync_count), ("WARN", "warnings", _warning_count))


def run_check(rule: type[Rule], device: str = "cpu") -> CheckResult:
    import torch

    check = rule.micro_check
    result = CheckResult(rule.code, device, ok=True)
    if check is None or not check.before or not check.after:
        result.notes.append("no runnable micro-check")
        return result
    kinds = set(check.kinds)
    with warnings.catch_warnings():  # the snippets' own warnings are data (WARN), not output
        warnings.simplefilter("ignore")
        return _run_kinds(rule, check, kinds, device, result, torch)


def _run_kinds(rule: type[Rule], check: MicroCheck, kinds: set[str], device: str, result: CheckResult,
               torch: Any) -> CheckResult:
    try:
        if "EQ" in kinds:
            seeds = (0, 1, 2)
            for seed in seeds:  # fresh random data each time, never zeros
                before = _run_snippet(check, check.before, device, seed, torch)
                after = _run_snippet(check, check.after, device, seed, torch)
                equal, worst = _compare(check, before, after, torch)
                result.max_abs_diff = max(result.max_abs_diff or 0.0, worst)
                if not equal or not _grad_check(check, device, seed, torch):
                    result.equal = result.ok = False
                    break
            else:
                result.equal = True
        if check.options.get("train_probe") and not _equal_in_train_mode(check, device, torch):
            result.ok = False
            result.notes.append("original and rewrite differ with the modules in train mode (BatchNorm/dropout)")
        if "ALIAS" in kinds and not _writes_through_views(check, device, 0, torch):
            result.ok = False
            result.notes.append("the original writes through a view of its input in place; the rewrite does not")
        for kind, field_name, counter in _COUNTED_KINDS:
            if kind in kinds:  # a count the rewrite must not raise: graph breaks, unsafe graphs, syncs, warnings
                pair = (counter(check, check.before, device, torch), counter(check, check.after, device, torch))
                setattr(result, field_name, pair)
                if pair[1] > pair[0]:
                    result.ok = False
    except Exception as error:  # noqa: BLE001 - a check that cannot run has failed
        result.ok = False
        result.error = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
        return result
    # PERF is informational and never gates a fix. Host-side (data loading) checks are not timed: their speed-up
    # depends on how expensive the user's dataset is, which a toy dataset cannot stand for.
    if device.startswith("cuda") and not check.options.get("host_only"):
        try:
            before_code = check.options.get("perf_before", check.before)
            after_code = check.options.get("perf_after", check.after)
            result.speedup = _time(check, before_code, device, torch) / _time(check, after_code, device, torch)
        except Exception as error:  # noqa: BLE001
            result.notes.append(f"not timed: {type(error).__name__}: {' '.join(str(error).split())[:200]}")
    return result


def cached_check(rule: type[Rule], device: str = "cpu") -> CheckResult:
    """run_check, remembered per rule, gpulint version, torch version and device in .gpulint_cache/."""
    import torch

    from gpulint import __version__

    key = f"verify-{__version__}-{torch.__version__}-{device}.json"
    path = CACHE_DIR / key
    try:
        cache = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        cache = {}
    fingerprint = repr(rule.micro_check)
    entry = cache.get(rule.code)
    if entry and entry.get("fingerprint") == fingerprint:
        data = {k: v for k, v in entry["result"].items()}
        for pair in ("graph_breaks", "cudagraph_unsafe", "syncs", "warnings"):
            if data.get(pair) is not None:
                data[pair] = tuple(data[pair])
        return CheckResult(**data)
    result = run_check(rule, device)
    cache[rule.code] = {"fingerprint": fingerprint, "result": result.to_json()}
    try:
        CACHE_DIR.mkdir(exist_ok=True)
        (CACHE_DIR / ".gitignore").write_text("*\n")
        path.write_text(json.dumps(cache, indent=1))
    except OSError:
        pass  # a read-only tree just means no cache
    return result


def _pair(value: tuple[int, int] | None) -> str:
    return "-" if value is None else f"{value[0]}->{value[1]}"


def render_table(results: Sequence[CheckResult]) -> str:
    header = ("| rule | device | result | equal (max abs diff) | graph breaks | CUDA-graph-unsafe graphs | syncs | "
              "warnings | speed-up |")
    rows = [header, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        equal = "-" if r.equal is None else ("yes" if r.equal else "NO")
        if r.max_abs_diff is not None and r.equal is not None:
            equal += f" ({r.max_abs_diff:.1e})"
        status = "pass" if r.ok else f"FAIL: {r.reason()}"
        speed = "-" if r.speedup is None else f"x{r.speedup:.2f}"
        rows.append(f"| {r.code} | {r.device} | {status} | {equal} | {_pair(r.graph_breaks)} | "
                    f"{_pair(r.cudagraph_unsafe)} | {_pair(r.syncs)} | "
                    f"{_pair(r.warnings)} | {speed} |")
    return "\n".join(rows) + "\n"


def fixing_rules(rules: Sequence[type[Rule]]) -> list[type[Rule]]:
    return [r for r in rules if r.fix_title is not None and r.micro_check is not None]


def failed_checks(rules: Sequence[type[Rule]], device: str = "cpu") -> dict[str, str]:
    """Codes of fixing rules whose micro-check fails on the installed torch, with the reason."""
    failures = {}
    for rule in fixing_rules(rules):
        result = cached_check(rule, device)
        if not result.ok:
            failures[rule.code] = result.reason()
    return failures


def check_sites(sites_file: str, device: str) -> list[dict]:
    """Results for the sites in `sites_file` ({"files": {path: text}, "sites": [...]}), in the same order."""
    from gpulint.registry import rule_by_code
    from gpulint.site_check import SiteResult, check_site

    request = json.loads(Path(sites_file).read_text(encoding="utf-8"))
    results = []
    for site in request["sites"]:
        check = rule_by_code(site["code"]).micro_check
        options = check.options if check is not None else {}
        try:
            result = check_site(site["original"], site["rewritten"], site["column"], request["files"][site["path"]],
                                site["imports"], options.get("rtol", 0.0), options.get("atol", 0.0), device)
        except Exception as error:  # noqa: BLE001 - a site the checker cannot handle falls back to the rule check
            result = SiteResult("fallback", f"{type(error).__name__}: {error}")
        results.append(result.to_json())
    return results


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from gpulint.registry import all_rules, rule_by_code

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # one line and exit 2, like every gpulint usage error
            self.exit(2, f"gpulint verify: error: {message}\n")

    parser = Parser(prog="gpulint verify", description=__doc__.splitlines()[0])
    parser.add_argument("codes", nargs="*", help="rule codes or names (default: every rule with a micro-check)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the tensors live (default: cpu)")
    parser.add_argument("--format", "--output-format", dest="format", choices=("text", "json"), default="text",
                        help="text table (default) or JSON")
    parser.add_argument("--cached", action="store_true", help="reuse results cached for this torch version")
    parser.add_argument("--sites", metavar="FILE", help="also check rewrites of the user's own code (JSON written by "
                        "`gpulint fix --apply`); output becomes {\"rules\": [...], \"sites\": [...]}")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, usage errors
        return int(exit_.code or 0)
    rules = [rule_by_code(c) for c in args.codes] if args.codes else [r for r in all_rules() if r.micro_check]
    without = [r.code for r in rules if r.micro_check is None]
    if without:
        print(f"gpulint verify: error: no micro-check for {', '.join(without)} (only rules that rewrite code have "
              f"one)", file=sys.stderr)
        return 2
    if not torch_available():
        print("gpulint verify: error: torch is not installed; the CPU build is enough: pip install torch "
              "--index-url https://download.pytorch.org/whl/cpu", file=sys.stderr)
        return 2
    check = cached_check if args.cached else run_check
    results = [check(rule, args.device) for rule in rules]
    if args.sites:
        print(json.dumps({"rules": [r.to_json() for r in results], "sites": check_sites(args.sites, args.device)}))
        return 0 if all(r.ok for r in results) else 1
    if args.format == "json":
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print(render_table(results), end="")
    return 0 if all(r.ok for r in results) else 1
