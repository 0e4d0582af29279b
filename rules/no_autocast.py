import re

import libcst as cst

from gpulint import HotKind, Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import TENSOR_FACTORIES, Evidence, child_nodes, dotted_name, method_name, walk
from gpulint.network_size import network_size, small_work_per_step, work_per_step
from gpulint.pins import torch_pinned_below
from gpulint.program import current_text, linked_texts, mentions, reach_texts, site_program_texts
from gpulint.rule import is_test_path
from gpulint.semantic.modules import module_like
from gpulint.semantic.precision import (precision_switched_off, runs_in_fp64, runs_on_cuda,
                                       uses_low_precision)

_STEP_KINDS = (HotKind.STEP_LOOP, HotKind.STEP_FUNCTION)
# the script picks its device at run time: the autocast fix follows the script's device variable
_PICKS_DEVICE = re.compile(r"""["']--?device["']|\bcuda\.is_available\(\)""")
# custom kernels may lack autocast support; RPC runs the forward on remote workers, outside the context
_CUSTOM_KERNELS = re.compile(r"cpp_extension|load_inline|\btriton\b|torch\.ops\.|cupy|numba|distributed\.rpc|"
                             r"distributed\.autograd|dist_autograd")
# Reinforcement learning: small policy/value networks, launch-bound steps (catalog F10: autocast made an RL MLP
# step 0.80x as fast on an H100)
_RL = re.compile(r"^\s*(import|from)\s+(gym|gymnasium|envpool|pettingzoo|procgen|isaacgym|isaacgymenvs|dm_control|"
                 r"stable_baselines3|sb3_contrib|minigrid|ale_py|brax|mujoco|pybullet_envs)\b", re.M)
# raise "unsafe to autocast" inside a CUDA autocast region
_AUTOCAST_UNSAFE_LOSS = re.compile(r"\bBCELoss\(|\bbinary_cross_entropy\(")
_FRAMEWORK_BACKWARD = re.compile(r"accelerator|fabric|engine|trainer|manual_backward|strategy", re.I)
_MODEL_NAME = re.compile(
    r"model|net|policy|actor|critic|encoder|decoder|generator|discriminator|backbone|classifier|transformer|"
    r"gpt|bert|unet|vae|agent|module|vgg|resnet|vit|cnn|mlp|rnn|lstm|gru|head|trunk|extractor|^G$|^D$|^self$|forward",
    re.I)
_DATA_PREP_CALLS = {"to", "cuda", "float", "long", "int", "bool", "view", "reshape", "permute", "unsqueeze",
                    "squeeze", "contiguous", "pin_memory", "flatten", "detach", "clone", "size", "len", "next",
                    "iter", "enumerate", "range", "tuple", "list", "zip", "get", "items", "keys", "values",
                    "from_numpy", "tensor", "as_tensor", "stack", "cat", "transpose", "numel", "type", "split",
                    "chunk", "expand", "repeat", "pack_padded_sequence", "pad_sequence", "one_hot",
                    "requires_grad_"} | TENSOR_FACTORIES  # factories ignore autocast
_NEUTRAL_CALLS = {"zero_grad", "print", "info", "debug", "log", "set_description", "set_postfix", "update_lr",
                  "train", "tic", "toc", "record", "start", "append"}


