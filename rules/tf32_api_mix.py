import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import dotted_name, walk
from gpulint.program import current_text, program_index
from gpulint.semantic.precision import location, tf32_facts, training_entry_anchor


class Tf32ApiMix(Rule):
    """
    ## What it does
    Finds programs that use both TF32 API families: the legacy one (`torch.set_float32_matmul_precision`,
    `torch.get_float32_matmul_precision`, `torch.backends.cuda.matmul.allow_tf32`,
    `torch.backends.cudnn.allow_tf32`) and the new one (assignments to `torch.backends.fp32_precision`,
    `torch.backends.cuda.matmul.fp32_precision`, `torch.backends.cudnn[.conv|.rnn].fp32_precision`).

    The check is program-level. The program is every file named on the command line; for an entry script
    (a file with `if __name__ == "__main__":` or a top-level training loop) the uses counted are those in
    the script and in the first-party modules it imports, transitively. The finding is reported on the
    entry point's guard (or first top-level training loop), listing where each family is used. A module
    that mixes both families by itself and that no entry script of the run imports is reported at its
    first new-API assignment. Uses under a version or feature gate (`if hasattr(torch.backends,
    "fp32_precision"):`, `if torch.__version__ ...`, `try:`) are taken as one family per torch version,
    and the program is not reported.

    ## Why is this slow
    It is a correctness problem more than a speed one. PyTorch documents that the two families must not be
    mixed: after a new-API assignment, reading a legacy flag raises (torch 2.13: `RuntimeError: PyTorch is
    checking whether allow_tf32_new is enabled for cuBlas matmul, Current status indicate that you have used
    mix of the legacy and new APIs ...`), also when the read happens inside a dependency; other
    combinations silently report stale values (`get_float32_matmul_precision()` returns `'high'` after
    `matmul.fp32_precision = 'ieee'`), so the TF32 state is not what the code says.

    ## Example
    ```python
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.allow_tf32 = True
    ```

    ## Use instead
    ```python
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    ```
    or only legacy calls (`torch.set_float32_matmul_precision("high")`) on torch versions before 2.9.

    ## Fix safety
    No automatic fix: which family to keep depends on the torch versions the project supports. gpulint's
    own GPU020 fix never creates a mix.
    """

    code = "GPU021"
    name = "tf32-api-mix"
    message = "Legacy and new TF32 APIs are mixed in one program (reading a legacy flag after a new-API set raises)"
    severity = Severity.ERROR
    safety = Safety.SUGGEST
    priority = "P2"
    triggers = ("__main__", "backward", ".step(", "fp32_precision")
    examples = [
        Valid(
            """
            import torch
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.cudnn.conv.fp32_precision = "tf32"

            if __name__ == "__main__":
                main()
            """
        ),
        Valid(  # version gate: only one family runs
            """
            import torch
            if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
                torch.backends.cuda.matmul.fp32_precision = "tf32"
            else:
                torch.backends.cuda.matmul.allow_tf32 = True

            if __name__ == "__main__":
                main()
            """
        ),
        Invalid(
            """
            import torch
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.cudnn.allow_tf32 = True

            if __name__ == "__main__":
                main()
            """
        ),
        Invalid(  # a library module mixing both families by itself
            """
            import torch

            def setup_precision():
                torch.set_float32_matmul_precision("high")
                torch.backends.fp32_precision = "tf32"
            """
        ),
    ]

    def finish(self) -> None:
        ctx = self.ctx
        anchor = training_entry_anchor(ctx, any_main_guard=True)
        if anchor is not None:
            index = program_index(ctx)
            paths = index.reach(ctx.path)
        else:
            own = tf32_facts(ctx.path, current_text(ctx))
            if not (own.tf32_new and own.tf32_legacy) or program_index(ctx).entries_reaching(ctx.path):
                return
            index = program_index(ctx)
            paths = frozenset({ctx.path})
        legacy, new = [], []
        for path in sorted(paths):
            facts = tf32_facts(path, current_text(ctx) if path == ctx.path else index.sources[path])
            legacy += [(path, use) for use in facts.tf32_legacy]
            new += [(path, use) for use in facts.tf32_new]
        if not legacy or not new or any(use.gated for _, use in legacy + new):
            return
        def where(path: str, use) -> str:
            return f"{use.what} ({location(ctx, path, use.line)})"

        note = ("legacy API: " + ", ".join(where(p, u) for p, u in legacy[:3])
                + "; new API: " + ", ".join(where(p, u) for p, u in new[:3]))
        if anchor is None:
            anchor = _first_new_api_assignment(ctx.module)
            if anchor is None:
                return
        self.report(anchor, note=note)


def _first_new_api_assignment(module: cst.Module) -> cst.CSTNode | None:
    for node in walk(module, into_functions=True):
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for target in targets:
                if (dotted_name(target) or "").endswith("fp32_precision"):
                    return node
    return None
