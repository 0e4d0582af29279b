"""Training snippets shared by the CLI, config, reporter and pre-commit tests."""

import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# one blocking host-to-device copy in a training step (GPU011 at line 6)
BAD = textwrap.dedent("""\
    import torch


    def train(model, loader, optimizer, device):
        for x, y in loader:
            x = x.to(device)
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
""")
GOOD = BAD.replace("x.to(device)", "x.to(device, non_blocking=True)")
