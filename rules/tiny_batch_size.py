from __future__ import annotations

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.semantic.loaders import (
    LoaderFlow,
    checkable_loader_call,
    int_literal,
    loader_arg,
)


class TinyBatchSize(Rule):
    """
    ## What it does
    Finds a training `DataLoader` in CUDA code whose literal `batch_size` is below a threshold (16 by
    default; option `min-batch-size`).

    ## Why is this slow
    Small batches leave the GPU launch-bound: every layer is a kernel launch whose fixed cost (a few
    microseconds) dwarfs the arithmetic. On an H100 a batch-1 forward of a 64-256-256-18 MLP takes ~62 µs,
    essentially launch overhead, while the same net trains forward + backward + AdamW on a batch of 1024 in
    ~0.96 ms. Larger batches (or gradient accumulation for memory) use the hardware far better.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=4, shuffle=True)
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=64, shuffle=True)  # and scale the learning rate
    ```

    ## Fix safety
    No automatic fix: the batch size changes the optimisation (learning-rate scaling, BatchNorm statistics,
    generalisation) and memory use.
    """

    code = "GPU053"
    name = "tiny-batch-size"
    message = "Training batch size {size} is tiny for a GPU; the step is launch-bound"
    severity = Severity.INFO
    safety = Safety.SUGGEST
    priority = "P3"
    default_enabled = False
    options = {"min-batch-size": 16}
    triggers = ("batch_size",)
    examples = [
        Valid(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=128, shuffle=True)
            for x, y in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # evaluation loader: not a training step
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(test_set, batch_size=1)
            with torch.no_grad():
                for x, y in loader:
                    print(model(x.cuda()))
            """
        ),
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(train_set, batch_size=4, shuffle=True)
            for x, y in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not checkable_loader_call(self.ctx, node):
            return
        size_arg = loader_arg(node, "batch_size")
        size = int_literal(size_arg.value) if size_arg is not None else None
        if size is None or size < 1 or size >= int(self.option(self.ctx, "min-batch-size")):
            return
        if loader_arg(node, "batch_sampler") is not None:
            return
        if not LoaderFlow.of(self.ctx.analysis).reaches_training(node):
            return
        assert size_arg is not None
        self.report(size_arg, self.message.format(size=size))