class NoAutocast(Rule):
    """
    ## What it does
    Finds CUDA training steps (a loop or step function that calls `.backward()`) that run the forward pass
    in fp32: no `torch.autocast`, no `.half()`/`.bfloat16()` model, no low-precision dtype, no
    Accelerate/Lightning/DeepSpeed precision setting anywhere in the program. The program is taken from
    the files named on the command line: the training file, the files it imports or that import it
    (transitively), what the entry scripts importing it import, and the library (non-entry) modules of its
    folder; an unrelated entry script of the same folder does not count.

    It fires only where the program shows enough work per step for bf16 to pay. The work is estimated from
    the layers and batch shapes the program writes (`gpulint.network_size.work_per_step`): rows (batch size
    times sequence length, from a length setting or a learned positional table `nn.Parameter(torch.zeros(1,
    L, d))`; the batch alone for recurrent layers, which run one time step per kernel; batch times 16x16
    assumed positions for convolutions) times the widths either side of the largest GEMM or convolution.
    Measured on an H100, bf16 autocast was slower than fp32 up to about 1e8 multiply-adds per kernel (a
    784-500-10 MLP at batch 100, an LSTM of hidden size 1024 at 20 rows per time step); the rule offers it
    from 2.7e8 (a 256-wide transformer encoder on 4,096 rows is 1.1e9); the finding's note gives the estimate. Where no
    batch size or width is written, it falls back to widths: a literal width or width setting above 256, or
    a torchvision/timm/transformers model. Reinforcement-learning programs (importing gym, envpool, ...),
    whose networks are mostly small, need the estimate itself, from the nearest code that shows layers and a
    batch size (the file, what it imports, the files its program certainly loads; a
    ResNet trained on batches of 1,024 positions is reported, a 256-wide MLP is not). fp64 code (torch.float64
    in code, not in a docstring), code with custom CUDA/Triton kernels and test files are skipped. A project whose
    requirement files pin torch below 1.10 (no `torch.autocast`) gets the finding without a fix. It also reports `model.half()` combined with autocast in the same training function (the AMP
    docs: do not call `.half()` on the model when using autocast), without a fix.

    ## Why is this slow
    fp32 matmuls and convolutions use a fraction of the tensor-core throughput and twice the memory traffic
    of bf16. The PyTorch tuning guide quotes up to 3x overall speedup on Volta and newer; measured on an
    H100, a 6-layer d1024 transformer step is 5.79x faster with bf16 autocast than fp32 (2.2x faster than
    TF32). For a small RL MLP (64-256-256-18) autocast made the step slower (0.80x), which is why small
    networks are skipped.

    ## Example
    ```python
    for x, y in loader:
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = criterion(out, y)
        loss.backward()
        optimizer.step()
    ```
    Backward and the optimizer step stay outside the context (AMP docs: "autocast should wrap only the
    forward pass(es) of your network, including the loss computation"). bf16 keeps fp32's exponent range,
    so no GradScaler is needed. GPUs without bf16 (pre-Ampere) need fp16 with `torch.amp.GradScaler`.

    ## Fix safety
    Unsafe: it changes numerics (bf16 matmuls, about 3 significant digits; reductions, softmax and losses
    stay in fp32 per the autocast op lists). The fix wraps the contiguous statements that compute the loss
    from the model output (found by following the loss variable back to the forward call, skipping data
    moves at the start); when they cannot be isolated from the backward (`criterion(model(x), y).backward()`)
    the finding has no fix. The context follows the script's own device: `device_type=device.type,
    enabled=device.type == "cuda"` when the step copies its batches with `.to(device)` (a script run with
    `--device cpu` keeps fp32), `device_type="cuda"` when it names no device variable.
    """

    code = "GPU023"
    name = "no-autocast"
    message = "CUDA training step runs the forward in fp32; use bf16 autocast"
    fix_title = 'Wrap the forward and loss in `torch.autocast(device_type="cuda", dtype=torch.bfloat16)`'
    severity = Severity.INFO
    safety = Safety.UNSAFE
    priority = "P1"
    triggers = ("backward",)
    examples = [
        Valid(  # an MLP of width 512 on batches of 64 rows: launch-bound, bf16 autocast measured slower
            """
            import torch
            import torch.nn as nn
            in_features, hidden_size = 784, 512
            batch_size = 64
            class MLP(nn.Module):
                def __init__(self, in_features, hidden_size, classes=10):
                    super().__init__()
                    self.body = nn.Sequential(nn.Linear(in_features, hidden_size), nn.ReLU(),
                                              nn.Linear(hidden_size, classes))
                def forward(self, x):
                    return self.body(x)
            model = MLP(in_features, hidden_size).cuda()
            loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, pin_memory=True, num_workers=2)
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(
            """
            model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).cuda()
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # small network: autocast would slow it down
            """
            policy = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4)).to("cuda")
            for step in range(1000):
                loss = policy(obs).pow(2).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # low precision elsewhere in the program
            """
            model = Net(hidden_size=1024).cuda().bfloat16()
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F

            model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).cuda()
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                optimizer.zero_grad()
                # forward
                out = model(x)
                loss = F.cross_entropy(out, y)  # mean over the batch
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            import torch.nn.functional as F

            model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).cuda()
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                optimizer.zero_grad()
                # forward
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    out = model(x)
                    loss = F.cross_entropy(out, y)  # mean over the batch
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(  # the forward cannot be separated from backward: reported without a fix
            """
            model = torchvision.models.resnet50().cuda()
            for x, y in loader:
                criterion(model(x.cuda()), y.cuda()).backward()
                optimizer.step()
            """
        ),
        Invalid(  # the script picks its device: the context follows it, and stays off on the CPU
            """
            import argparse
            import torch
            import torch.nn as nn
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cuda")
            args = parser.parse_args()
            device = torch.device(args.device)
            model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
            batch_size = 512
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            fixed="""
            import argparse
            import torch
            import torch.nn as nn
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cuda")
            args = parser.parse_args()
            device = torch.device(args.device)
            model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
            batch_size = 512
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
            """,
        ),
        Valid(  # launch-bound: 64 rows x 512 x 512 per GEMM is far below what bf16 needs to pay
            """
            import torch
            import torch.nn as nn
            model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
            batch_size = 64
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
        Invalid(  # BCELoss raises inside an autocast region: reported without a fix
            """
            import torch.nn as nn
            model = torchvision.models.resnet50().cuda()
            bce = nn.BCELoss()
            for x, y in loader:
                out = model(x.cuda()).sigmoid()
                loss = bce(out, y.cuda())
                loss.backward()
                optimizer.step()
            """
        ),
    ]
    # CPU proxy of the catalog check: bf16 autocast on the snippet's device (`device` is set by the verifier).
    micro_check = MicroCheck(
        kinds=("EQ", "PERF"),
        setup="model = torch.nn.Linear(512, 512)\nx = torch.randn(64, 512)\ny = torch.randn(64, 512)",
        before=("out = model(x)\nloss = torch.nn.functional.mse_loss(out, y)\nloss.backward()\n"
                "value, g = loss.detach(), model.weight.grad"),
        after=('with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):\n'
               '    out = model(x)\n'
               '    loss = torch.nn.functional.mse_loss(out, y)\n'
               'loss.backward()\n'
               'value, g = loss.detach(), model.weight.grad'),
        compare=("value", "g"),
        options={"rtol": 2e-2, "atol": 1e-4,
                 "perf_setup": "model = torch.nn.Linear(4096, 4096)\nx = torch.randn(4096, 4096)\n"
                               "y = torch.randn(4096, 4096)"},
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._regions: list[cst.CSTNode] = []
        self._region_ancestors: dict[int, list[cst.CSTNode]] = {}
        self._halves: list[tuple[cst.Call, cst.CSTNode | None]] = []
        self._work_note: str | None = None
        self._opt_in_note: str | None = None  # the program's mixed precision is behind a switch that is off
        self._pinned_old = False

    def visit_For(self, node: cst.For) -> None:
        self._collect(node)

    def visit_While(self, node: cst.While) -> None:
        self._collect(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._collect(node)

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) == "half" and not node.args and isinstance(node.func, cst.Attribute) \
                and module_like(node.func.value, self.ctx):
            self._halves.append((node, self.ctx.enclosing(cst.FunctionDef)))

    def _collect(self, node: cst.CSTNode) -> None:
        if self.ctx.analysis.hot.get(id(node)) in _STEP_KINDS:
            self._regions.append(node)
            self._region_ancestors[id(node)] = list(self.ctx.ancestors)

    # -------------------------------------------------------------------------------------------------

    def finish(self) -> None:
        if not self._regions or is_test_path(self.ctx.path):
            return
        # `torch.autocast` and bf16 autocast arrived in torch 1.10: a project pinning an older torch is told so
        self._pinned_old = torch_pinned_below(self.ctx.path, (1, 10))
        self._half_with_autocast()
        guard = self.ctx.analysis.main_guard
        texts = site_program_texts(self.ctx, in_main_guard=guard is not None and all(
            any(a is guard for a in self._region_ancestors[id(region)]) for region in self._regions))
        joined = list(texts.values())
        if not runs_on_cuda(self.ctx, texts):
            return
        if any(mentions(_CUSTOM_KERNELS, t) for t in joined) or any(runs_in_fp64(t) for t in joined):
            return  # fp64 in code (a comment mentioning it runs nothing in fp64)
        opt_in = None
        if any(uses_low_precision(t) for t in joined):
            opt_in = precision_switched_off(self.ctx, texts)
            if opt_in is None:
                return  # mixed precision is in effect
        if any(mentions(_RL, t) for t in joined):
            # reinforcement learning: mostly small networks; only the work estimated from the nearest code that
            # shows it -- this file, what it imports, the files its program certainly loads -- may show otherwise
            # (not the conv net of a sibling script reached through a package that imports every script)
            work = None
            for nearest in ({self.ctx.path: texts[self.ctx.path]}, reach_texts(self.ctx), linked_texts(self.ctx)):
                work = work_per_step(nearest)
                if work is not None:
                    break
            if work is None:
                return
        else:
            work = work_per_step(texts)
        if work is not None:
            if not work.pays:
                return  # the step is launch-bound: bf16 casts cost more than the tensor cores give back
        elif network_size(texts) != "large" or small_work_per_step(texts):
            return
        self._work_note = work.explain() if work is not None else None
        if opt_in is not None:
            # the switch chooses the precision: autocast belongs behind it, not around every run (no fix)
            self._opt_in_note = "; ".join(filter(None, [
                f"mixed precision is opt-in ({opt_in}, off by default): the default run trains in fp32; make it "
                "the default or wrap the step in `torch.autocast` when the switch is on", self._work_note]))
        if any(isinstance(n, cst.Call) and (dotted_name(n.func) or "").endswith("autocast")
               for n in walk(self.ctx.module, into_functions=True)):
            return  # added since the run read the file (an earlier fix pass)
        for region in self._regions:
            self._check_region(region)


    def _half_with_autocast(self) -> None:
        """`model.half()` and an autocast region in the same training function (or both at module level)."""
        for call, function in self._halves:
            scope = function if function is not None else self.ctx.module
            for region in self._regions:
                if self._scope_of(region) is scope and _has_autocast(region, self.ctx):
                    self.report(call, "`.half()` on the model combined with autocast: keep fp32 weights under "
                                      "autocast (AMP docs: do not call `.half()` when using autocasting)")
                    break

    def _scope_of(self, region: cst.CSTNode) -> cst.CSTNode:
        if isinstance(region, cst.FunctionDef):
            return region
        best: cst.CSTNode = self.ctx.module
        for node in walk(self.ctx.module, into_functions=True):
            if isinstance(node, cst.FunctionDef) and any(n is region for n in walk(node.body, into_functions=True)):
                best = node
        return best

    def _check_region(self, region: cst.CSTNode) -> None:
        parents = _parent_map(region)
        backwards = [c for c in _calls_in_region(region, self.ctx) if _is_backward(c, self.ctx)]
        if not backwards:
            return
        if any(_FRAMEWORK_BACKWARD.search(dotted_name(c.func) or "") for c in backwards):
            return
        if self._opt_in_note is not None:
            if any(_scaled(call) for call in backwards):
                return  # `scaler.scale(loss).backward()`: the switched-on (mixed-precision) path, not the fp32 one
            self.report(_statement_of(backwards[0], parents, region) or backwards[0], note=self._opt_in_note)
            return
        if self._pinned_old:
            self.report(_statement_of(backwards[0], parents, region) or backwards[0],
                        note="the project pins torch below 1.10, which has no `torch.autocast`: upgrade torch first"
                             + (f"; {self._work_note}" if self._work_note else ""))
            return
        plans: dict[int, tuple[cst.IndentedBlock, list[tuple[int, int]]]] = {}
        ok = True
        self._evidence = Evidence(self.ctx.analysis, self._region_ancestors.get(id(region), []) + [region])
        for call in backwards:
            found = self._range_for(call, region, parents)
            if found is None:
                ok = False
                break
            block, start, end = found
            plans.setdefault(id(block), (block, []))[1].append((start, end))
        first_statement = None
        if ok:
            for key, (block, ranges) in list(plans.items()):
                merged = _merge(ranges)
                barrier = {i for i, s in enumerate(block.body) if _contains_step(s)}
                if merged is None or any(start <= i <= end for start, end in merged for i in barrier):
                    ok = False
                    break
                plans[key] = (block, merged)
                candidate = block.body[merged[0][0]]
                if first_statement is None or self.ctx.analysis.order.get(id(candidate), 0) < \
                        self.ctx.analysis.order.get(id(first_statement), 0):
                    first_statement = candidate
        if not ok or first_statement is None:
            self.report(_statement_of(backwards[0], parents, region) or backwards[0], note=self._work_note)
            return
        if _AUTOCAST_UNSAFE_LOSS.search(current_text(self.ctx)):  # built anywhere in the file, called here
            self.report(first_statement, note="`BCELoss` / `binary_cross_entropy` raise under autocast: switch to "
                                              "`BCEWithLogitsLoss` on logits, then wrap the step"
                                              + (f"; {self._work_note}" if self._work_note else ""))
            return
        autocast, imports_a = self.ctx.spell("torch.autocast")
        bf16, imports_b = self.ctx.spell("torch.bfloat16")
        device_type, imports_c = self._device_type(region)
        enabled = "" if device_type == '"cuda"' else f', enabled={device_type} == "cuda"'  # CPU runs stay fp32
        template = cst.parse_statement(f'with {autocast}(device_type={device_type}, dtype={bf16}{enabled}):\n'
                                       f'    pass\n')
        assert isinstance(template, cst.With)
        new_region = region.visit(_Wrap({k: v[1] for k, v in plans.items()}, template))
        self.report(first_statement, replacements=[(region, new_region)],
                    imports=tuple(dict.fromkeys(imports_a + imports_b + imports_c)), note=self._work_note)

    def _device_type(self, region: cst.CSTNode) -> tuple[str, tuple]:
        """`device_type=` that follows the script's own device when the script picks it at run time (a
        `--device` option, or `torch.cuda.is_available()`): `device.type` when the step copies its batches with
        `.to(device)` and `device` is bound to `torch.device(...)` in the step's scope (or at module level and
        not shadowed by a parameter), else `torch.device(device).type` (right for a string and a
        `torch.device` alike). The region is then enabled on CUDA only, so a CPU run keeps its fp32 numerics
        and speed. `"cuda"` for a script that only runs on CUDA or names no device variable (`.cuda()`)."""
        if not _PICKS_DEVICE.search(self.ctx.program.sources.get(self.ctx.path) or self.ctx.module.code):
            return '"cuda"', ()
        scope = self._scope_of(region)
        for node in walk(region, into_functions=False):
            if not (isinstance(node, cst.Call) and method_name(node) == "to"):
                continue
            arg = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "device"),
                       node.args[0].value if node.args and node.args[0].keyword is None else None)
            name = dotted_name(arg) if isinstance(arg, (cst.Name, cst.Attribute)) else None
            if name is None or not re.search(r"device|dev$", name.rsplit(".", 1)[-1], re.I):
                continue  # a dtype (`.to(torch.float16)`) or no device variable
            if self._bound_to_torch_device(name, scope):
                return f"{name}.type", ()
            torch_device, imports = self.ctx.spell("torch.device")
            return f"{torch_device}({name}).type", imports
        return '"cuda"', ()

    def _bound_to_torch_device(self, name: str, scope: cst.CSTNode) -> bool:
        def bound_in(root: cst.CSTNode) -> bool:
            return any(isinstance(node, cst.Assign) and isinstance(node.value, cst.Call)
                       and self.ctx.qualname(node.value.func) == "torch.device"
                       and any(dotted_name(t.target) == name for t in node.targets)
                       for node in walk(root, into_functions=False))

        if bound_in(scope):
            return True
        if isinstance(scope, cst.FunctionDef) and name.split(".")[0] in {
                p.name.value for p in (*scope.params.params, *scope.params.kwonly_params,
                                       *scope.params.posonly_params)}:
            return False  # a parameter: callers may pass a string
        return bound_in(self.ctx.module)

    def _range_for(self, call: cst.Call, region: cst.CSTNode,
                   parents: dict[int, cst.CSTNode]) -> tuple[cst.IndentedBlock, int, int] | None:
        loss = _loss_name(call, self.ctx)
        if loss is None:
            return None
        node: cst.CSTNode = call
        while node is not region:
            parent = parents.get(id(node))
            if parent is None:
                return None
            if isinstance(parent, cst.IndentedBlock):
                index = next(i for i, s in enumerate(parent.body) if s is node)
                found = self._range_in_block(parent, index, loss)
                if found is not None:
                    return (parent, *found)
                if _assigns_in(parent.body[:index], loss):
                    return None  # assigned in this block, but not in a way we can isolate
            node = parent
        return None

    def _range_in_block(self, block: cst.IndentedBlock, anchor: int, loss: str) -> tuple[int, int] | None:
        statements = block.body
        end = next((j for j in range(anchor - 1, -1, -1)
                    if isinstance(statements[j], cst.SimpleStatementLine) and loss in _assigned(statements[j])),
                   None)
        if end is None:
            return None
        needed = _loaded(statements[end])
        start = end
        for j in range(end - 1, -1, -1):
            statement = statements[j]
            if _contains_step(statement) or isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                break
            assigned = _assigned(statement)
            if assigned & needed:
                needed |= _loaded(statement)
                start = j
            elif not _is_neutral(statement):
                break
        while start < end and (_is_data_prep(statements[start]) or _is_neutral(statements[start])):
            start += 1
        if not any(self._is_forward(c) for s in statements[start:end + 1] for c in _calls(s)):
            return None
        return start, end

    def _is_forward(self, call: cst.Call) -> bool:
        name = dotted_name(call.func) or ""
        if name.rsplit(".", 1)[-1] in _DATA_PREP_CALLS | _NEUTRAL_CALLS:
            return False
        parts = name.split(".")
        if any(_MODEL_NAME.search(part) for part in parts[:1] + parts[-1:]) or name == "self":
            return True
        evidence = self._evidence
        for candidate in [call.func, *(a.value for a in call.args)]:
            if isinstance(candidate, (cst.Name, cst.Attribute)):
                if _MODEL_NAME.search((dotted_name(candidate) or "").rsplit(".", 1)[-1]):
                    return True
                if isinstance(candidate, cst.Name) and evidence.is_module(candidate):
                    return True
        return False


