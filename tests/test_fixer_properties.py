"""Property-based tests of the fixer's invariants on generated training scripts (hypothesis).

Whatever mix of findings, nesting, comments and line endings a file has, `fix`:
- leaves a file with no applicable fix byte-identical,
- produces code that parses and compiles, or leaves the file untouched and says which rule failed,
- converges: fixing the fixed text again changes nothing,
- never touches text outside the edits it reports.
"""

import textwrap
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpulint.diagnostics import Edit, Position, Safety
from gpulint.fixer import apply_edits, choose_non_overlapping, fix_text, validate
from gpulint.registry import all_rules
from gpulint.source import SourceError, decode_source

RULES = all_rules()

# Statements that real training loops contain: some trigger fixes (boolean-mask writes, blocking copies,
# factory-then-move, deprecated AMP, unfused optimizers), some are neutral look-alikes.
LOOP_STATEMENTS = [
    "x = x.to(device)",
    "y = y.cuda()",
    "scores[pad] = float('-inf')",
    "target[done] = reward[done]",
    "loss = criterion(model(x), y)",
    "loss.backward()",
    "optimizer.step()",
    "optimizer.zero_grad()",
    "total += loss.item()",
    "buf = torch.zeros(x.shape[0], 4).to(device)",
    "mask = torch.arange(10).cuda()",
    "print(loss)  # a comment with x[mask] = 0 in it",
    "pass",
    "h = torch.where(pad, h, 0.0)",
    "logits = torch.randn(8, 10, device='cuda')\nlogits[logits < -1e4] = -1e4",
    "h = torch.randn(8, 10, device='cuda')\nh[h.isnan()] = 0.0",
    "probs = torch.rand(8, 10, device='cuda')\nout = torch.zeros_like(probs)\nknown = probs > 0.5\n"
    "out[known] = probs[known]",
    "att = torch.randn(4, 4, device='cuda')\natt[att == 0] = float('-inf')  # padding",
    "with torch.cuda.amp.autocast():\n    out = model(x)",
]
HEADERS = [
    "import torch\n",
    "import torch\nimport torch.nn as nn\n",
    "# -*- coding: utf-8 -*-\nimport torch as th\ntorch = th\n",
    "from torch import optim\nimport torch\n",
]
SETUP = [
    "device = 'cuda'\n",
    "model = Net().cuda()\n",
    "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n",
    "loader = torch.utils.data.DataLoader(ds, batch_size=32)\n",
    "scaler = torch.cuda.amp.GradScaler()\n",
    "def loaders():\n    return torch.utils.data.DataLoader(ds)\n",  # GPU010's fix adds is_available()
    "make = lambda d: torch.utils.data.DataLoader(d)\n",
]


@st.composite
def training_scripts(draw) -> str:
    header = draw(st.sampled_from(HEADERS))
    setup = "".join(draw(st.lists(st.sampled_from(SETUP), max_size=4)))
    body = draw(st.lists(st.sampled_from(LOOP_STATEMENTS), min_size=1, max_size=8))
    loop = "for x, y in loader:\n" + textwrap.indent("\n".join(body), "    ") + "\n"
    if draw(st.booleans()):  # the same loop inside a function, one level deeper
        loop = "def train(model, loader, optimizer, criterion, device, pad, done, reward):\n" + \
            textwrap.indent(loop, "    ")
    text = header + setup + loop
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    if draw(st.booleans()):
        text = text.rstrip("\r\n")  # no final newline
    return text


# Derandomized so that CI is reproducible; cases that random sweeps found are pinned below with @example.
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(training_scripts())
# GPU022's `torch.amp.GradScaler("cuda")` once made the fixed file a CUDA program, so `check` then found GPU032
@example("import torch\noptimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
         "scaler = torch.cuda.amp.GradScaler()\nfor x, y in loader:\n    x = x.to(device)\n")
def test_fixed_code_compiles_and_converges(text):
    outcome = fix_text(text, "train.py", RULES, min_safety=Safety.UNSAFE)
    if outcome.error is not None:  # refused: the file is left exactly as it was, and the rule is named
        assert outcome.text == text and "GPU" in outcome.error
        return
    assert validate(outcome.text, "train.py") is None
    again = fix_text(outcome.text, "train.py", RULES, min_safety=Safety.UNSAFE)
    assert again.fixed == [] and again.text == outcome.text
    if not outcome.fixed:
        assert outcome.text == text  # byte-identical when nothing applied
    newline = "\r\n" if "\r\n" in text else "\n"
    assert ("\r\n" in outcome.text) == (newline == "\r\n")  # fixes keep the file's line endings


@PROPERTY_SETTINGS
@given(training_scripts())
def test_safe_fixes_are_a_subset_of_unsafe_runs(text):
    safe = fix_text(text, "train.py", RULES, min_safety=Safety.SAFE)
    assert all(d.fix is not None and d.fix.safety is Safety.SAFE for d in safe.fixed)
    if safe.error is None:
        assert validate(safe.text, "train.py") is None


@st.composite
def edits_on(draw, text: str) -> list[Edit]:
    lines = text.split("\n")
    edits = []
    for _ in range(draw(st.integers(0, 6))):
        line = draw(st.integers(1, len(lines)))
        start = draw(st.integers(1, len(lines[line - 1]) + 1))
        end = draw(st.integers(start, len(lines[line - 1]) + 1))
        edits.append(Edit(Position(line, start), Position(line, end), draw(st.text("ab()\n ", max_size=5))))
    return edits


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_non_overlapping_edits_only_change_their_spans(data):
    text = data.draw(st.text("xyz =()\n", min_size=1, max_size=60))
    edits = data.draw(edits_on(text))
    from gpulint.diagnostics import Diagnostic, Fix, Severity

    diagnostics = [Diagnostic("f.py", e.start, e.end, "GPU000", "n", "m", Severity.WARNING,
                              Fix("t", Safety.SAFE, (e,))) for e in edits]
    chosen = [d.fix.edits[0] for d in choose_non_overlapping(diagnostics)]
    for i, a in enumerate(chosen):  # what was chosen never overlaps (insertions at distinct points)
        for b in chosen[i + 1:]:
            assert a == b or a.end <= b.start or b.end <= a.start
            assert not (a.is_insertion and b.is_insertion and a.start == b.start and a != b)
    result = apply_edits(text, chosen)
    # Everything before the first edit and after the last one is untouched.
    if chosen:
        lines = text.split("\n")
        first = min(chosen, key=lambda e: e.start).start
        last = max(chosen, key=lambda e: e.end).end
        prefix = "\n".join(lines[:first.line - 1] + [lines[first.line - 1][:first.col - 1]])
        suffix = "\n".join([lines[last.line - 1][last.col - 1:]] + lines[last.line:])
        assert result.startswith(prefix) and result.endswith(suffix)
    else:
        assert result == text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.sampled_from(["utf-8", "latin-1"]), st.booleans(), st.booleans())
def test_decoding_and_reencoding_gives_back_the_same_bytes(text, encoding, bom, crlf):
    if crlf:
        text = text.replace("\n", "\r\n")
    cookie = f"# -*- coding: {encoding} -*-\n" if encoding != "utf-8" else ""
    try:
        raw = (cookie + text).encode(encoding)
    except UnicodeEncodeError:
        return
    if bom and encoding == "utf-8":
        raw = b"\xef\xbb\xbf" + raw
    try:
        source = decode_source(raw, Path("f.py"))
    except SourceError:  # undecodable input is reported, never mangled: nothing to round-trip
        return
    assert source.encode(source.text) == raw
