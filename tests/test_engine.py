"""Shared analyses, the one-traversal engine, and guarantees such as "check never imports torch"."""

import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from gpulint.analysis import HotKind, analyze
from gpulint.engine import lint_text
from gpulint.registry import SelectorError, all_rules, rule_by_code, select_rules


def _analysis(code: str):
    module = cst.parse_module(textwrap.dedent(code))
    return module, analyze(module)


@pytest.mark.parametrize(("code", "expr", "expected"), [
    ("import torch as t\n", "t.nn.functional.softmax", "torch.nn.functional.softmax"),
    ("from torch.utils.data import DataLoader as DL\n", "DL", "torch.utils.data.DataLoader"),
    ("import torch.nn.functional as F\n", "F.relu", "torch.nn.functional.relu"),
    ("from torch import nn\n", "nn.Linear", "torch.nn.Linear"),
    ("import torch.nn\n", "torch.nn.Linear", "torch.nn.Linear"),
    ("import numpy as np\n", "torch.zeros", None),
])
def test_qualified_names_follow_aliases(code, expr, expected):
    _, analysis = _analysis(code)
    assert analysis.qualname(cst.parse_expression(expr)) == expected


@pytest.mark.parametrize(("deprecated", "replacement"), [
    ("scaler = torch.cuda.amp.GradScaler()\n", 'scaler = torch.amp.GradScaler("cuda")\n'),
    ("from torch.cuda.amp import autocast\nwith autocast():\n    pass\n",
     'with torch.amp.autocast("cuda"):\n    pass\n'),
    ("@torch.cuda.amp.custom_fwd\ndef f(ctx, x):\n    pass\n",
     '@torch.amp.custom_fwd(device_type="cuda")\ndef f(ctx, x):\n    pass\n'),
])
def test_deprecated_amp_api_is_as_much_cuda_evidence_as_its_replacement(deprecated, replacement):
    """GPU022's rewrite must not turn a file into a CUDA program: the CUDA-only rules would fire only after `fix`."""
    _, before = _analysis("import torch\n" + deprecated)
    _, after = _analysis("import torch\n" + replacement)
    assert before.cuda_evidence and after.cuda_evidence


def test_pin_memory_if_available_is_not_cuda_evidence():
    """GPU010 writes `pin_memory=torch.cuda.is_available()`: if that made the file (or, through the text search,
    the program) a CUDA program, the next `fix` run would find loaders and optimizers the first run did not."""
    from gpulint.runner import program_facts
    from gpulint.source import decode_source

    pinned = "import torch\nloader = DataLoader(ds, pin_memory=torch.cuda.is_available())\n"
    asked = "import torch\nuse_gpu = torch.cuda.is_available()\n"
    assert not _analysis(pinned)[1].maybe_cuda_evidence and _analysis(asked)[1].maybe_cuda_evidence
    facts = [program_facts([("t.py", decode_source(text.encode(), Path("t.py")))]) for text in (pinned, asked)]
    assert [f.maybe_cuda_evidence for f in facts] == [False, True]


def test_parse_skips_node_validation_only_while_parsing():
    from gpulint.engine import parse

    source = "import torch\nx = torch.zeros(3, device='cuda')  # c\nif x.any():\n    y = [i for i in x]\n"
    assert parse(source).deep_equals(cst.parse_module(source)) and parse(source).code == source
    with pytest.raises(cst.ParserSyntaxError):
        parse("def f(:\n")
    with pytest.raises(cst.CSTValidationError):  # nodes that fixes build are still checked
        cst.Name("1abc")


def _hot_kinds(code: str) -> dict[str, HotKind]:
    module, analysis = _analysis(code)
    names = {}
    for node_id, kind in analysis.hot.items():
        for fn_defs in analysis.functions.values():
            for fn in fn_defs:
                if id(fn) == node_id:
                    names[fn.name.value] = kind
    names["<loops>"] = sorted(k.value for k in analysis.hot.values() if k is HotKind.STEP_LOOP)
    return names


