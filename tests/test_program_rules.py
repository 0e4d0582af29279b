"""Rules on multi-file programs: the program-level precision rules (GPU020-GPU025), and rules whose facts come
from another file of the program (GPU070: a network class defined elsewhere).

The program is every file of one run. Each `fixtures/<code>/programs/<name>/` folder holds one program as
`*.py.txt` files (hidden from the per-file fixture tests, which lint each `.py` alone); it is copied to a
temporary folder and linted in one run, and the findings must match the `# expect:` comments.
"""

from collections import Counter
from pathlib import Path

import pytest

from gpulint.engine import lint_text
from gpulint.registry import rule_by_code
from gpulint.runner import run
from gpulint.semantic.callgraph import CallGraph, Frequency
from gpulint.testing import FIXTURES, expected_findings

CODES = ("GPU020", "GPU021", "GPU022", "GPU023", "GPU024", "GPU025")
PROGRAMS = sorted(p for p in FIXTURES.glob("GPU0*/programs/*") if p.is_dir())


def _materialize(program: Path, target: Path) -> dict[str, str]:
    """Copy the program's `x.py.txt` files to `target` as `x.py`, and its other files (a launch script) as they are;
    relative path -> text of the Python files."""
    texts = {}
    for source in sorted(p for p in program.rglob("*") if p.is_file()):
        python = source.name.endswith(".py.txt")
        relative = source.relative_to(program).with_suffix("") if python else source.relative_to(program)
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        text = source.read_text(encoding="utf-8")
        destination.write_text(text, encoding="utf-8")
        if python:
            texts[relative.as_posix()] = text
    return texts


def _findings(target: Path, *, fix: bool = False, codes: tuple[str, ...] = CODES):
    rules = [rule_by_code(code) for code in codes]
    result = run([str(target)], rules, fix=fix, jobs=1)
    assert not result.errors, result.errors
    return result


def test_programs_exist():
    assert PROGRAMS, "fixtures/<code>/programs/ holds the multi-file programs"


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_program(program: Path, tmp_path: Path):
    texts = _materialize(program, tmp_path)
    found = Counter()
    code = program.parent.parent.name
    for diagnostic in _findings(tmp_path, codes=CODES if code in CODES else (code,)).diagnostics:
        relative = Path(diagnostic.path).resolve().relative_to(tmp_path.resolve()).as_posix()
        found[(relative, diagnostic.line, diagnostic.code)] += 1
    expected = Counter()
    for relative, text in texts.items():
        for (line, code), count in expected_findings(text).items():
            expected[(relative, line, code)] += count
    assert found == expected


def test_tf32_set_in_an_imported_module_counts_even_when_only_the_script_is_named(tmp_path: Path):
    """`gpulint check train.py` (or pre-commit with only train.py changed) reads the modules train.py imports
    as context: the same program as `gpulint check .`. A text linted with no files around it has no context."""
    texts = _materialize(FIXTURES / "GPU020" / "programs" / "tf32_in_module", tmp_path)
    alone = lint_text(texts["train.py"], "train.py", [rule_by_code("GPU020")]).diagnostics
    assert [d.code for d in alone] == ["GPU020"]
    named = run([str(tmp_path / "train.py")], [rule_by_code("GPU020")], jobs=1)
    assert [d.code for d in named.diagnostics] == []
    together = _findings(tmp_path).diagnostics
    assert not [d for d in together if d.code == "GPU020"]


def test_program_fix_inserts_tf32_after_the_imports(tmp_path: Path):
    _materialize(FIXTURES / "GPU020" / "programs" / "independent_scripts", tmp_path)
    result = run([str(tmp_path)], [rule_by_code("GPU020")], fix=True, min_safety=rule_by_code("GPU020").safety,
                 jobs=1)
    fixed = {Path(f.path).resolve().relative_to(tmp_path.resolve()).as_posix(): f.fix.text
             for f in result.files if f.fix is not None and f.fix.changed}
    assert list(fixed) == ["plain/train.py"]
    assert 'import torchvision\ntorch.set_float32_matmul_precision("high")\n' in fixed["plain/train.py"]


