import re

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import dotted_name
from gpulint.network_size import network_size, work_per_step
from gpulint.pins import torch_pinned_below
from gpulint.program import mentions, program_index, site_program_texts
from gpulint.rule import is_test_path
from gpulint.semantic.precision import (in_code, precision_switched_off, runs_in_fp64, runs_on_cuda,
                                       training_entry_anchor, uses_low_precision)

# ---------------------------------------------------------------------------------------------
# Program-level helpers shared by the 02x precision rules (GPU020/021/023/024/025 import them).

# benchmarks/tf32_small_nets.py, H100, torch 2.11: the TF32 kernels cuBLAS picks for small GEMMs need no split-K
# reduction, 27 instead of 34 launches per step of an 8-256-256-5 MLP (1.03-1.16x per step on small MLPs)
_SMALL_GEMM_NOTE = ("the matmuls are small, so the gain is fewer kernel launches rather than tensor-core math: "
                    "1.03-1.16x per training step of small MLPs measured on an H100")


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
    modules, test files and fp64/scientific programs are never reported. Projects pinning torch 1.7 to 1.11 are
    not reported either (those versions ran fp32 matmuls in TF32 by default); a pin below 1.7, which has no TF32,
    gets the finding without a fix.

    ## Why is this slow
    By default PyTorch computes fp32 matmuls in full IEEE fp32, which uses a small fraction of an Ampere+
    GPU's tensor-core throughput. TF32 keeps fp32 storage and range and rounds the inputs of the matmul to a
    10-bit mantissa. Measured on an H100: an 8192^2 matmul runs 7.9x faster (2.3x at 1024^2), a 6-layer
    d1024 transformer training step 2.61x faster. Small MLPs gain less but still gain: their TF32 GEMMs need no
    split-K reduction, so a step launches fewer kernels (27 instead of 34 for an 8-256-256-5 MLP; 1.03-1.16x per
    step across small MLP shapes, `benchmarks/tf32_small_nets.py`; the catalog's 0.99x for an RL-sized MLP was
    within noise of that). The relative error
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
    triggers = ("backward", ".step(", "__main__")  # an entry script may only call the training loop
    at_training_entry = True
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
        Valid(  # a small GRU network: cuDNN already runs the recurrent kernels in TF32
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

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._sets_tf32 = False  # set since the run read the file (an earlier fix pass), as this traversal saw

    def visit_Call(self, node: cst.Call) -> None:
        self._sets_tf32 = self._sets_tf32 or _sets_tf32_call(node)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._sets_tf32 = self._sets_tf32 or _sets_tf32_flag(node)

    def finish(self) -> None:
        ctx = self.ctx
        anchor = training_entry_anchor(ctx)
        if anchor is None or is_test_path(ctx.path):
            return
        # torch 1.7 to 1.11 ran fp32 matmuls in TF32 by default; before 1.7 there was no TF32 at all (upgrade first)
        pinned_before_tf32 = torch_pinned_below(ctx.path, (1, 7))
        if not pinned_before_tf32 and torch_pinned_below(ctx.path, (1, 12)):
            return
        texts = site_program_texts(ctx, in_main_guard=anchor is ctx.analysis.main_guard)
        joined = list(texts.values())
        if not runs_on_cuda(ctx, texts):
            return
        # in code, not in comments or docstrings: a commented-out `allow_tf32 = True` sets nothing
        if any(in_code(TF32_MATMUL_SET, text) or runs_in_fp64(text) for text in joined):
            return
        opt_in = None
        if any(uses_low_precision(text) for text in joined):
            opt_in = precision_switched_off(ctx, texts)
            if opt_in is None:
                return  # mixed precision is in effect
        work = work_per_step(texts)
        if work is not None and not work.convolutional and not work.recurrent:
            # small GEMMs still gain: fewer launches (_SMALL_GEMM_NOTE)
            note = work.explain() if work.pays else _SMALL_GEMM_NOTE
        elif network_size(texts, matmul_only=True) == "small":
            return  # small matmuls beside the convolutions or RNNs that cuDNN already runs in TF32
        else:
            note = None
        if opt_in is not None:
            note = "; ".join(filter(None, [f"mixed precision is opt-in ({opt_in}, off by default): the default run "
                                           "trains in fp32", note]))
        if self._sets_tf32:
            return
        if pinned_before_tf32:
            self.report(anchor, note="the project pins torch below 1.7, which has no TF32: upgrade torch first"
                                     + (f"; {note}" if note else ""))
            return
        uses_new = any(mentions(_NEW_API_TEXT, text) for text in joined)
        uses_legacy = any(mentions(_LEGACY_API_TEXT, text) for text in joined)
        edit = None if uses_new and uses_legacy else self._insertion(anchor, new_api=uses_new)
        if edit is None:
            self.report(anchor, note=note)
        else:
            self.report(anchor, replacements=[edit], note=note)

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
        if anchor is guard and isinstance(guard.body, cst.IndentedBlock) and program_index(self.ctx).importers(
                self.ctx.path):
            # other files of the program import this script: keep the global setting out of their import
            indent = guard.body.indent if guard.body.indent is not None else self.ctx.module.default_indent
            return guard.body.header.newline, "\n" + indent + statement + "\n"
        newline = imports[-1].trailing_whitespace.newline
        return newline, "\n" + statement + "\n"


def _sets_tf32_call(node: cst.Call) -> bool:
    func = node.func
    name = func.attr.value if type(func) is cst.Attribute else func.value if type(func) is cst.Name else ""
    return name == "set_float32_matmul_precision"


def _sets_tf32_flag(node: cst.AssignTarget) -> bool:
    target = node.target
    return type(target) is cst.Attribute and target.attr.value in ("fp32_precision", "allow_tf32") and (
        dotted_name(target) or "").endswith(("matmul.fp32_precision", "backends.fp32_precision", "matmul.allow_tf32"))


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