def test_hot_regions():
    kinds = _hot_kinds("""
        import torch
        import torch.nn as nn

        class Base(nn.Module):
            pass

        class Net(Base):  # a Module through a project base class
            def forward(self, x):
                return self.encode(x)

            def helper(self, x):
                return x

            def encode(self, x):  # called from forward: per-forward too (catalog §0.3 d)
                return x

        @torch.compile
        def compiled(x):
            return x

        def train_step(model, batch, opt):
            loss = model(batch).sum()
            loss.backward()
            opt.step()

        def train(model, loader, opt):
            for epoch in range(3):
                for batch in loader:
                    train_step(model, batch, opt)
                print("epoch done")
    """)
    assert kinds["forward"] is HotKind.FORWARD
    assert "helper" not in kinds
    assert kinds["encode"] is HotKind.FORWARD
    assert kinds["compiled"] is HotKind.COMPILED
    assert kinds["train_step"] is HotKind.STEP_FUNCTION
    # only the inner loop calls the step; the epoch loop's own statements are not per-step
    assert kinds["<loops>"] == ["step-loop"]


def test_scheduler_step_is_not_a_training_step():
    kinds = _hot_kinds("""
        for epoch in range(10):
            scheduler.step()
            env.step(action)
    """)
    assert kinds["<loops>"] == []


def test_syntax_error_is_a_finding_not_a_crash():
    result = lint_text("def f(:\n    pass\n", "bad.py", all_rules())
    assert [d.code for d in result.diagnostics] == ["GPU900"]
    assert result.diagnostics[0].line == 1


def test_selectors():
    assert {r.code for r in select_rules(["GPU011"])} == {"GPU011"}
    assert "GPU011" not in {r.code for r in select_rules(None, ignore=["GPU01"])}
    # the more specific selector wins, as in ruff
    assert "GPU011" in {r.code for r in select_rules(["GPU01"], ignore=["GPU0"])}
    assert "GPU011" not in {r.code for r in select_rules(["GPU0"], ignore=["GPU01"])}
    with pytest.raises(SelectorError, match="did you mean 'GPU011'"):
        select_rules(["GPU0111"])


def test_check_never_imports_torch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nfor x in loader:\n    x = x.to('cuda')\n    x.sum().backward()\n    opt.step()\n")
    probe = (
        "import sys\n"
        "from gpulint.cli import main\n"
        f"main(['check', {str(script)!r}])\n"
        f"main(['fix', {str(script)!r}])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('no torch')\n"
    )
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert "no torch" in completed.stdout, completed.stderr


def test_files_no_rule_can_match_are_not_parsed_by_libcst(monkeypatch):
    import gpulint.engine as engine

    def no_parse(text):
        raise AssertionError("libcst parse of a file that no rule can match")

    monkeypatch.setattr(engine, "parse", no_parse)
    assert lint_text("def helper(a, b):\n    return a + b\n", "util.py", all_rules()).diagnostics == []
    broken = lint_text("def helper(a, b:\n    return a\n", "util.py", all_rules()).diagnostics
    assert [d.code for d in broken] == ["GPU900"]


HOGWILD_AGENT = textwrap.dedent("""
    import torch.multiprocessing as mp
    from worker import Worker

    def main(net_cls, n_workers):
        shared = net_cls(){move}
        shared.share_memory()
        workers = [Worker(shared, i) for i in range(n_workers)]
        for w in workers:
            w.start()
""")
HOGWILD_WORKER = textwrap.dedent("""
    import torch
    import torch.multiprocessing as mp

    class Worker(mp.Process):
        def __init__(self, shared, rank):
            super().__init__()
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.shared = shared
            self.optimizer = torch.optim.Adam(shared.parameters(), lr=1e-3)

        def run(self):
            for step in range(100000):
                state = torch.FloatTensor(self.env.observe()).to(self.device)
                loss = self.shared(state).sum()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                print(loss.item())
""")