def test_fix_goes_into_the_main_guard_when_the_entry_script_is_imported(tmp_path: Path):
    (tmp_path / "train.py").write_text(
        "import torch\nimport torchvision\n\n\ndef main():\n    model = torchvision.models.resnet50().cuda()\n"
        "    for x, y in loader:\n        model(x.cuda()).sum().backward()\n        opt.step()\n\n\n"
        "if __name__ == \"__main__\":\n    # run\n    main()\n", encoding="utf-8")
    (tmp_path / "sweep.py").write_text("from train import main\n\nfor lr in (0.1, 0.01):\n    main()\n",
                                       encoding="utf-8")
    rule = rule_by_code("GPU020")
    result = run([str(tmp_path)], [rule], fix=True, min_safety=rule.safety, jobs=1)
    fixed = [f.fix.text for f in result.files if f.fix is not None and f.fix.changed]
    assert len(fixed) == 1
    assert fixed[0].startswith("import torch\nimport torchvision\n\n\ndef main():")  # nothing after the imports
    assert fixed[0].endswith('if __name__ == "__main__":\n    torch.set_float32_matmul_precision("high")\n'
                             '    # run\n    main()\n')


CPU_SCRIPT = """\
import torch
import torchvision
data = torchvision.datasets.MNIST("data", train=True, download=True, transform=torchvision.transforms.ToTensor())
loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True)
model = torch.nn.Linear(784, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x.view(-1, 784)), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
GPU_SCRIPT = CPU_SCRIPT.replace("model = torch.nn.Linear(784, 10)", "model = torch.nn.Linear(784, 10).cuda()") \
    .replace("model(x.view(-1, 784))", "model(x.view(-1, 784).cuda(non_blocking=True))") \
    .replace(", y)", ", y.cuda(non_blocking=True))")


def test_an_unrelated_cuda_script_lends_no_cuda_evidence(tmp_path: Path):
    """Two tutorial scripts in sibling folders, one on the CPU: its DataLoader is not in a CUDA program."""
    (tmp_path / "basics").mkdir()
    (tmp_path / "basics" / "main.py").write_text(CPU_SCRIPT)
    (tmp_path / "on_gpu").mkdir()
    (tmp_path / "on_gpu" / "main.py").write_text(GPU_SCRIPT)
    rules = [rule_by_code(code) for code in ("GPU010", "GPU050")]
    result = run([str(tmp_path)], rules, jobs=1)
    flagged = {(Path(d.path).parent.name, d.code) for d in result.diagnostics}
    assert flagged == {("on_gpu", "GPU050")}  # (MNIST batches without workers are too small for GPU010)


def test_a_module_imported_by_a_cuda_script_is_in_a_cuda_program(tmp_path: Path):
    (tmp_path / "data.py").write_text(
        "import torch\n"
        "def make_loader(ds):\n"
        "    return torch.utils.data.DataLoader(ds, batch_size=64, num_workers=4)\n")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom data import make_loader\nmodel = Net().cuda()\n"
        "for x, y in make_loader(ds):\n    model(x.cuda(non_blocking=True)).sum().backward()\n")
    result = run([str(tmp_path)], [rule_by_code("GPU010")], jobs=1)
    assert [(Path(d.path).name, d.code) for d in result.diagnostics] == [("data.py", "GPU010")]


def test_cudnn_benchmark_is_reported_where_the_loop_is_when_the_conv_net_is_built_elsewhere(tmp_path: Path):
    """GPU033: the training file names neither `Conv` nor `models`; the network comes from a helper module."""
    (tmp_path / "nets.py").write_text("import torch.nn as nn\n\n\ndef build():\n"
                                      "    return nn.Sequential(nn.Conv2d(3, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3))\n")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom nets import build\n\nnet = build().cuda()\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x, y in loader:\n    net(x.cuda()).sum().backward()\n    opt.step()\n")
    result = run([str(tmp_path)], [rule_by_code("GPU033")], jobs=1)
    assert [(Path(d.path).name, d.line) for d in result.diagnostics] == [("train.py", 6)]


def test_data_parallel_inside_a_module_is_reported_when_another_file_trains_it(tmp_path: Path):
    """GPU060: `self.body = nn.DataParallel(Body())` in a model's `__init__`; the training loop is elsewhere."""
    (tmp_path / "models.py").write_text(
        "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.body = nn.DataParallel(nn.Linear(512, 512))\n\n    def forward(self, x):\n"
        "        return self.body(x)\n")
    (tmp_path / "infer.py").write_text("import torch\nfrom models import Net\n\nnet = Net().cuda().eval()\n"
                                       "with torch.no_grad():\n    print(net(torch.randn(8, 512).cuda()))\n")
    rule = rule_by_code("GPU060")
    assert run([str(tmp_path)], [rule], jobs=1).diagnostics == []  # only used for inference
    (tmp_path / "train.py").write_text(
        "import torch\nfrom models import Net\n\nnet = Net().cuda()\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x in loader:\n    net(x.cuda()).sum().backward()\n    opt.step()\n")
    found = run([str(tmp_path)], [rule], jobs=1).diagnostics
    assert [(Path(d.path).name, d.line) for d in found] == [("models.py", 7)]


