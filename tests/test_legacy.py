"""Files written for torch <= 0.3 (`x.cuda(async=True)`) are syntax errors today, yet users want the rest checked."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from gpulint.engine import lint_text
from gpulint.legacy import repair
from gpulint.registry import all_rules

OLD_SCRIPT = textwrap.dedent("""\
    import torch
    model = torch.nn.Linear(8, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for inputs, targets in train_loader:
        inputs, targets = inputs.cuda(), targets.cuda(async=True)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """)


def test_repair_renames_only_keyword_arguments_and_maps_columns_back() -> None:
    text = "a.cuda(async=True); b.to(d, async = True)\nif async == 1: pass\n"
    assert repair(text) is None  # `async == 1` still does not parse: not a file this repair can read
    fixed = repair("a.cuda(async=True); b.to(d, async = True)\n")
    assert fixed is not None and fixed.text == "a.cuda(non_blocking=True); b.to(d, non_blocking = True)\n"
    assert fixed.first == (1, 8)
    assert fixed.original_column(1, 28) == 21  # `b` of the user's line
    assert repair("x = 1\n") is None


def test_old_spelling_is_a_syntax_error_and_the_rest_is_checked_without_fixes() -> None:
    found = lint_text(OLD_SCRIPT, "train.py", all_rules()).diagnostics
    codes = {(d.line, d.code) for d in found}
    assert (5, "GPU900") in codes
    syntax = next(d for d in found if d.code == "GPU900")
    assert syntax.col == OLD_SCRIPT.splitlines()[4].index("async") + 1
    assert (5, "GPU011") in codes  # `inputs.cuda()` blocks; `targets.cuda(async=True)` was non-blocking already
    blocking = [d for d in found if d.code == "GPU011"]
    assert [d.col for d in blocking] == [OLD_SCRIPT.splitlines()[4].index("inputs.cuda") + 1]
    assert all(d.fix is None for d in found)


def test_fix_apply_leaves_an_old_file_untouched(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(OLD_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "gpulint", "fix", "--apply", "--unsafe-fixes", "--no-cache",
                           "--isolated", str(script)], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert script.read_text() == OLD_SCRIPT
    assert "GPU900" in done.stdout
