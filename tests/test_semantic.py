"""The semantic layer on its own: how often functions run across files, which loops are hot, values proven by use.

Programs under tests/data/semantic/<program>/ state their expectations in comments: `# frequency: per-step` on a
`def` line (the call graph's verdict for that function; `once` when no caller repeats it), `# batch-params: x-y`
on a `def` line (its parameters that callers pass parts of a loader's batch; `none`), `# device-params: x-y` (those
every caller passes a GPU tensor for; `none`) and `# hot: rollout`
on a loop line (the hot-region kind the per-file analysis gives the loop; `none` when it is not hot)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import libcst as cst
import pytest

from gpulint.analysis import HotKind, analyze
from gpulint.engine import ProgramFacts, node_positions
from gpulint.semantic.callgraph import CallGraph, Frequency, call_graph_state
from gpulint.semantic.loaders import LoaderFlow

PROGRAMS = sorted(p for p in (Path(__file__).parent / "data" / "semantic").iterdir() if p.is_dir())
_EXPECT = re.compile(r"(?:#|,)\s*(frequency|hot|feeds-training|per-epoch|batch-params|device-params):\s*([\w-]+)")


def _sources(program: Path) -> dict[str, str]:
    return {path.relative_to(program).as_posix(): path.read_text() for path in sorted(program.rglob("*.py"))}


def _function_keys(text: str) -> dict[int, str]:
    """line of each `def` -> the call graph's key for it ("Class.method", "outer.inner")."""
    keys: dict[int, str] = {}

    def visit(node: ast.AST, owner: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                name = (*owner, child.name)
                if isinstance(child, ast.FunctionDef):
                    keys[child.lineno] = ".".join(name)
                visit(child, name)
            else:
                visit(child, owner)

    visit(ast.parse(text), ())
    return keys


def _expectations(kind: str) -> list[tuple[Path, str, int, str]]:
    found = []
    for program in PROGRAMS:
        for path, text in _sources(program).items():
            for number, line in enumerate(text.splitlines(), 1):
                for match in _EXPECT.finditer(line):
                    if match.group(1) == kind:
                        found.append((program, path, number, match.group(2)))
    return found


@pytest.mark.parametrize("program, path, line, expected", _expectations("frequency"),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_function_frequency(program: Path, path: str, line: int, expected: str) -> None:
    sources = _sources(program)
    graph = CallGraph(sources)
    key = _function_keys(sources[path])[line]
    found = graph.frequency.get((path, key), Frequency.ONCE)
    assert found.name.lower().replace("_", "-") == expected, f"{path}:{line} {key}"


@pytest.mark.parametrize("program, path, line, expected, marker", [
    *((*case, "batch-parameter") for case in _expectations("batch-params")),
    *((*case, "device-parameter") for case in _expectations("device-params"))],
    ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_parameters_proven_by_callers(program: Path, path: str, line: int, expected: str, marker: str) -> None:
    """Parameters the callers pass parts of a loader's batch, or GPU tensors, for."""
    sources = _sources(program)
    key = _function_keys(sources[path])[line]
    markers = CallGraph(sources).by_file().get(path, {})
    found = sorted(m.split(":", 1)[1] for m in markers if m.startswith(f"{key}#{marker}:"))
    assert ("-".join(found) or "none") == expected, f"{path}:{line} {key}: {found}"


@pytest.mark.parametrize("program, path, line, expected", _expectations("hot"),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_loop_hotness(program: Path, path: str, line: int, expected: str) -> None:
    sources = _sources(program)
    program_facts = ProgramFacts(sources=sources)
    module = cst.parse_module(sources[path])
    analysis = analyze(module, None, program_facts.calls_for(path))
    positions = node_positions(module)
    loops = [node for node in _walk(module) if isinstance(node, (cst.For, cst.While))
             and positions[id(node)][0] == line]
    assert loops, f"no loop on {path}:{line}"
    kind = analysis.hot.get(id(loops[0]))
    assert (kind.value if kind else "none") == expected, f"{path}:{line}"


@pytest.mark.parametrize("program, path, line, expected", _expectations("feeds-training"),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_loader_reaches_training_across_files(program: Path, path: str, line: int, expected: str) -> None:
    flow, loader = _loader_on_line(program, path, line)
    assert ("yes" if flow.reaches_training(loader) else "no") == expected, f"{path}:{line}"


@pytest.mark.parametrize("program, path, line, expected", _expectations("per-epoch"),
                         ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_loader_iterated_per_epoch_across_files(program: Path, path: str, line: int, expected: str) -> None:
    flow, loader = _loader_on_line(program, path, line)
    assert ("yes" if flow.iterated_per_epoch(loader) is not None else "no") == expected, f"{path}:{line}"


def _loader_on_line(program: Path, path: str, line: int) -> tuple[LoaderFlow, cst.Call]:
    """The loader flow of `path` in its program, and the `DataLoader(...)` call on `line`."""
    sources = _sources(program)
    module = cst.parse_module(sources[path])
    flow = LoaderFlow(analyze(module, None, ProgramFacts(sources=sources).calls_for(path)))
    positions = node_positions(module)
    loaders = [node for node in _walk(module) if isinstance(node, cst.Call) and positions[id(node)][0] == line
               and isinstance(node.func, cst.Name) and node.func.value == "DataLoader"]
    assert loaders, f"no DataLoader call on {path}:{line}"
    return flow, loaders[0]


def _walk(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _walk(child)


def test_every_program_has_expectations() -> None:
    for program in PROGRAMS:
        assert any(_EXPECT.search(text) for text in _sources(program).values()), program


def test_call_graph_ignores_files_that_do_not_parse() -> None:
    graph = CallGraph({"broken.py": "def f(:\n", "ok.py": "def g():\n    for x in loader:\n        h(x)\n"})
    assert "broken.py" not in graph.files and "ok.py" in graph.files


def test_recursion_terminates() -> None:
    text = ("def a(x):\n    return b(x)\n\ndef b(x):\n    return a(x)\n\n"
            "for batch in loader:\n    loss = a(batch)\n    loss.backward()\n    optimizer.step()\n")
    graph = CallGraph({"r.py": text})
    assert graph.frequency[("r.py", "a")] is Frequency.PER_STEP
    assert graph.frequency[("r.py", "b")] is Frequency.PER_STEP


def test_tensor_proven_by_use() -> None:
    from gpulint.semantic.placement import tensors_by_use
    module = cst.parse_module("def f(p_loss, v_loss, c, x):\n    total = p_loss + c * v_loss\n    total.backward()\n"
                              "    y = x.detach()\n")
    function = module.body[0]
    assert {"p_loss", "v_loss", "total", "x"} <= tensors_by_use(function)
    inline = cst.parse_module("def f(self, v_loss, pg_loss, entropy, n):\n"
                              "    (v_loss * self.c + pg_loss - entropy * self.e).backward()\n    m = n + 1\n")
    assert {"v_loss", "pg_loss", "entropy"} <= tensors_by_use(inline.body[0])
    assert "n" not in tensors_by_use(inline.body[0])
    # further back from the loss, through reductions: what the function computes, not the settings it reads
    chained = cst.parse_module("def f(cfg, weights, value, target):\n"
                               "    v_loss = cfg.value_loss(value, target)\n    coef = cfg.value_coef\n"
                               "    loss = 2.0 * p_loss(value) + coef * v_loss\n"
                               "    weighted = (weights * loss).mean()\n    weighted.backward()\n")
    found = tensors_by_use(chained.body[0])
    assert {"weighted", "loss", "v_loss"} <= found and "coef" not in found
    # a name rebound from its own earlier value by a call held something else before; a reduction of itself did not
    rebound = cst.parse_module("def f(net, buffer, opt):\n    states, rewards = buffer.sample()\n"
                               "    rewards = to_device(rewards)\n    err = net(states) - rewards\n"
                               "    loss = err.pow(2)\n    loss = loss.mean()\n    loss.backward()\n")
    found = tensors_by_use(rebound.body[0])
    assert "err" in found and "rewards" not in found


def test_a_binding_in_the_if_branch_does_not_reach_the_else_branch() -> None:
    module = cst.parse_module("def act(self, state):\n    if self.continuous:\n        state = to_device(state)\n"
                              "        return self.net(state)\n    else:\n        return self.head(state)\n"
                              "    return state\n")
    analysis = analyze(module)
    uses = []

    def visit(node: cst.CSTNode) -> bool:
        stack.append(node)
        if isinstance(node, cst.Name) and node.value == "state" and isinstance(stack[-2], cst.Arg):
            uses.append(list(stack))
        return True

    stack: list[cst.CSTNode] = []
    from gpulint.analysis import traverse
    traverse(module, visit, lambda node: stack.pop())
    moved, in_if, in_else = [[b.kind.value for b in analysis.reaching_bindings("state", u)] for u in uses]
    assert moved == ["param"] and in_if == ["assign"]  # `self.net(state)`: the device copy
    assert in_else == ["param"]  # `self.head(state)`: the argument, untouched


def test_a_flag_set_every_n_steps_throttles_the_callee_branch_it_gates() -> None:
    sources = {
        "train.py": "from learner import update\n\ndef train(loader, model, opt):\n"
                    "    for step, batch in enumerate(loader):\n        show = step % 100 == 0\n"
                    "        update(model, batch, opt, show)\n",
        "learner.py": "def update(model, batch, opt, visualise):\n    loss = model(batch).mean()\n"
                      "    loss.backward()\n    opt.step()\n    if visualise:\n        print(loss.item())\n",
    }
    markers = CallGraph(sources).by_file()["learner.py"]
    assert "update#throttle-flag:visualise" in markers
    every_step = dict(sources, **{"train.py": sources["train.py"].replace("step % 100 == 0", "step >= 0")})
    assert "update#throttle-flag:visualise" not in CallGraph(every_step).by_file()["learner.py"]


def test_a_generator_that_re_yields_its_argument_is_seen_through() -> None:
    from gpulint.semantic.loaders import iterated_expressions
    program = Path(__file__).parent / "data" / "semantic" / "logging_generator"
    markers = CallGraph(_sources(program)).by_file()["train.py"]
    assert "train_one_epoch#yields-argument:logged:0" in markers  # `progress.logged(loader, header=...)`
    loop = cst.parse_expression('enumerate(progress.logged(loader, header="train"))')
    assert [cst.Module([]).code_for_node(n) for n in iterated_expressions(loop, {"logged": 0})] == ["loader"]
    assert [cst.Module([]).code_for_node(n) for n in iterated_expressions(loop)] != ["loader"]


def test_rollout_loop_kind_is_hot_kind() -> None:
    assert HotKind.ROLLOUT.value == "rollout" and HotKind.CALLEE.value == "called-per-step"


def test_loop_keys_agree_between_the_call_graph_and_the_per_file_analysis() -> None:
    """Loops are named `<function>#loop<n>` by both passes, also after a `match` and inside nested functions."""
    text = ("def search(state, evaluate):\n"
            "    match state:\n"
            "        case 0:\n"
            "            for i in range(3):\n"
            "                pass\n"
            "    def inner():\n"
            "        for j in range(2):\n"
            "            pass\n"
            "    for _ in range(50):\n"
            "        evaluate(state)\n"
            "\n"
            "def play(net, state):\n"
            "    return net(state)\n"
            "\n"
            "def main(net, state):\n"
            "    search(state, evaluate=play)\n")
    graph = CallGraph({"s.py": text})
    assert graph.by_file()["s.py"]["search#loop1"] is Frequency.PER_ROLLOUT_STEP
    module = cst.parse_module(text)
    analysis = analyze(module, None, ProgramFacts(sources={"s.py": text}).calls_for("s.py"))
    loops = [node for node in _walk(module) if isinstance(node, cst.For)]
    assert [analysis.hot.get(id(loop)) for loop in loops] == [None, None, HotKind.ROLLOUT]


def test_attribute_set_to_none_first_takes_its_later_values() -> None:
    """`self.returns = None` in __init__, a tensor later: reading it back per rollout step is a sync."""
    from gpulint.engine import lint_text
    from gpulint.registry import all_rules
    text = ("import torch\n"
            "device = torch.device('cuda')\n"
            "class Relabel(torch.nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.trunk = torch.nn.Linear(4, 1).to(device)\n"
            "        self.returns = None\n"
            "    def predict(self, x, masks):\n"
            "        reward = torch.sigmoid(self.trunk(x))\n"
            "        if self.returns is None:\n"
            "            self.returns = reward.clone()\n"
            "        self.returns = self.returns * masks + reward\n"
            "        return self.returns.cpu().numpy()\n"
            "def main(relabel, envs, steps):\n"
            "    obs = envs.reset()\n"
            "    for step in range(steps):\n"
            "        obs, reward, done, info = envs.step(relabel.predict(obs, 1.0))\n")
    rules = [r for r in all_rules() if r.code == "GPU005"]
    found = [d.line for d in lint_text(text, "relabel.py", rules).diagnostics]
    assert 13 in found


def test_precision_markers_ignore_fp32_casts_and_numpy_float64() -> None:
    from gpulint.semantic.precision import FP64, LOW_PRECISION
    assert not LOW_PRECISION.search("x = torch.from_numpy(a).to(dtype=torch.float32, device=device)")
    assert LOW_PRECISION.search("model.to(dtype=ptdtype)") and LOW_PRECISION.search("x.to(dtype=torch.bfloat16)")
    assert not FP64.search("visits = np.zeros(n, dtype=np.float64)")
    assert FP64.search("model.double()") and FP64.search("x.to(torch.float64)")
    assert FP64.search("net = MLP(hidden_size=1024).double().cuda()")


@pytest.mark.parametrize("code", [
    "t = torch.tensor([self.count, self.total], dtype=torch.float64, device='cuda')",  # metrics summed across ranks
    "self.log_q = (-(-self.dist.double().log1p_() * 2 * n).expm1_()).log_().float()",  # a table cast back
])
def test_an_incidental_fp64_tensor_does_not_make_the_program_fp64(code: str) -> None:
    from gpulint.semantic.precision import FP64
    assert not FP64.search(code)


@pytest.mark.parametrize(("code", "fp64"), [
    ("self.register_buffer('betas', torch.linspace(beta_1, beta_T, T).double())\n", False),  # a schedule table
    ("model = Net().double().cuda()\n", True),
])
def test_an_fp64_schedule_table_is_not_fp64_training(code: str, fp64: bool) -> None:
    from gpulint.semantic.precision import runs_in_fp64
    assert runs_in_fp64(code) is fp64


@pytest.mark.parametrize(("argument", "switch"), [
    ("parser.add_argument('--use_amp', type=str2bool, default=False)", "--use_amp"),
    ("parser.add_argument('--fp16', action='store_true')", "--fp16"),
    ("parser.add_argument('--fp16-precision', action='store_true', help='fp16')", "--fp16-precision"),
    ("parser.add_argument('--amp', action='store_true', default=True)", None),  # on unless turned off
    ("parser.add_argument('--no_amp', action='store_true')", None),  # a switch out of mixed precision
    ("parser.add_argument('--lr', type=float, default=0)", None),
])
def test_precision_switches_off_by_default(argument: str, switch: str | None) -> None:
    from gpulint.semantic.precision import _switches_off_by_default
    assert _switches_off_by_default(argument) == ((switch,) if switch else ())


def test_memoised_and_leaving_branches_are_not_per_step() -> None:
    """`if key not in cache:`, `@lru_cache` and `if done: ...; break` run once (per key, per loop), not per step."""
    from gpulint.engine import lint_text
    from gpulint.registry import all_rules
    text = ("import functools\n"
            "import numpy as np\n"
            "import torch\n"
            "cache = {}\n"
            "@functools.lru_cache(maxsize=None)\n"
            "def window(n):\n"
            "    return torch.from_numpy(np.hanning(n)).to('cuda')\n"
            "def mel(n):\n"
            "    if n not in cache:\n"
            "        cache[n] = torch.from_numpy(np.ones(n)).to('cuda')\n"
            "    return cache[n]\n"
            "for step in range(1000):\n"
            "    x = torch.from_numpy(batch()).to('cuda')\n"
            "    loss = model(x * window(64) * mel(64)).sum()\n"
            "    loss.backward()\n"
            "    optimizer.step()\n"
            "    if converged(loss):\n"
            "        final = torch.from_numpy(report()).to('cuda')\n"
            "        break\n")
    rules = [r for r in all_rules() if r.code == "GPU013"]
    assert [d.line for d in lint_text(text, "train.py", rules).diagnostics] == [13]


def test_rollout_function_returning_its_graph_gets_no_automatic_no_grad() -> None:
    """A rollout function whose network output is returned with its graph may feed a loss: reported, not fixed;
    when a caller is seen backpropagating what it returns (`loss = self.compute_loss(...)`, then
    `take_step(optimizer, loss)` calls `loss.backward()`), it is training, not acting: not reported."""
    from gpulint.engine import lint_text
    from gpulint.registry import all_rules
    text = ("import torch\n"
            "def act(net, obs):\n"
            "    value = net(obs)\n"
            "    print(value.item())\n"
            "    return value\n"
            "def play(net, env, steps):\n"
            "    obs = env.reset()\n"
            "    for t in range(steps):\n"
            "        value = act(net, obs)\n"
            "        obs, reward, done, info = env.step(0)\n")
    rules = [r for r in all_rules() if r.code == "GPU074"]
    found = lint_text(text, "play.py", rules).diagnostics
    assert [d.line for d in found] == [3] and found[0].fix is None and "returns a network output" in found[0].note
    trained = text.replace("        value = act(net, obs)\n", "        value = act(net, obs)\n        step(value)\n") + \
        "def step(loss):\n    loss.backward()\n"
    assert lint_text(trained, "play.py", rules, program=ProgramFacts(sources={"play.py": trained})).diagnostics == []
    detached = text.replace("    return value\n", "    return value.detach()\n")
    fixed = lint_text(detached, "play.py", rules).diagnostics
    assert [d.line for d in fixed] == [3] and fixed[0].fix is not None


def test_values_flow_from_a_network_call_until_read_as_data() -> None:
    import re

    from gpulint.semantic.dataflow import flow_from

    module = cst.parse_module("def act(self, obs):\n    h = self.net(obs)\n    out = self.head(h)\n"
                              "    score = out.mean().item()\n    self.last = out\n    n = 3\n")
    function = module.body[0]
    calls = [node for node in _walk(function) if isinstance(node, cst.Call)
             and cst.Module([]).code_for_node(node) == "self.net(obs)"]
    flow = flow_from(function, calls, lambda value, _: bool(re.search(r"\.item\(", cst.Module([]).code_for_node(value))))
    assert {"h", "out"} <= flow.names and flow.kept  # `self.last = out` keeps an output
    assert "score" not in flow.names and "n" not in flow.names


@pytest.mark.parametrize(("path", "is_test"), [
    ("tests.py", True), ("pkg/tests.py", True), ("test_model.py", True), ("model_test.py", True),
    ("tests/helpers.py", True), ("conftest.py", True),
    ("test.py", False), ("src/test.py", False),  # an evaluation script in training code (yolov7/test.py)
    ("train.py", False), ("contest.py", False),
])
def test_test_files_are_told_from_evaluation_scripts(path: str, is_test: bool) -> None:
    from gpulint.rule import is_test_path
    assert is_test_path(path) is is_test


def test_work_estimate_reads_config_dicts() -> None:
    """LLM code keeps its sizes in a config dict (`GPT_CONFIG = {"emb_dim": 768, ...}`), not in keywords."""
    from gpulint.network_size import work_per_step
    text = ('import torch.nn as nn\n'
            'CONFIG = {"vocab_size": 50257, "context_length": 256, "emb_dim": 768, "batch_size": 2}\n'
            'head = nn.Linear(CONFIG["emb_dim"], CONFIG["vocab_size"])\n')
    work = work_per_step({"gpt.py": text})
    assert work is not None and work.macs == 2 * 256 * 768 * 768 and work.pays


def test_work_estimate_ignores_the_stem_conv() -> None:
    """The stem reads the image (`Conv3d(3, 64)`): its three input channels are not the network's width, so a
    video ResNet whose other widths are computed is estimated at the default width, where tensor cores pay."""
    from gpulint.network_size import work_per_step
    text = ('import torch.nn as nn\n'
            'parser.add_argument("--batch_size", default=128, type=int)\n'
            'def stem(n_input_channels=3, planes=64):\n'
            '    return nn.Conv3d(n_input_channels, planes, kernel_size=7)\n'
            'def block(inplanes, planes):\n'
            '    return nn.Conv3d(inplanes, planes, kernel_size=3)\n')
    work = work_per_step({"resnet.py": text})
    assert work is not None and work.convolutional and work.pays


def test_work_estimate_reads_the_image_size() -> None:
    """A GAN trained at batch 16 with `image_size = 64`: the first full-width convolutions run at half the written
    side (32 x 32 positions), enough work for tensor cores; with no image size written, 16 x 16 is assumed."""
    from gpulint.network_size import work_per_step
    layers = ('import torch.nn as nn\n'
              'def block(channels):\n'
              '    return nn.Conv2d(channels, channels, 3, padding=1)\n'
              'stem = nn.Conv2d(3, 64, 3)\n')
    unsized = work_per_step({"gan.py": layers + 'batch_size = 16\n'})
    sized = work_per_step({"gan.py": layers + 'batch_size = 16\nimage_size = 64\n'})
    assert unsized is not None and not unsized.pays
    assert sized is not None and sized.macs == 16 * 32 * 32 * 64 * 64 * 9 and sized.pays


@pytest.mark.parametrize(("arguments", "step"), [
    (["loss", "optimizer"], True),  # timm's `loss_scaler(loss, optimizer, clip_grad=...)`
    (["total_loss", "self.opt"], True),
    (["loss_fn", "optimizer"], False),  # a loss function: not a value to backpropagate
    (["model", "data", "loss", "epoch", "optimizer", "scaler"], False),  # `train_one_epoch(...)`: a whole run
    (["loader", "loss", "optimizer"], False),
])
def test_a_call_handed_a_loss_and_an_optimizer_is_a_step(arguments: list[str], step: bool) -> None:
    from gpulint.semantic.vocab import steps_with
    assert steps_with(arguments) is step


@pytest.mark.parametrize(("differentiate", "trained"), [
    ("torch.autograd.grad(kl, params, create_graph=True)", True),  # TRPO's Hessian-vector product
    ("kl.backward()", True),
    ("print(float(kl))", False),
])
def test_a_result_the_caller_differentiates_is_trained(differentiate: str, trained: bool) -> None:
    """A helper whose result the caller backpropagates or hands to `torch.autograd.grad` returns a value with its
    graph on purpose (`#returns-trained`): no rule may advise running it without gradients."""
    text = ("import torch\n"
            "def kl_divergence(old, new, obs):\n"
            "    return ((old(obs).detach() - new(obs)) ** 2).mean()\n"
            "def hessian_vector_product(old, new, obs, params):\n"
            "    kl = kl_divergence(old, new, obs)\n"
            f"    return {differentiate}\n")
    keys = call_graph_state({"trpo.py": text}, frozenset())[0].get("trpo.py", {})
    assert ("kl_divergence#returns-trained" in keys) is trained


@pytest.mark.parametrize(("code", "mixed"), [
    ("from apex import amp\nmodel, opt = amp.initialize(model, opt)\n", True),
    ("import apex\n", True),
    ("from apex.parallel.LARC import LARC\noptimizer = LARC(optimizer)\n", False),
    ("from apex.parallel import DistributedDataParallel as DDP\n", False),
    ("from apex.optimizers import FusedAdam\n", False),
])
def test_apex_means_mixed_precision_only_through_amp(code: str, mixed: bool) -> None:
    """A linear-probe script importing Apex's LARC optimizer trains in fp32: it must not count as mixed precision
    (which silences the precision rules for the whole program)."""
    from gpulint.semantic.precision import LOW_PRECISION, in_code
    assert in_code(LOW_PRECISION, code) is mixed


@pytest.mark.parametrize(("call", "network"), [
    ("self.muZero.predict", True),  # a value named after the program's `class MuZero(nn.Module)`
    ("mu_zero", True),
    ("MuZero", False),  # the class itself: building one evaluates nothing
    ("self.muZero.state_dict", False),
    ("focal_loss", False),  # `class FocalLoss(nn.Module)`: a loss, not a forward pass
])
def test_a_value_named_after_a_network_class_is_a_network(call: str, network: bool) -> None:
    from gpulint.semantic import vocab
    assert vocab.is_network_call(call, vocab.network_class_names({"MuZero", "FocalLoss"})) is network


@pytest.mark.parametrize(("layers", "size"), [
    # a ConvNeXt block: the pointwise layers widen the stage's dimension, the matrix work cuDNN's TF32 misses
    ("nn.Conv2d(dim, dim, 7), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)", None),
    # a ResNet: convolutions and a classifier head whose width is computed, not a widened dimension
    ("nn.Conv2d(3, 64, 3), nn.Linear(512 * block.expansion, num_classes)", "small"),
    # a policy head over the board's positions: both widths are products of the board's sides, neither widens
    ("nn.Conv2d(4, 32, 3), nn.Linear(4 * width * height, width * height)", "small"),
    # an Atari trunk projecting its flattened features (computed at run time) to 512: a large GEMM
    ("nn.Conv2d(4, 32, 8), nn.Conv2d(32, 64, 4), nn.Linear(output_dim, 512), nn.Linear(512, n_actions)", "large"),
])
def test_a_convolutional_network_with_block_mlps_is_not_small_for_tf32(layers: str, size: str | None) -> None:
    from gpulint.network_size import network_size
    text = f"import torch.nn as nn\nnet = nn.Sequential({layers})\n"
    assert network_size({"model.py": text}, matmul_only=True) == size


def test_a_submodule_named_after_a_network_class_is_part_of_a_forward_pass() -> None:
    """`decoder.attention(encoder_out, h)` runs a piece of the decoder (`class Attention(nn.Module)`), not a network
    evaluation that would make a beam-search loop a rollout."""
    from gpulint.semantic import vocab
    assert not vocab.is_network_call("decoder.attention", vocab.network_class_names({"Attention"}))
    assert vocab.is_network_call("self.attention", vocab.network_class_names({"Attention"}))


@pytest.mark.parametrize(("code", "ungated"), [
    ("with torch.autocast('cuda', enabled=args.amp):\n    y = model(x)\n", False),
    ("if args.amp:\n    with torch.cuda.amp.autocast():\n        y = model(x)\n", False),
    ("with torch.autocast('cuda', dtype=torch.bfloat16):\n    y = model(x)\n", True),  # always on
    ("# with torch.autocast('cuda'):\ny = model(x)\n", False),
])
def test_an_autocast_outside_the_precision_switch_is_mixed_precision_in_effect(code: str, ungated: bool) -> None:
    from gpulint.semantic.precision import _ungated_autocast
    assert _ungated_autocast(code, frozenset({"amp"})) is ungated


def test_a_method_writing_every_argument_into_numpy_arrays_marks_its_callers() -> None:
    """`buffer.store(obs, value)` into `np.zeros` arrays turns the arguments into host data (`#stores-to-host:`);
    appending them to lists keeps the tensors, and a method that leaves one argument unwritten is no recorder."""
    buffer = ("import numpy as np\n\nclass Buffer:\n    def __init__(self, n):\n"
              "        self.obs = np.zeros((n, 4))\n        self.val = np.zeros(n)\n        self.i = 0\n\n"
              "    def store(self, obs, val):\n        self.obs[self.i] = obs\n        self.val[self.i] = val\n\n"
              "    def keep(self, obs, val):\n        self.obs[self.i] = obs\n        print(val)\n\n"
              "class Memory:\n    def __init__(self):\n        self.values = []\n\n"
              "    def store(self, val):\n        self.values.append(val)\n")
    agent = ("from buffer import Buffer, Memory\n\n"
             "def record(net, obs):\n    buffer = Buffer(8)\n"
             "    for _ in range(8):\n        buffer.store(obs, net(obs))\n\n"
             "def print_too(net, obs):\n    buffer = Buffer(8)\n"
             "    for _ in range(8):\n        buffer.keep(obs, net(obs))\n\n"
             "def remember(net, obs):\n    memory = Memory()\n    for _ in range(8):\n        memory.store(net(obs))\n")
    markers = CallGraph({"buffer.py": buffer, "agent.py": agent}).by_file().get("agent.py", {})
    assert sorted(m for m in markers if "#stores-to-host:" in m) == ["record#stores-to-host:store"]


@pytest.mark.parametrize("parser, off", [
    ("p.add_argument('--amp', action='store_true')\n", ("--amp",)),
    ("p.add_argument('--enable-amp', action='store_true')\np.set_defaults(enable_amp=True)\n", ()),
    ("p.add_argument('--fp16', type=int, default=0)\n", ("--fp16",)),
    ("p.add_argument('--deepspeed', type=lambda _: False)\n", ("--deepspeed",)),
    ("p.add_argument('--amp_level', type=str)\n", ()),
])
def test_precision_switches_off_by_default(parser: str, off: tuple[str, ...]) -> None:
    """A `store_true` switch that `set_defaults` turns on is on by default; a bare switch with no default is off."""
    from gpulint.semantic.precision import _switches_off_by_default
    assert _switches_off_by_default("import argparse\np = argparse.ArgumentParser()\n" + parser) == off


def test_a_file_too_deep_to_summarise_is_left_out_of_the_call_graph(monkeypatch):
    """A RecursionError while summarising one file costs that file its place in the graph, not the program's graph."""
    import gpulint.semantic.callgraph as callgraph

    real = callgraph._Summariser

    def summariser(path, *args, **kwargs):
        if path == "deep.py":
            raise RecursionError("maximum recursion depth exceeded")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(callgraph, "_Summariser", summariser)
    callgraph._summarise_text.cache_clear()
    sources = {"deep.py": "def f():\n    return 1\n",
               "train.py": "def step(model, opt, x):\n    model(x).sum().backward()\n    opt.step()\n\n"
                           "def main(model, opt, loader):\n    for x in loader:\n        step(model, opt, x)\n"}
    graph = CallGraph(sources)
    callgraph._summarise_text.cache_clear()
    assert "deep.py" not in graph.files
    assert graph.frequency.get(("train.py", "step")) is Frequency.PER_STEP