def test_a_dataset_class_is_read_from_the_nearest_definition(tmp_path: Path):
    """GPU050 decides from the dataset class whether loading costs anything; another file of the run defining a
    class of the same name (a truncated copy, another project) sorts first but must not be the one read."""
    (tmp_path / "aa_other").mkdir()
    (tmp_path / "aa_other" / "datautils.py").write_text(
        "import torch\nfrom torch.utils.data import Dataset\n\n\nclass MyTrainDataset(Dataset):\n"
        "    def __getitem__(self, index):\n        return torch.load(f'sample{index}.pt')\n")
    (tmp_path / "ddp").mkdir()
    (tmp_path / "ddp" / "datautils.py").write_text(
        "import torch\nfrom torch.utils.data import Dataset\n\n\nclass MyTrainDataset(Dataset):\n"
        "    def __init__(self, size):\n        self.data = [torch.rand(20) for _ in range(size)]\n\n"
        "    def __getitem__(self, index):\n        return self.data[index]\n")
    (tmp_path / "ddp" / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\nfrom datautils import MyTrainDataset\n\n"
        "model = torch.nn.Linear(20, 1).cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(MyTrainDataset(2048), batch_size=32, pin_memory=True)\n"
        "for epoch in range(10):\n    for x in loader:\n        model(x.cuda()).sum().backward()\n        opt.step()\n")
    rule = rule_by_code("GPU050")
    assert run([str(tmp_path)], [rule], jobs=1).diagnostics == []  # the in-memory dataset beside it: cheap


def _agent_package(root: Path) -> None:
    """An RL package whose agents are handed to a generic loop (`run(DQNLearner(cfg))`), re-exported through
    `from .x import *`, with a `to_device()` helper that uploads its argument, selecting `'cuda:%d' % gpu`."""
    package = root / "rlkit"
    package.mkdir()
    (package / "__init__.py").write_text("from .helpers import *\nfrom .learners import *\n")
    (package / "helpers.py").write_text(
        "import numpy as np\nimport torch\n\n\nclass Settings:\n    device = torch.device('cpu')\n\n\n"
        "def use_gpu(index):\n    Settings.device = torch.device('cuda:%d' % index)\n\n\n"
        "def to_device(values):\n    if isinstance(values, torch.Tensor):\n        return values\n"
        "    values = np.asarray(values, dtype=np.float32)\n    return torch.from_numpy(values).to(Settings.device)\n\n\n"
        "def run(learner):\n    while learner.steps < learner.limit:\n        learner.step()\n")
    (package / "learners.py").write_text(
        "import torch\nfrom .helpers import to_device\n\n\nclass DQNLearner:\n    def __init__(self, cfg):\n"
        "        self.net, self.env, self.buffer = cfg.net(), cfg.env(), cfg.buffer()\n"
        "        self.opt = torch.optim.Adam(self.net.parameters())\n        self.steps, self.limit = 0, cfg.limit\n\n"
        "    def step(self):\n        obs, reward, done = self.env.step(self.env.action_space.sample())\n"
        "        self.buffer.add(obs, reward, done)\n        states, rewards = self.buffer.sample()\n"
        "        states = to_device(states)\n        rewards = to_device(rewards)\n"
        "        loss = (self.net(states).max(1)[0] - rewards).pow(2).mean()\n"
        "        self.opt.zero_grad()\n        loss.backward()\n        self.opt.step()\n        self.steps += 1\n")
    (root / "main.py").write_text(
        "from rlkit import *\n\n\ndef train(cfg):\n    use_gpu(0)\n    run(DQNLearner(cfg))\n")