# ---------------------------------------------------------------------------------------------------
# syntax helpers


def _parent_map(root: cst.CSTNode) -> dict[int, cst.CSTNode]:
    parents: dict[int, cst.CSTNode] = {}
    for node in walk(root, into_functions=True):
        for child in child_nodes(node):
            parents[id(child)] = node
    return parents


def _calls_in_region(region: cst.CSTNode, ctx) -> list[cst.Call]:
    """Calls of the region's own body: not in nested defs, nor in nested loops that are hot regions themselves."""
    found = []
    stack = list(child_nodes(region))
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if isinstance(node, (cst.For, cst.While)) and ctx.analysis.hot.get(id(node)) in _STEP_KINDS:
            continue
        if isinstance(node, cst.Call):
            found.append(node)
        stack.extend(child_nodes(node))
    return found


def _is_backward(call: cst.Call, ctx) -> bool:
    return method_name(call) == "backward" or ctx.qualname(call.func) == "torch.autograd.backward"


def _loss_name(call: cst.Call, ctx) -> str | None:
    """`loss.backward()`, `(loss / n).backward()`, `loss.mean().backward()`, `torch.autograd.backward(loss)`."""
    if ctx.qualname(call.func) == "torch.autograd.backward":
        target = call.args[0].value if call.args else None
    elif isinstance(call.func, cst.Attribute):
        if any(a.keyword is None for a in call.args):
            return None  # `x.backward(loss)`: a framework helper, or an explicit gradient
        target = call.func.value
    else:
        return None
    for _ in range(4):
        if isinstance(target, cst.BinaryOperation):
            target = target.left
        elif isinstance(target, cst.Call) and method_name(target) in ("mean", "sum", "float") \
                and isinstance(target.func, cst.Attribute):
            target = target.func.value
        else:
            break
    if isinstance(target, (cst.Name, cst.Attribute)):
        return dotted_name(target)
    return None


