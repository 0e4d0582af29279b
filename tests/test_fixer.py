"""The fixer: conflicts, convergence, the invalid-code guard, and byte-faithful writes."""

import stat

import libcst as cst
import pytest

from gpulint import Invalid, Rule, Safety, Valid
from gpulint.fixer import fix_text
from gpulint.registry import rule_by_code
from gpulint.runner import run
from gpulint.source import SourceError, read_source, write_source_atomically

H2D = rule_by_code("GPU011")
DOC = """
    ## What it does
    Test rule.
    ## Why is this slow
    ## Example
    ## Use instead
    ## Fix safety
"""
TRAIN = "for x in loader:\n    x = x.to('cuda')\n    x.sum().backward()\n    opt.step()\n"


class DoubleLog(Rule):
    __doc__ = DOC
    code, name, message, fix_title, safety = "GPU990", "double-log", "log1p", "use log1p", Safety.SAFE
    examples = [Valid("a\n"), Invalid("torch.log(1 + x)\n", fixed="torch.log1p(x)\n")]

    def visit_Call(self, node: cst.Call) -> None:
        arg = node.args[0].value if node.args else None
        if cst.ensure_type(node.func, cst.Attribute).attr.value == "log" and isinstance(arg, cst.BinaryOperation):
            replacement = node.with_changes(func=node.func.with_changes(attr=cst.Name("log1p")),
                                            args=[cst.Arg(arg.right)])
            self.report(node, replacement=replacement)


class BreaksCode(Rule):
    __doc__ = DOC
    code, name, message, fix_title, safety = "GPU991", "breaks-code", "m", "t", Safety.SAFE
    examples = [Valid("a\n"), Invalid("x\n", fixed="x\n")]

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == "target":
            self.report(node, replacement="target +")


class NeedsImport(Rule):
    __doc__ = DOC
    code, name, message, fix_title, safety = "GPU992", "needs-import", "m", "t", Safety.SAFE
    examples = [Valid("a\n"), Invalid("x\n", fixed="x\n")]

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "where":
            spelled, imports = self.ctx.spell("torch.where")
            self.report(node.func, replacement=spelled, imports=imports)


def test_nested_fixes_converge_in_one_run():
    outcome = fix_text("y = torch.log(1 + torch.log(1 + x))\n", "t.py", [DoubleLog])
    assert outcome.text == "y = torch.log1p(torch.log1p(x))\n"
    assert len(outcome.fixed) == 2 and outcome.remaining == []


def test_fix_that_breaks_code_leaves_file_untouched_and_names_rule():
    source = "a = target\n"
    outcome = fix_text(source, "t.py", [BreaksCode])
    assert outcome.text == source
    assert "GPU991" in outcome.error and not outcome.changed


def test_import_added_once_and_alias_respected():
    outcome = fix_text('"""doc."""\nfrom __future__ import annotations\na = where(m, x, y)\nb = where(m, y, x)\n',
                       "t.py", [NeedsImport])
    assert outcome.text == ('"""doc."""\nfrom __future__ import annotations\nimport torch\n'
                            'a = torch.where(m, x, y)\nb = torch.where(m, y, x)\n')
    aliased = fix_text("import torch as t\na = where(m, x, y)\n", "t.py", [NeedsImport])
    assert aliased.text == "import torch as t\na = t.where(m, x, y)\n"


def test_unsafe_and_suggest_levels():
    class Unsafe(DoubleLog):
        __doc__ = DOC
        code, name, safety = "GPU993", "unsafe-log", Safety.UNSAFE
    assert fix_text("torch.log(1 + x)\n", "t.py", [Unsafe]).text == "torch.log(1 + x)\n"
    assert fix_text("torch.log(1 + x)\n", "t.py", [Unsafe], min_safety=Safety.UNSAFE).text == "torch.log1p(x)\n"


@pytest.mark.parametrize(("raw", "expected"), [
    (b"\xef\xbb\xbf" + TRAIN.encode(), b"\xef\xbb\xbf" + TRAIN.replace("'cuda')", "'cuda', non_blocking=True)").encode()),
    (TRAIN.replace("\n", "\r\n").encode(),
     TRAIN.replace("'cuda')", "'cuda', non_blocking=True)").replace("\n", "\r\n").encode()),
    (("# -*- coding: latin-1 -*-\n# caf\xe9\n" + TRAIN).encode("latin-1"),
     ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + TRAIN.replace("'cuda')", "'cuda', non_blocking=True)")).encode("latin-1")),
    (TRAIN.rstrip("\n").encode(), TRAIN.rstrip("\n").replace("'cuda')", "'cuda', non_blocking=True)").encode()),
])
def test_apply_keeps_encoding_bom_line_endings_and_final_newline(tmp_path, raw, expected):
    path = tmp_path / "train.py"
    path.write_bytes(raw)
    path.chmod(0o640)
    result = run([str(path)], [H2D], fix=True, write=True)
    assert result.files[0].written
    assert path.read_bytes() == expected
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    again = run([str(path)], [H2D], fix=True, write=True)
    assert not again.files[0].written and path.read_bytes() == expected