def test_an_uploading_helper_is_reported_where_a_learner_handed_to_a_generic_loop_calls_it(tmp_path: Path):
    """GPU013 through three hops nobody writes in one file: `run(DQNLearner(cfg))` makes `learner.step()` inside
    `run` the learner's `step` (an object passed in), found through `from rlkit import *` re-exports; `step`
    calls `to_device(...)`, a helper returning its argument uploaded to the device, on every training step; the
    device is chosen by `torch.device('cuda:%d' % index)`."""
    _agent_package(tmp_path)
    found = run([str(tmp_path)], [rule_by_code("GPU013")], jobs=1).diagnostics
    assert sorted((Path(d.path).name, d.line) for d in found) == [
        ("helpers.py", 17), ("learners.py", 15), ("learners.py", 16)]
    sources = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.rglob("*.py")}
    graph = CallGraph(sources)
    loop = graph.files["rlkit/helpers.py"].functions["run"]
    site = next(s for s in loop.sites if s.target == ("attr", "learner", "step"))
    assert graph.resolve("rlkit/helpers.py", loop, site.target) == [("rlkit/learners.py", "DQNLearner.step")]
    assert graph.frequency[("rlkit/helpers.py", "to_device")] >= Frequency.PER_STEP


def test_a_memoised_or_consuming_helper_is_not_an_upload_at_its_call_sites(tmp_path: Path):
    """`@lru_cache` helpers copy once per argument; `select_action(state)` uploads its input but returns an
    action: its own line is the copy, its call sites are not."""
    (tmp_path / "train.py").write_text(
        "import functools\nimport numpy as np\nimport torch\n\n\n@functools.lru_cache(maxsize=None)\n"
        "def window(n):\n    return torch.from_numpy(np.hanning(n)).to('cuda')\n\n\n"
        "def select_action(net, state):\n    state = torch.from_numpy(state).to('cuda')\n"
        "    return net(state).argmax().item()\n\n\n"
        "for step in range(1000):\n    action = select_action(net, obs)\n    obs = env.step(action)\n"
        "    loss = net(batch.cuda() * window(64)).sum()\n    loss.backward()\n    optimizer.step()\n")
    found = run([str(tmp_path)], [rule_by_code("GPU013")], jobs=1).diagnostics
    assert [(d.line, d.message.startswith("Host data")) for d in found] == [(12, True)]


LARGE_FP32_STEP = """
import torch
import torch.nn as nn
{extra}
model = nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 2048)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batch_size = 4096
for step in range(1000):
    x = torch.randn(batch_size, 2048, device="cuda")
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize(("extra", "silenced"), [
    ("", False),
    ("# TODO: try bf16 autocast and torch.float64 for the eval", False),  # a comment runs nothing
    ('"""Trains in fp32; the loader yields float64 arrays."""', False),  # nor does a docstring
    ("# torch.backends.cuda.matmul.allow_tf32 = True", False),  # commented out: TF32 stays off
    ("torch.set_default_dtype(torch.float64)", True),
    ("scaler = torch.cuda.amp.GradScaler()", True),
])
def test_precision_evidence_is_read_from_code_not_comments(tmp_path: Path, extra: str, silenced: bool):
    (tmp_path / "train.py").write_text(LARGE_FP32_STEP.format(extra=extra))
    rules = [rule_by_code(code) for code in ("GPU020", "GPU023")]
    codes = {d.code for d in run([str(tmp_path)], rules, jobs=1).diagnostics}
    assert codes == (set() if silenced else {"GPU020", "GPU023"})


RL_TRAINER = """
import gym
import torch
import torch.nn as nn
{network}
num_steps = 1000001  # environment steps, not a sequence length
batch_size = {batch}
net = Net().cuda()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
for step in range(num_steps):
    x = torch.randn(batch_size, 3, 9, 9, device="cuda")
    loss = net(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
RESNET = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 256, 3, padding=1), nn.BatchNorm2d(256), nn.ReLU(),
                                  nn.Conv2d(256, 256, 3, padding=1), nn.BatchNorm2d(256), nn.ReLU())
    def forward(self, x):
        return self.body(x)
"""
MLP = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(243, 256), nn.ReLU(), nn.Linear(256, 4))
    def forward(self, x):
        return self.body(x)
"""


@pytest.mark.parametrize(("network", "batch", "reported"), [(RESNET, 1024, True), (MLP, 256, False)],
                         ids=["resnet-batch-1024", "policy-mlp"])