def _statement_of(node: cst.CSTNode, parents: dict[int, cst.CSTNode], region: cst.CSTNode) -> cst.CSTNode | None:
    while node is not region:
        parent = parents.get(id(node))
        if parent is None:
            return None
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return node
        node = parent
    return None


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(e.value) for e in target.elements)) if target.elements else set()
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    name = dotted_name(target)
    return {name} if name else set()


def _assigned(statement: cst.CSTNode) -> set[str]:
    names: set[str] = set()
    for node in walk(statement, into_functions=True):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                names |= _target_names(target.target)
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
            names |= _target_names(node.target)
        elif isinstance(node, cst.NamedExpr):
            names |= _target_names(node.target)
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
    return names


def _assigns_in(statements, name: str) -> bool:
    return any(name in _assigned(s) for s in statements)


def _loaded(statement: cst.CSTNode) -> set[str]:
    names: set[str] = set()
    for node in walk(statement, into_functions=True):
        if isinstance(node, cst.Name):
            names.add(node.value)
        elif isinstance(node, cst.Attribute):
            dotted = dotted_name(node)
            if dotted:
                names.add(dotted)
    return names


def _calls(statement: cst.CSTNode) -> list[cst.Call]:
    return [n for n in walk(statement, into_functions=True) if isinstance(n, cst.Call)]


