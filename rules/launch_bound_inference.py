from __future__ import annotations

import re
import textwrap

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import dotted_name, walk
from gpulint.network_size import LAUNCH_BOUND_KERNELS, launches_per_forward
from gpulint.program import mentions, related_texts
from gpulint.rule import DefinitionRequest, is_test_path

HELPER = "cuda_graph_inference"
# What makes an input a single observation / position: a batch axis of one added to one sample.
_ONE_ROW = re.compile(r"\.unsqueeze_?\(\s*(0|dim\s*=\s*0)\s*\)|\[\s*None\s*[\],]|\.(view|reshape)\(\s*1\s*,|"
                      r"\bexpand_dims\(|\[\s*(np|numpy)\.newaxis|\b(tensor|Tensor|FloatTensor|LongTensor|as_tensor)"
                      r"\(\s*\[\s*[\w.]+\s*\]")
# The program already replays CUDA graphs: its own captures or torch.compile's CUDA-graph trees, which share the
# caching allocator with the helper's captures (the two in one process ended in an illegal memory access).
_USES_CUDA_GRAPHS = re.compile(r"\bCUDAGraph\b|\bcuda\.graph\(|make_graphed_callables|reduce-overhead|max-autotune|"
                               r"[\"']cudagraphs[\"']|triton\.cudagraphs")
_GRAPH_CAPACITY = 8  # input shapes captured per network before the helper stops capturing


def helper_source(torch: str, weakref: str = "weakref", warnings: str = "warnings") -> str:
    """The function the fix adds to the file, spelled with the file's names for torch, weakref and warnings."""
    return f'''_CUDA_GRAPHS = {weakref}.WeakKeyDictionary()
# Submodules, parameters and buffers registered anywhere since import (torch >= 2.0 reports them): the dicts that
# hold a network's weights are listed again after one, not on every call (listing them cost 0.1 ms per call).
_MODULE_EDITS = [0]


def _count_module_edit(*args):
    _MODULE_EDITS[0] += 1


_WATCHES_MODULE_EDITS = hasattr({torch}.nn.modules.module, "register_module_buffer_registration_hook")
if _WATCHES_MODULE_EDITS:
    {torch}.nn.modules.module.register_module_module_registration_hook(_count_module_edit)
    {torch}.nn.modules.module.register_module_parameter_registration_hook(_count_module_edit)
    {torch}.nn.modules.module.register_module_buffer_registration_hook(_count_module_edit)


def {HELPER}(net, *inputs):
    """`net(*inputs)` replayed from a CUDA graph captured on the first call for each input shape (added by
    gpulint, GPU076): one launch instead of one per kernel. Runs the network as before when grad mode is on,
    when an input is not a CUDA tensor, or when its forward syncs with the host. Returns copies of the outputs."""
    if {torch}.is_grad_enabled() or not inputs or not all(
            isinstance(x, {torch}.Tensor) and x.is_cuda for x in inputs):
        return net(*inputs)
    state = _CUDA_GRAPHS.setdefault(net, [None, [], {{}}])  # module edits when listed, weight dicts, graphs
    if state[0] != _MODULE_EDITS[0] or not _WATCHES_MODULE_EDITS:
        state[0], state[1] = _MODULE_EDITS[0], [d for m in net.modules() for d in (m._parameters, m._buffers)]
    graphs = state[2]
    # the graph reads the weights where they were: a moved or replaced weight needs a new capture
    key = (net.training, tuple((x.shape, x.dtype, x.device) for x in inputs),
           tuple(t.data_ptr() for d in state[1] for t in d.values() if t is not None))
    entry = graphs.get(key)
    if entry is None:
        entry = False
        if len(graphs) < {_GRAPH_CAPACITY}:
            static_inputs = [x.clone() for x in inputs]
            side = {torch}.cuda.Stream()
            side.wait_stream({torch}.cuda.current_stream())
            mode = {torch}.cuda.get_sync_debug_mode()
            with {warnings}.catch_warnings():
                {warnings}.simplefilter("ignore")  # sync debug mode announces itself as a prototype
                {torch}.cuda.set_sync_debug_mode("error")  # a forward that syncs cannot be captured: stay eager
                try:
                    with {torch}.cuda.stream(side):  # warm-up outside the capture: lazy initialisation, workspaces
                        static_outputs = net(*static_inputs)
                except RuntimeError:
                    static_outputs = None
                finally:
                    {torch}.cuda.set_sync_debug_mode(mode)
            {torch}.cuda.current_stream().wait_stream(side)
            outputs = static_outputs if type(static_outputs) in (tuple, list) else [static_outputs]
            if all(isinstance(y, {torch}.Tensor) for y in outputs):
                graph = {torch}.cuda.CUDAGraph()
                with {torch}.cuda.graph(graph):
                    static_outputs = net(*static_inputs)
                entry = (graph, static_inputs, static_outputs)
        graphs[key] = entry
    if entry is False:
        return net(*inputs)
    graph, static_inputs, static_outputs = entry
    for static, x in zip(static_inputs, inputs):
        static.copy_(x)
    graph.replay()
    if isinstance(static_outputs, {torch}.Tensor):
        return static_outputs.clone()
    return type(static_outputs)(y.clone() for y in static_outputs)'''