def test_reinforcement_learning_needs_the_work_estimate_for_autocast(tmp_path: Path, network: str, batch: int,
                                                                    reported: bool):
    """Self-play learners train ResNets on big batches (autocast pays); a policy MLP does not, whatever the
    number of environment steps."""
    (tmp_path / "train.py").write_text(RL_TRAINER.format(network=network, batch=batch))
    result = run([str(tmp_path)], [rule_by_code("GPU023")], jobs=1)
    assert bool(result.diagnostics) is reported


BUFFER = """
import numpy as np
import torch


class ReplayBuffer:
    def __init__(self):
        self.obs, self.rew = [], []

    def sample_batch(self, n):
        idx = np.random.randint(0, len(self.obs), size=n)
        obs = torch.tensor(np.stack([self.obs[i] for i in idx])).float()
        return obs, torch.from_numpy(np.array([self.rew[i] for i in idx]))
"""
LEARNER = """
import ray
import torch
from buffer import ReplayBuffer


def update(model, optimizer, buffer, device):
    obs, rew = {fetch}
    obs, rew = obs.to(device), rew.to(device)
    loss = (model(obs).squeeze(-1) - rew).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train(model, optimizer, buffer, steps):
    device = torch.device("cuda")
    for step in range(steps):
        update(model, optimizer, buffer, device)
"""


@pytest.mark.parametrize("fetch", ["buffer.sample_batch(256)", "ray.get(buffer.sample_batch.remote(256))"],
                         ids=["method", "ray-actor"])
def test_batches_a_sampler_builds_on_the_host_are_host_data_where_they_are_moved(tmp_path: Path, fetch: str):
    """The replay buffer (a Ray actor or a plain object) returns tensors it built on the host: the learner's
    per-step `.to(device)` is a blocking pageable copy."""
    (tmp_path / "buffer.py").write_text(BUFFER)
    (tmp_path / "learner.py").write_text(LEARNER.format(fetch=fetch))
    result = run([str(tmp_path)], [rule_by_code("GPU011")], jobs=1)
    assert sorted((Path(d.path).name, d.line) for d in result.diagnostics) == [("learner.py", 9), ("learner.py", 9)]


def test_torch_reached_through_a_star_import_is_torch(tmp_path: Path):
    """`from utils import *` where utils imports torch: `torch.optim.Adam` in the script is torch's."""
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("import torch\nimport numpy as np\n")
    (tmp_path / "train.py").write_text(
        "from utils import *\n"
        "device = torch.device('cuda')\n"
        "net = torch.nn.Linear(64, 64).to(device)\n"
        "optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)\n"
        "for step in range(100):\n"
        "    loss = net(torch.randn(32, 64, device=device)).pow(2).mean()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n")
    result = run([str(tmp_path)], [rule_by_code("GPU032")], jobs=1)
    assert [(Path(d.path).name, d.line) for d in result.diagnostics] == [("train.py", 4)]


def test_an_import_is_not_resolved_into_a_sibling_project(tmp_path: Path):
    """`from train import train` in a folder without a train.py is not another example folder's train.py (Python
    would not find it there): that script keeps its own TF32 finding. The soak run found one lost beside a truncated
    copy of a script importing `train`."""
    (tmp_path / "snli").mkdir()
    (tmp_path / "snli" / "train.py").write_text(LARGE_FP32_STEP.format(extra=""))
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "train.py").write_text("def train(model):\n    pass\n")
    (tmp_path / "copies").mkdir()
    (tmp_path / "copies" / "main.py").write_text(
        "import torch\nfrom train import train\n\nif __name__ == '__main__':\n    model = torch.nn.Linear(2, 2).half()\n"
        "    train(model)\n")
    result = run([str(tmp_path)], [rule_by_code("GPU020")], jobs=1)
    assert [(Path(d.path).parent.name, Path(d.path).name) for d in result.diagnostics] == [("snli", "train.py")]