def _contains_step(statement: cst.CSTNode) -> bool:
    for call in _calls(statement):
        if method_name(call) in ("backward", "step") or (dotted_name(call.func) or "").endswith("autograd.backward"):
            return True
    return False


def _call_name(call: cst.Call) -> str:
    return method_name(call) or (dotted_name(call.func) or "").rsplit(".", 1)[-1]


def _is_neutral(statement: cst.CSTNode) -> bool:
    """`optimizer.zero_grad()`, `print(...)`, logging: harmless inside or outside the autocast region."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, cst.Pass):
            continue
        if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
                and _call_name(small.value) in _NEUTRAL_CALLS):
            return False
    return True


def _is_data_prep(statement: cst.CSTNode) -> bool:
    """Fetching/unpacking a batch and moving it to the device (`batch = next(it)` in a `try`, `x = x.to(d)`):
    not part of the forward."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return False
    return all(_call_name(call) in _DATA_PREP_CALLS for call in _calls(statement))


def _scaled(backward: cst.Call) -> bool:
    """`scaler.scale(loss).backward()`: a backward through a gradient scaler."""
    receiver = backward.func.value if isinstance(backward.func, cst.Attribute) else None
    return isinstance(receiver, cst.Call) and method_name(receiver) == "scale"


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(set(ranges)):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _has_autocast(region: cst.CSTNode, ctx) -> bool:
    for node in walk(region, into_functions=True):
        if isinstance(node, cst.With):
            for item in node.items:
                expr = item.item.func if isinstance(item.item, cst.Call) else item.item
                if (ctx.qualname(expr) or dotted_name(expr) or "").endswith("autocast"):
                    return True
    return False


class _Wrap(cst.CSTTransformer):
    """Wrap statement ranges of given blocks (by identity of the original block) in a `with` template."""

    def __init__(self, plans: dict[int, list[tuple[int, int]]], template: cst.With) -> None:
        super().__init__()
        self.plans = plans
        self.template = template

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        ranges = self.plans.get(id(original_node))
        if not ranges:
            return updated_node
        body = list(updated_node.body)
        for start, end in sorted(ranges, reverse=True):
            wrapped = body[start:end + 1]
            first = wrapped[0]
            inner = [first.with_changes(leading_lines=())] + wrapped[1:]
            block = self.template.body.with_changes(body=inner)
            body[start:end + 1] = [self.template.with_changes(body=block, leading_lines=first.leading_lines)]
        return updated_node.with_changes(body=body)