def test_file_changed_between_read_and_write_is_not_overwritten(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    source = read_source(path)
    path.write_text(TRAIN + "# edited by someone else\n")
    with pytest.raises(SourceError, match="changed on disk"):
        write_source_atomically(source, "x = 1\n")
    assert path.read_text().endswith("# edited by someone else\n")


def test_read_only_file_is_reported_and_never_written(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    path.chmod(0o444)
    result = run([str(path)], [H2D], fix=True, write=True)
    assert "read-only" in result.files[0].error
    assert not result.files[0].written and path.read_text() == TRAIN


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (  # the last argument's comment stays on its line
            "opt = torch.optim.AdamW(\n    params,\n    weight_decay=0,  # we do not apply weight decay\n)\n",
            "opt = torch.optim.AdamW(\n    params,\n    weight_decay=0,  # we do not apply weight decay\n"
            "    fused=True,\n)\n",
        ),
        (  # the second-to-last argument's comment is not copied onto the last line
            "opt = f(\n    params,  # the params\n    lr=1e-3,\n)\n",
            "opt = f(\n    params,  # the params\n    lr=1e-3,\n    fused=True,\n)\n",
        ),
        (  # a single argument; the comment after `(` stays there
            "opt = f(  # build\n    params,  # the params\n)\n",
            "opt = f(  # build\n    params,  # the params\n    fused=True,\n)\n",
        ),
        (  # comment lines before `)` stay before `)`
            "opt = f(\n    params,\n    lr=1e-3,\n    # end\n)\n",
            "opt = f(\n    params,\n    lr=1e-3,\n    fused=True,\n    # end\n)\n",
        ),
        ("opt = f(params, lr=1e-3)\n", "opt = f(params, lr=1e-3, fused=True)\n"),
    ],
)
def test_add_keyword_keeps_comments_on_their_lines(source, expected):
    from gpulint.builders import add_keyword

    class AddFused(cst.CSTTransformer):
        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
            return add_keyword(updated_node, "fused", "True")

    assert cst.parse_module(source).visit(AddFused()).code == expected


class PinsWhenCuda(Rule):
    """Reports `load(...)` when the file shows CUDA, and `export(...)` always; the fix inserts CUDA evidence."""
    __doc__ = DOC
    code, name, message, fix_title, safety = "GPU989", "pins-when-cuda", "m", "t", Safety.SAFE
    examples = [Valid("a\n"), Invalid("x\n", fixed="x\n")]

    def visit_Call(self, node: cst.Call) -> None:
        if not isinstance(node.func, cst.Name) or node.args[-1].keyword is not None:
            return
        evidence = self.ctx.analysis.cuda_evidence or self.ctx.analysis.maybe_cuda_evidence
        if node.func.value == "export" or (node.func.value == "load" and evidence):
            self.report(node, replacement=f"{node.func.value}(x, pin=torch.cuda.is_available())")


def test_text_inserted_by_a_fix_is_not_evidence_for_later_passes():
    """`pin_memory=torch.cuda.is_available()` added by one fix must not make the file a CUDA program for the next
    pass: `fix` would then rewrite code that `check` never reported."""
    source = "import torch\nexport(x)\nload(x)\n"
    outcome = fix_text(source, "t.py", [PinsWhenCuda])
    assert outcome.text == "import torch\nexport(x, pin=torch.cuda.is_available())\nload(x)\n"


def test_a_whole_module_fix_applies_to_a_file_without_a_final_newline():
    """GPU071 rewrites the module (it removes an anomaly-detection switch); the module of a file that ends without
    a line break ends on the line after its last one. The soak run found the fixer raising IndexError there."""
    text = "import torch\ntorch.autograd.set_detect_anomaly(True)\nfor x in loader:\n    model(x).sum().backward()\n# end"
    outcome = fix_text(text, "train.py", [rule_by_code("GPU071")], min_safety=Safety.UNSAFE)
    assert outcome.error is None and "set_detect_anomaly" not in outcome.text and outcome.text.endswith("# end")
