from __future__ import annotations

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import has_star_args
from gpulint.semantic.loaders import int_literal, is_dataloader_call, loader_arg


class DataloaderInvalidWorkerOptions(Rule):
    """
    ## What it does
    Finds a `DataLoader` that runs without worker processes (`num_workers` absent or `0`) but passes an
    option that only exists for workers: `persistent_workers=True` or a `prefetch_factor`.

    ## Why is this slow
    It is not slow, it crashes: since torch 2.0 the DataLoader constructor raises
    `ValueError: persistent_workers option needs num_workers > 0` and
    `ValueError: prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 ...`.
    It usually means workers were meant to be used (a lost `num_workers=`), or a debugging `num_workers=0`
    was left in.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=64, persistent_workers=True, prefetch_factor=4)
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=64, num_workers=8, persistent_workers=True, prefetch_factor=4)
    ```
    or drop the worker options when loading in the main process is intended.

    ## Fix safety
    No automatic fix: choosing a worker count (with its pickling and memory implications, GPU050) or
    deleting the options is a decision for the author.
    """

    code = "GPU052"
    name = "dataloader-invalid-worker-options"
    message = "`{option}` needs `num_workers > 0`; this DataLoader raises ValueError when it is built"
    severity = Severity.ERROR
    safety = Safety.SUGGEST
    priority = "P2"
    triggers = ("persistent_workers", "prefetch_factor")
    examples = [
        Valid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, num_workers=4, persistent_workers=True, prefetch_factor=4)
            """
        ),
        Valid(  # options computed from the worker count stay valid
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, num_workers=args.workers,
                                persistent_workers=args.workers > 0,
                                prefetch_factor=2 if args.workers > 0 else None)
            """
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=64, persistent_workers=True)
            """
        ),
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=0, prefetch_factor=4)
            """
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not is_dataloader_call(self.ctx.analysis, node) or has_star_args(node):
            return
        workers = loader_arg(node, "num_workers")
        if workers is not None and int_literal(workers.value) != 0:
            return
        persistent = loader_arg(node, "persistent_workers")
        prefetch = loader_arg(node, "prefetch_factor")
        for option, arg in (("persistent_workers=True", persistent), ("prefetch_factor", prefetch)):
            if arg is None:
                continue
            if option == "prefetch_factor" and isinstance(arg.value, cst.Name) and arg.value.value == "None":
                continue
            if option.startswith("persistent") and not (isinstance(arg.value, cst.Name) and arg.value.value == "True"):
                continue
            self.report(arg, self.message.format(option=option))