@pytest.mark.parametrize(("move", "findings"), [
    ("", False),
    (".cuda()", True),
    # IMPALA: CPU actors share one copy, the learner trains another on the GPU (built over several lines)
    ("\n    learner_model = net_cls(\n        n_workers,\n    ).to(device=torch.device('cuda'))", True),
])
def test_hogwild_cpu_workers_get_no_gpu_findings(tmp_path: Path, move: str, findings: bool):
    """A3C's Hogwild workers train a network in shared memory on the CPU: its `.to(self.device)` copies nothing.
    Moving the shared network, or another network of the program, to a GPU makes it a GPU program again."""
    from gpulint.runner import run

    (tmp_path / "a3c.py").write_text(HOGWILD_AGENT.format(move=move))
    (tmp_path / "worker.py").write_text(HOGWILD_WORKER)
    found = run([str(tmp_path)], all_rules(), jobs=1).diagnostics
    assert bool([d for d in found if d.path.endswith("worker.py")]) is findings


def test_loader_handed_to_another_files_epoch_function_keeps_its_workers(tmp_path: Path):
    """The epoch loop hands the loader to `train_one_epoch` in another file; setting the dataset's transform once,
    before the loop, changes nothing the workers need to re-read: GPU051 still applies."""
    from gpulint.runner import run

    (tmp_path / "engine.py").write_text(textwrap.dedent("""
        def train_one_epoch(model, data_loader, optimizer, device):
            for samples, targets in data_loader:
                loss = model(samples.to(device, non_blocking=True)).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """))
    (tmp_path / "main.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader
        from engine import train_one_epoch

        def main(args, dataset, model, augment):
            device = torch.device("cuda")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = DataLoader(dataset, batch_size=64, num_workers=8, pin_memory=True)
            loader.dataset.transform = augment
            for epoch in range(args.epochs):
                train_one_epoch(model, loader, optimizer, device)
    """))
    found = run([str(tmp_path)], [rule_by_code("GPU051")], jobs=1).diagnostics
    assert [(Path(d.path).name, d.line) for d in found] == [("main.py", 9)]



_POSITIONS_SOURCE = (
    "# header comment\n"
    "import torch\n"
    "\n"
    "def helper(x):\n"
    "    y = x.item()  # a sync\n"
    "    return y\n"
    "\n"
    "@torch.no_grad()\n"
    "def evaluate(net, batch):\n"
    "    return net(batch).sum()\n"
    "\n"
    "x = 1; z = 2\n"
    "x = 1; z = 2\n"
)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_positions_of_a_few_nodes_match_the_whole_files_code_generation(newline: str):
    """Finding locations come from generating only the statements that hold the reported nodes: they must be the
    ones the whole module's code generation gives, for syntax and token nodes, after decorators and CRLF lines;
    a statement written twice cannot be placed by its text and falls back to the whole generation."""
    from gpulint.analysis import walk
    from gpulint.engine import _every_node, _positions_by_statement, node_positions

    text = _POSITIONS_SOURCE.replace("\n", newline)
    module = cst.parse_module(text)
    whole = node_positions(module)
    helper, evaluate = module.body[1], module.body[2]
    item_call = next(n for n in walk(helper) if isinstance(n, cst.Call))
    returned = next(n for n in walk(evaluate) if isinstance(n, cst.Return))
    newline_token = next(n for n in _every_node(evaluate) if isinstance(n, cst.Newline))
    wanted = [item_call, returned, newline_token, evaluate.decorators[0]]
    placed = _positions_by_statement(module, wanted, text)
    assert placed is not None
    assert [placed[id(n)] for n in wanted] == [whole[id(n)] for n in wanted]
    assert placed[id(item_call)][:2] == (5, 8)
    assert id(module.body[0]) not in placed  # the import statement was not generated
    assert _positions_by_statement(module, [module.body[3]], text) is None  # `x = 1; z = 2` twice
    assert node_positions(module, [module.body[3]], text)[id(module.body[3])] == whole[id(module.body[3])]