def test_a_search_reached_through_a_parameter_is_hot_despite_a_test_mock(tmp_path: Path):
    """The program passes `self.model` (not a plain name) to `run(model, ...)`, the unit tests a mock with its own
    `predict`: the mock must not hide that `model.predict` is the network's helper, run once per simulation;
    its outputs come from `self.forward(x)`, so reading them back is a sync per simulation."""
    (tmp_path / "model.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass BoardNet(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(9, 10)\n\n"
        "    def forward(self, x):\n        return self.fc(x)[:, :9], self.fc(x)[:, 9]\n\n"
        "    def predict(self, board):\n"
        "        x = torch.FloatTensor(board).to('cuda')\n"
        "        with torch.no_grad():\n            pi, v = self.forward(x)\n"
        "        return pi.data.cpu().numpy(), v.item()\n")
    (tmp_path / "search.py").write_text(
        "def run(model, state, simulations):\n    for _ in range(simulations):\n"
        "        priors, value = model.predict(state)\n        state = state.expand(priors, value)\n"
        "    return state\n")
    (tmp_path / "tests.py").write_text(
        "from search import run\n\n\nclass MockModel:\n    def predict(self, board):\n        return [0.5], 0.0\n\n\n"
        "def test_run():\n    run(MockModel(), None, 10)\n")
    (tmp_path / "main.py").write_text(
        "from model import BoardNet\nfrom search import run\n\n\nclass Trainer:\n"
        "    def __init__(self, model):\n        self.model = model.cuda()\n\n"
        "    def play(self, state):\n        return run(self.model, state, 100)\n\n\n"
        "trainer = Trainer(BoardNet())\nwhile True:\n    trainer.play(None)\n")
    result = run([str(tmp_path)], [rule_by_code(c) for c in ("GPU005", "GPU013")], jobs=1)
    found = sorted((Path(d.path).name, d.line, d.code) for d in result.diagnostics)
    assert found == [("model.py", 14, "GPU013"), ("model.py", 17, "GPU005")]


def test_a_network_called_in_the_loop_runs_its_forward_and_its_submodules_forward_per_step(tmp_path: Path):
    """`model = LanguageModel(512)` then `model(x)` in the training loop runs `LanguageModel.forward`, and
    `self.model(x)` there (`self.model = Decoder(width)`) runs `Decoder.forward`: the helpers they call run every
    step, in whatever file they are."""
    program = FIXTURES / "GPU013" / "programs" / "mask_helper_below_forward"
    sources = {relative: text for relative, text in _materialize(program, tmp_path).items()}
    graph = CallGraph(sources)
    for key in ("LanguageModel.forward", "Decoder.forward", "Decoder._prepare_attention_mask", "_make_causal_mask"):
        assert graph.frequency.get(("modeling.py", key), Frequency.ONCE) >= Frequency.PER_STEP, key


def test_a_receiver_named_after_a_class_runs_that_classes_own_method():
    """`self.replay_buffer.sample(n)`, the buffer handed in by the caller, is `ReplayBuffer.sample` (not the other
    buffer's `sample`): the receiver is named after the program's class. Only that class's own definition:
    `self.quant_backend.write(x)` named after an abstract `QuantBackend` does not run every subclass's override
    (which one the object is, the name does not say)."""
    sources = {
        "buffers.py": "class ReplayBuffer:\n    def sample(self, n):\n        return self.rows[:n]\n\n\n"
                      "class PrioritizedBuffer:\n    def sample(self, n):\n        return self.tree.get(n)\n\n\n"
                      "class QuantBackend:\n    def write(self, x):\n        raise NotImplementedError\n\n\n"
                      "class CpuQuantBackend(QuantBackend):\n    def write(self, x):\n        return x.to('cpu')\n",
        "agent.py": "class Agent:\n    def __init__(self, buffer, backend):\n        self.replay_buffer = buffer\n"
                    "        self.quant_backend = backend\n\n    def update(self):\n"
                    "        batch = self.replay_buffer.sample(32)\n        self.quant_backend.write(batch)\n",
    }
    graph = CallGraph(sources)
    update = graph.files["agent.py"].functions["Agent.update"]
    targets = {site.target[-1]: graph.resolve("agent.py", update, site.target) for site in update.sites}
    assert targets["sample"] == [("buffers.py", "ReplayBuffer.sample")]
    assert targets["write"] == [("buffers.py", "QuantBackend.write")]