class LaunchBoundInference(Rule):
    """
    ## What it does
    Finds a network called on one observation or position at a time (an input given a batch axis of one:
    `x.unsqueeze(0)`, `x[None]`, `x.view(1, ...)`, `torch.tensor([state])`) under `torch.no_grad()` /
    `torch.inference_mode()`, in a loop that steps an environment, a game or a tree search, or in a function
    the program calls once per environment step, move or simulation (in any file), in a CUDA program whose
    networks launch enough kernels per forward to be launch-bound (a Transformer layer, a convolution tower).

    ## Why is this slow
    At batch 1 the GPU finishes each kernel in microseconds; the time goes to Python dispatching the forward
    and to launching each kernel, one after the other, thousands of times per game or episode. A CUDA graph
    captures the forward once and replays all its kernels with one launch. Measured on an H200 (torch 2.11,
    `benchmarks/graphed_inference.py`): tree-search self-play with a 4-layer, 256-wide Transformer encoder
    took 1.34-1.80 s per game eagerly (24 simulations per move), 0.51-0.57 s with the network replayed through
    the fix's helper (2.6-3.1x; 3.1-3.7x at 12 simulations), and 0.39-0.60 s with
    `torch.compile(mode="reduce-overhead")` after 2.4-5.7 s of compilation; the visit counts were identical.
    The whole e2e self-play trainer (`benchmarks/e2e/`) went from 23.9 s to 10.5 s with all of gpulint's fixes.

    ## Example
    ```python
    def evaluate(net, game, device):
        x = torch.from_numpy(game.encode()).unsqueeze(0).to(device)
        with torch.no_grad():
            logits, value = net(x)
        return logits.softmax(-1)[0].cpu().numpy(), value.item()
    ```

    ## Use instead
    ```python
    def evaluate(net, game, device):
        x = torch.from_numpy(game.encode()).unsqueeze(0).to(device)
        with torch.no_grad():
            logits, value = cuda_graph_inference(net, x)
        return logits.softmax(-1)[0].cpu().numpy(), value.item()
    ```
    where `cuda_graph_inference` (added to the file by the fix) captures `net(x)` in a CUDA graph on the
    first call for each input shape and replays it afterwards. Better still, where the search allows it:
    evaluate the leaves of many games in one batched forward.

    ## Fix safety
    Unsafe. The fix adds `cuda_graph_inference` to the file (with `import weakref` and `import warnings`) and
    routes the call through it. The helper runs the network as before when grad mode is on, an input is not a
    CUDA tensor (a CPU run is unchanged), the forward syncs with the host (its first run, outside the capture,
    is made under `torch.cuda.set_sync_debug_mode("error")`: a failed capture would leave the CUDA state
    broken, so the helper never risks one for a forward that syncs), or its outputs are not tensors; it
    captures again when the network changes mode
    (`train()`/`eval()`) or its weights move, and returns copies of the outputs, so keeping them is safe.
    What a replay does not repeat is Python work inside `forward` (counters, caches, hooks, branches on
    Python state): a forward that behaves differently from call to call for reasons other than its input
    tensors must not use it. Each captured shape keeps its own memory pool (at most eight per network).
    Calls with keyword arguments are reported without a fix. Programs that already replay CUDA graphs (their
    own captures, or `torch.compile` with `mode="reduce-overhead"`/`"max-autotune"`) are not reported: mixing
    the helper's captures with torch.compile's CUDA-graph trees in one process ended in an illegal memory
    access on an H200.
    """

    code = "GPU076"
    name = "launch-bound-inference"
    message = ("Network run on one observation/position per call in a rollout or search loop: the forward is "
               "launch-bound; replay it from a CUDA graph")
    severity = Severity.WARNING
    safety = Safety.UNSAFE
    priority = "P1"
    fix_title = "Replay the forward from a CUDA graph"
    triggers = ("no_grad", "inference_mode")  # the call must run without grad in its own function
    examples = [
        Valid(  # a batch of observations per call
            """
            import torch
            import torch.nn as nn
            net = nn.Sequential(nn.TransformerEncoderLayer(256, 8), nn.TransformerEncoderLayer(256, 8)).cuda()
            def act(obs_batch):
                x = torch.from_numpy(obs_batch).cuda()
                with torch.no_grad():
                    return net(x)
            while not done:
                action = act(env.observations())
                done = env.step(action)
            """
        ),
        Valid(  # a small MLP: too few kernels per forward for a replay to pay
            """
            import torch
            import torch.nn as nn
            actor = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 2)).cuda()
            for t in range(1000):
                x = torch.from_numpy(obs).unsqueeze(0).cuda()
                with torch.no_grad():
                    action = actor(x)
                obs, reward, done, info = env.step(action.argmax().item())
            """
        ),
        Valid(  # the program compiles with CUDA graphs already
            """
            import torch
            import torch.nn as nn
            net = nn.Sequential(nn.TransformerEncoderLayer(256, 8), nn.TransformerEncoderLayer(256, 8)).cuda()
            net = torch.compile(net, mode="reduce-overhead")
            for t in range(1000):
                x = torch.from_numpy(obs).unsqueeze(0).cuda()
                with torch.no_grad():
                    out = net(x)
                obs, reward, done, info = env.step(out.argmax().item())
            """
        ),
        Valid(  # grad mode on: the training forward, not inference
            """
            import torch
            import torch.nn as nn
            net = nn.Sequential(nn.TransformerEncoderLayer(256, 8), nn.TransformerEncoderLayer(256, 8)).cuda()
            for t in range(1000):
                x = torch.from_numpy(obs).unsqueeze(0).cuda()
                value = net(x)
                obs, reward, done, info = env.step(value.argmax().item())
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            net = nn.Sequential(nn.TransformerEncoderLayer(256, 8), nn.TransformerEncoderLayer(256, 8)).cuda()
            for t in range(1000):
                x = torch.from_numpy(obs).unsqueeze(0).cuda()
                with torch.no_grad():
                    out = net(x)
                obs, reward, done, info = env.step(out.argmax().item())
            """,
            fixed=textwrap.dedent("""
                import torch
                import torch.nn as nn
                import weakref
                import warnings


                """).lstrip("\n") + helper_source("torch") + textwrap.dedent("""


                net = nn.Sequential(nn.TransformerEncoderLayer(256, 8), nn.TransformerEncoderLayer(256, 8)).cuda()
                for t in range(1000):
                    x = torch.from_numpy(obs).unsqueeze(0).cuda()
                    with torch.no_grad():
                        out = cuda_graph_inference(net, x)
                    obs, reward, done, info = env.step(out.argmax().item())
                """),
        ),
    ]
    # A 4-layer encoder at batch 1: outputs equal (on CPU the helper runs the network as before); on CUDA the
    # replay takes one launch for the ~50 kernels of the eager forward.
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup=("import warnings\nimport weakref\n" + helper_source("torch") + "\n"
               "net = nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True),"
               " 4).to(device).eval()\n"
               "x = torch.randn(1, 43, 256, device=device)"),
        before=("with torch.no_grad():\n"
                "    out = net(x)"),
        after=("with torch.no_grad():\n"
               "    out = cuda_graph_inference(net, x)"),
        compare=("out",),
        options={"rtol": 1e-4, "atol": 1e-5},
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.hot_kind() is not HotKind.ROLLOUT or is_test_path(self.ctx.path):
            return
        func = node.func
        if not isinstance(func, (cst.Name, cst.Attribute)) or self.ctx.evidence.is_module(func) is None:
            return
        if not (self.ctx.inside_with("torch.no_grad", "torch.inference_mode") or self.ctx.in_no_grad_function()):
            return
        if not any(self._one_row(arg.value) for arg in node.args) or not self.ctx.targets_cuda():
            return
        texts = related_texts(self.ctx)
        kernels = launches_per_forward(texts)
        if kernels < LAUNCH_BOUND_KERNELS or any(mentions(_USES_CUDA_GRAPHS, text) for text in texts.values()):
            return
        replacements, imports = (), ()
        if node.args and all(arg.keyword is None and not arg.star for arg in node.args):
            if not self._defines_helper():
                torch_name, torch_import = self.ctx.spell("torch")
                weakref_name, weakref_import = self.ctx.spell("weakref")
                warnings_name, warnings_import = self.ctx.spell("warnings")
                imports = (*torch_import, *weakref_import, *warnings_import,
                           DefinitionRequest(HELPER, helper_source(torch_name, weakref_name, warnings_name)))
            call = node.with_changes(func=cst.Name(HELPER), args=[
                cst.Arg(func, comma=cst.MaybeSentinel.DEFAULT), *node.args])
            replacements = ((node, call),)
        self.report(node, f"`{dotted_name(func) or 'network'}(...)` runs one observation/position per call in a "
                          f"rollout or search loop (about {kernels} kernels launched one by one from Python per "
                          "forward): replay it from a CUDA graph, or evaluate many positions per call",
                    replacements=replacements, imports=imports)

    def _one_row(self, value: cst.BaseExpression) -> bool:
        """The input was given a batch axis of one here or where its name was last bound in this function."""
        if _ONE_ROW.search(self.ctx.code(value)):
            return True
        if not isinstance(value, cst.Name):
            return False
        function = self.ctx.enclosing(cst.FunctionDef) or self.ctx.module
        for assign in walk(function, into_functions=False):
            if isinstance(assign, cst.Assign) and any(
                    isinstance(n, cst.Name) and n.value == value.value
                    for target in assign.targets for n in walk(target.target, into_functions=False)):
                if _ONE_ROW.search(self.ctx.code(assign.value)):
                    return True
        return False

    def _defines_helper(self) -> bool:
        return any(isinstance(s, cst.FunctionDef) and s.name.value == HELPER for s in self.ctx.module.body)