def test_a_step_closure_returned_by_a_factory_in_another_file_runs_per_step():
    """`train = train_fns.make_training_function(G, D)`, then `metrics = train(x, y)` in the loop: the nested
    function the factory defines and returns is what the loop calls, once per step."""
    sources = {
        "train_fns.py": "def make_training_function(G, D):\n    def train(x, y):\n        loss = D(G(x)).mean()\n"
                        "        loss.backward()\n        G.optim.step()\n        return {'loss': loss.item()}\n"
                        "    return train\n",
        "train.py": "import train_fns\n\n\ndef run(G, D, loader):\n"
                    "    train = train_fns.make_training_function(G, D)\n    for x, y in loader:\n"
                    "        metrics = train(x, y)\n",
    }
    graph = CallGraph(sources)
    assert graph.frequency.get(("train_fns.py", "make_training_function.train")) is Frequency.PER_STEP
    assert graph.frequency.get(("train_fns.py", "make_training_function"), Frequency.ONCE) is Frequency.ONCE


def test_a_parameter_annotated_with_a_network_class_resolves_to_that_class():
    """`def evaluate(state, nn: NeuralNetwork): nn.forward_for_alphazero(x)`: the annotation says which of the two
    networks defining the method runs, and a search loop calling `evaluate` evaluates a network per simulation."""
    sources = {
        "nets.py": "import torch\n\n\nclass NeuralNetwork(torch.nn.Module):\n"
                   "    def forward_for_alphazero(self, x):\n        return self.body(x).item()\n\n\n"
                   "class ConnectFourNetwork(torch.nn.Module):\n"
                   "    def forward_for_alphazero(self, x):\n        return self.body(x).item()\n",
        "search.py": "from nets import NeuralNetwork\n\n\ndef evaluate(state, nn: NeuralNetwork):\n"
                     "    return nn.forward_for_alphazero(state)\n\n\n"
                     "def run_simulation(root, nn, simulations):\n    for _ in range(simulations):\n"
                     "        value = evaluate(root, nn)\n",
    }
    graph = CallGraph(sources, frozenset({"NeuralNetwork", "ConnectFourNetwork"}))
    evaluate = graph.files["search.py"].functions["evaluate"]
    [site] = evaluate.sites
    assert graph.resolve("search.py", evaluate, site.target) == [("nets.py", "NeuralNetwork.forward_for_alphazero")]
    assert graph.frequency.get(("nets.py", "NeuralNetwork.forward_for_alphazero")) is Frequency.PER_ROLLOUT_STEP


def test_calling_an_instance_of_a_plain_class_runs_its_call_method():
    """`self.proposal_layer = ProposalCreator(self)` in a network's `__init__`, `self.proposal_layer(...)` in its
    forward: `ProposalCreator.__call__` runs every step (a class that is no network has no `forward`)."""
    sources = {
        "creator.py": "import torch\n\n\nclass ProposalCreator:\n    def __init__(self, parent):\n"
                      "        self.parent = parent\n\n    def __call__(self, rois):\n"
                      "        return torch.from_numpy(rois).cuda()\n",
        "rpn.py": "import torch\n\nfrom creator import ProposalCreator\n\n\nclass RegionProposalNetwork(torch.nn.Module):\n"
                  "    def __init__(self):\n        super().__init__()\n"
                  "        self.proposal_layer = ProposalCreator(self)\n\n    def forward(self, rois):\n"
                  "        return self.proposal_layer(rois)\n",
    }
    graph = CallGraph(sources, frozenset({"RegionProposalNetwork"}))
    assert graph.frequency.get(("creator.py", "ProposalCreator.__call__")) is Frequency.PER_STEP


def test_a_function_applied_by_map_runs_where_the_map_stands():
    """`obs = tree_map(tu.np2th, venv.observe())` in a rollout step, `list(map(upload, arrays))` in a training
    loop: the mapped function runs as often as that line (gym3's `venv.act(ac)` is the environment's step)."""
    sources = {
        "tu.py": "import torch\n\n\ndef np2th(a):\n    return torch.from_numpy(a).cuda()\n",
        "roller.py": "import tu\nfrom tree_util import tree_map\n\n\ndef single_step(venv, policy):\n"
                     "    obs = tree_map(tu.np2th, venv.observe())\n    venv.act(policy(obs))\n\n\n"
                     "def rollout(venv, policy, horizon):\n    for t in range(horizon):\n"
                     "        single_step(venv, policy)\n",
    }
    graph = CallGraph(sources)
    assert graph.frequency.get(("roller.py", "single_step")) is Frequency.PER_ROLLOUT_STEP
    assert graph.frequency.get(("tu.py", "np2th")) is Frequency.PER_ROLLOUT_STEP
