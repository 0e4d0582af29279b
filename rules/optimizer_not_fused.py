from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, MicroCheck, Rule, Safety, Severity, Valid
from gpulint.analysis import (
    CUDA_TEXT_PATTERN,
    BindingKind,
    call_arg,
    child_nodes,
    dotted_name,
    method_name,
    string_value,
    walk,
)
from gpulint.builders import add_keyword
from gpulint.pins import torch_pinned_below
from gpulint.program import mentions
from gpulint.rule import is_test_path
from gpulint.semantic.placement import HOST, Placement
from gpulint.semantic.program_text import program_texts

# Adagrad is left out: its fused kernel gained CUDA support only recently (torch 2.11 on an H200 raises
# "`fused=True` requires all the params to be floating point Tensors of supported devices: ['mps', 'xpu', ...]").
# The torch release whose optimizer first takes `fused=` (Adam: 1.13 with CUDA-only limits; SGD: 2.2).
_FUSED_SINCE = {"torch.optim.Adam": (2, 0), "torch.optim.AdamW": (2, 0), "torch.optim.SGD": (2, 2)}
# Arguments that conflict with `fused=True` (RuntimeError) or show the implementation was chosen on purpose.
_CONFLICTS = ("fused", "foreach", "differentiable", "capturable")
# complex parameters (complex activations, e.g. FFTs or rotary embeddings, do not matter)
_COMPLEX_PARAMETER = re.compile(r"Parameter\([^\n]*\btorch\.(complex32|complex64|complex128|cfloat|cdouble|chalf)\b")
# CUDA text evidence, including the device-generic API (torch >= 2.6) and NCCL: CUDA on NVIDIA machines
_CUDA_TEXT = re.compile(
    CUDA_TEXT_PATTERN + r"""|\btorch\.accelerator\.|["']nccl["']""")
# layers that produce sparse gradients (a `sparse=True` elsewhere, in a help string, is no such layer)
_SPARSE_GRADS = re.compile(r"\b(?:Embedding|EmbeddingBag|embedding|embedding_bag)\([^)]*\bsparse\s*=\s*True\b|"
                           r"\bsparse_grad\s*=\s*True\b")
_GRAD_SCALER = re.compile(r"\bGradScaler\b")
_XLA = re.compile(r"\btorch_xla\b")
# Modules built on the device without a visible move: a default-device context or setting.
_DEFAULT_DEVICE = re.compile(r"set_default_device\(|with\s+torch\.device\(|device_map\s*=")
# Wrappers that put a module's parameters on a device (or shard them there).
_DEVICE_WRAPPERS = {"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "DataParallel",
                    "fully_shard", "FSDPModule"}
# Calls that receive a module but do not move it (or keep a reference that could).
_HARMLESS_CALLS = {"print", "len", "str", "repr", "isinstance", "type", "id", "hasattr", "getattr", "vars",
                   "format", "deepcopy", "count_parameters", "summary"}


class OptimizerNotFused(Rule):
    """
    ## What it does
    Finds `torch.optim.Adam`, `AdamW` and `SGD` built without `fused=` (and without `foreach=`) in a program
    that trains on CUDA, also through a name the class was bound to (`optimizer_fn = torch.optim.SGD`), and adds
    `fused=True`. (`Adagrad` is not included: its fused kernel rejects CUDA
    parameters in torch 2.11.)

    ## Why is this slow
    By default these optimizers use the `foreach` implementation: a few multi-tensor kernels per update
    phase, with intermediate tensors. The fused implementation does the whole update of each parameter in
    one kernel. Measured on an H100, `AdamW.step` over 105M parameters in 200 tensors: for-loop 13.70 ms,
    foreach (the default) 3.24 ms, fused 1.19 ms. With `fused=True`, `GradScaler.step` also skips its
    `.item()` host sync. End to end the gain is small but free (torchtitan: +2.6% on Llama-8B).

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    ```

    ## Fix safety
    Unsafe: the fused kernel rounds differently, so parameters are equal to about 1e-7 relative, not bitwise
    (AdamW, 50 steps). `fused=True` raises for complex parameters, sparse gradients, and together with
    `foreach=True` or `differentiable=True`; the rule does not fire when any of `fused=`, `foreach=`,
    `differentiable=` or `capturable=` is given, nor in test files (which may compare parameters bitwise with
    a reference run), and offers no fix where the program creates complex parameters or also runs on XLA.
    Projects whose requirement files pin a torch without `fused=` for that optimizer (Adam/AdamW before 2.0,
    SGD before 2.2) are not reported; plain SGD without momentum is already one kernel and is not reported.
    Before torch 2.4 `fused=True` raises at construction when the parameters are still on the CPU: a model
    moved after the optimizer is built gets the finding without a fix. The rule does not fire when the
    optimizer's parameters come from `X.parameters()` of a module `X` built in the same scope (a `torch.nn`
    layer or a class or factory of this file) that is never moved to a device (`.cuda()`, `.to(device)`,
    `device=`, DDP/FSDP) nor handed to code that could move it: that optimizer runs on the CPU.
    """

    code = "GPU032"
    name = "optimizer-not-fused"
    message = "Optimizer without `fused=True` in a CUDA program; the fused update kernel is ~2.7x faster"
    fix_title = "Add `fused=True`"
    severity = Severity.INFO
    safety = Safety.UNSAFE
    priority = "P2"
    triggers = ("Adam", "SGD")
    examples = [
        Valid(  # SAC's temperature: one CPU scalar, stepped on the host (`fused=True` would need it on the GPU)
            """
            import torch
            class Agent:
                def __init__(self, actor, device):
                    self.actor = actor.to(device)
                    self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=3e-4, fused=True)
                    self.log_alpha = torch.tensor([0.0], requires_grad=True)
                    self.alpha_optimizer = torch.optim.Adam(params=[self.log_alpha], lr=3e-4)
            """
        ),
        Invalid(  # a container of modules moved through another container (knowledge distillation's lists)
            """
            import torch
            from torch import nn
            student, teacher = nn.Linear(8, 8), nn.Linear(8, 8)
            trainable = nn.ModuleList([])
            trainable.append(student)
            everything = nn.ModuleList([student, teacher])
            everything.cuda()
            optimizer = torch.optim.SGD(trainable.parameters(), lr=0.1, momentum=0.9)  # error: GPU032
            """,
            fixed="""
            import torch
            from torch import nn
            student, teacher = nn.Linear(8, 8), nn.Linear(8, 8)
            trainable = nn.ModuleList([])
            trainable.append(student)
            everything = nn.ModuleList([student, teacher])
            everything.cuda()
            optimizer = torch.optim.SGD(trainable.parameters(), lr=0.1, momentum=0.9, fused=True)  # error: GPU032
            """,
        ),
        Valid(  # sparse embedding gradients: fused SGD raises on them
            """
            import torch
            from torch import nn
            model = nn.Embedding(1000, 64,
                                 sparse=True).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            """
        ),
        Valid(  # plain SGD (no momentum): already one kernel per step, fused gains nothing measurable
            """
            import torch
            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
        Valid(
            """
            import torch
            model = Net().cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
            """
        ),
        Valid(  # foreach chosen explicitly
            """
            import torch
            model = Net().to("cuda")
            optimizer = torch.optim.Adam(model.parameters(), foreach=False)
            """
        ),
        Valid(  # no CUDA in the program
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """
        ),
        Valid(  # a CPU-only module in a CUDA program: it only feeds a learning-rate plot
            """
            import torch

            def plot_schedule():
                dummy_model = torch.nn.Linear(1, 1)
                optimizer = torch.optim.Adam(dummy_model.parameters(), lr=1, betas=(0.9, 0.98))
                for step in range(100):
                    optimizer.step()

            def train():
                model = Net().cuda()
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
            """
        ),
        Valid(  # a model built by a factory of this file and trained on the CPU (passed to a CPU-only helper)
            """
            import torch
            import torch.nn as nn

            def make_model(n):
                model = nn.Sequential(nn.Linear(n, n), nn.ReLU(), nn.Linear(n, n))
                for p in model.parameters():
                    nn.init.xavier_uniform_(p) if p.dim() > 1 else None
                return model

            def run_epoch(batches, model, optimizer):
                for x, y in batches:
                    loss = (model(x) - y).pow(2).mean()
                    loss.backward()
                    optimizer.step()

            def copy_task():
                model = make_model(11)
                optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.5)
                run_epoch(data_gen(11), model, optimizer)

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            """
        ),
        Invalid(
            """
            import torch
            from torch import optim
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            optimizer = optim.Adam(model.parameters(), lr=1e-3)
            """,
            fixed="""
            import torch
            from torch import optim
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            optimizer = optim.Adam(model.parameters(), lr=1e-3, fused=True)
            """,
        ),
        Invalid(  # the class picked into a name, then called (in a nested helper)
            """
            import torch
            def train(G, D, lr):
                G, D = G.cuda(), D.cuda()
                optimizer = torch.optim.Adam
                def get_optimizers(lr):
                    return optimizer(G.parameters(), lr=lr), optimizer(D.parameters(), lr=lr)
                return get_optimizers(lr)
            """,
            fixed="""
            import torch
            def train(G, D, lr):
                G, D = G.cuda(), D.cuda()
                optimizer = torch.optim.Adam
                def get_optimizers(lr):
                    return optimizer(G.parameters(), lr=lr, fused=True), optimizer(D.parameters(), lr=lr, fused=True)
                return get_optimizers(lr)
            """,
        ),
        Invalid(  # one branch picks the foreach (`_multi_tensor`) variant, which raises with fused=True: no fix
            """
            import torch
            def construct_optimizer(model, cfg):
                model = model.cuda()
                if cfg.MTA:
                    optimizer_fn = torch.optim._multi_tensor.SGD
                else:
                    optimizer_fn = torch.optim.SGD
                return optimizer_fn(model.parameters(), lr=0.1, momentum=0.9)
            """
        ),
        Invalid(  # the other branch picks bitsandbytes' 8-bit AdamW, which takes no fused=: reported without a fix
            """
            import torch
            unet = UNet().to("cuda")
            if args.use_8bit_adam:
                import bitsandbytes as bnb
                optimizer_class = bnb.optim.AdamW8bit
            else:
                optimizer_class = torch.optim.AdamW
            optimizer = optimizer_class(unet.parameters(), lr=args.learning_rate)
            """
        ),
        Invalid(  # moved after the optimizer is built: reported without a fix (torch < 2.4 raises at construction)
            """
            import torch

            def main(gpu):
                model = torch.nn.Linear(8, 8)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
                model.cuda(gpu)
                model = setup_distributed(model)
            """,
        ),
        Invalid(  # moved before, then handed to code that may move it again: fixed
            """
            import torch

            def main(gpu):
                model = setup_distributed(torch.nn.Linear(8, 8).cuda(gpu))
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            """,
            fixed="""
            import torch

            def main(gpu):
                model = setup_distributed(torch.nn.Linear(8, 8).cuda(gpu))
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            """,
        ),
    ]
    micro_check = MicroCheck(
        kinds=("EQ",),
        setup=(
            "torch.manual_seed(0)\n"
            "w0 = [torch.randn(64, 32), torch.randn(32)]\n"
            "grads = [[torch.randn_like(w) for w in w0] for _ in range(50)]\n"
            "def train(**kw):\n"
            "    params = [w.clone().requires_grad_() for w in w0]\n"
            "    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, **kw)\n"
            "    for g in grads:\n"
            "        for p, gi in zip(params, g):\n"
            "            p.grad = gi.clone()\n"
            "        opt.step()\n"
            "    return torch.cat([p.detach().flatten() for p in params])"
        ),
        before="params = train()",
        after="params = train(fused=True)",
        compare=("params",),
        options={"rtol": 1e-5, "atol": 1e-7},
    )

    def visit_Call(self, node: cst.Call) -> None:
        qualified = self.ctx.qualname(node.func) or self._aliased_class(node.func)
        if qualified not in _FUSED_SINCE:
            return
        if any(arg.star for arg in node.args) or any(call_arg(node, key) is not None for key in _CONFLICTS):
            return
        program = self.ctx.program
        if not _trains_on_cuda(self.ctx):
            return
        if is_test_path(self.ctx.path) or _stays_on_cpu(self.ctx, node):
            return  # the parameters belong to a module built here that never goes to a device
        if qualified == "torch.optim.SGD" and program.search(_SPARSE_GRADS):
            return  # sparse embeddings: fused raises on sparse gradients
        text = program.sources.get(self.ctx.path) or self.ctx.module.code
        if qualified == "torch.optim.SGD" and _no_momentum(node) and not _GRAD_SCALER.search(text):
            return  # plain SGD is already one foreach kernel: fused measured 0.94x-1.6x on an H100
        if torch_pinned_below(self.ctx.path, _FUSED_SINCE[qualified]):
            # the pinned torch has no `fused=` for this optimizer: the catalog's do-not-fire case, and blind labels
            # agree (reported with an upgrade note, these sites were 37 clear labels but 36 development traps and
            # 7 test-half traps)
            return
        if _XLA.search(text):
            self.report(node, note="the program also runs on XLA devices, where `fused=True` raises; pass it "
                                   "only on CUDA")
            return
        if program.search(_COMPLEX_PARAMETER):
            self.report(node, note="the program has complex parameters: `fused=True` raises for them")
            return
        if _moved_after(self.ctx, node):
            self.report(node, note="the model is moved to the GPU after the optimizer is built: before torch 2.4 "
                                   "`fused=True` raises for CPU parameters; build the optimizer after the move")
            return
        other = self._other_class_bound(node.func, qualified)
        if other is not None:
            why = "passes `foreach=True`, which raises with `fused=True`" if "_multi_tensor" in other \
                else "may not take `fused=`"
            self.report(node, note=f"the name may also hold `{other}`, which {why}: pass `fused=True` only where "
                                   f"it holds `{qualified}`")
            return
        self.report(node, replacement=add_keyword(node, "fused", "True"))

    def _class_bindings(self, func: cst.BaseExpression) -> set[str | None]:
        """What the bindings of the called name hold (`optimizer = torch.optim.Adam`, in this scope or an
        enclosing one), the `_multi_tensor` (foreach) variants under their class's name."""
        if not isinstance(func, cst.Name):
            return set()
        bindings = self.ctx.analysis.reaching_bindings(func.value, self.ctx.ancestors)
        return {(self.ctx.qualname(b.value) or "").replace("torch.optim._multi_tensor.", "torch.optim.") or None
                if b.kind is BindingKind.ASSIGN and b.value is not None else None for b in bindings}

    def _aliased_class(self, func: cst.BaseExpression) -> str | None:
        """The one optimizer class every binding of the called name holds: `optimizer(params, lr=...)` after
        `optimizer = torch.optim.Adam`."""
        classes = self._class_bindings(func)
        return classes.pop() if len(classes) == 1 else None

    def _other_class_bound(self, func: cst.BaseExpression, qualified: str) -> str | None:
        """Another class the called name is bound to before the call: `if args.use_8bit_adam: optimizer_class =
        bnb.optim.AdamW8bit else: optimizer_class = torch.optim.AdamW`, or a `torch.optim._multi_tensor` class."""
        if not isinstance(func, cst.Name):
            return None
        here = self.ctx.analysis.statement_order(self.ctx.ancestors)
        return next((self.ctx.code(b.value) for b in self.ctx.analysis.bindings_of(func.value, self.ctx.ancestors)
                     if b.kind is BindingKind.ASSIGN and b.value is not None and b.order < here
                     and self.ctx.qualname(b.value) != qualified), None)


def _no_momentum(call: cst.Call) -> bool:
    """`SGD(params, lr)` without momentum (absent or a literal 0)."""
    momentum = call_arg(call, "momentum", 2)
    return momentum is None or (isinstance(momentum.value, (cst.Integer, cst.Float))
                                and float(momentum.value.evaluated_value) == 0.0)


def _moved_after(ctx, call: cst.Call) -> bool:  # noqa: ANN001 - RuleContext
    """`opt = Adam(self.G.parameters())` followed by `self.cuda()` (or `.to(...)` of the same module or one
    holding it) later in the same function."""
    params = call_arg(call, "params", 0)
    if params is None:
        return False
    owners: set[str] = set()
    for inner in walk(params):
        if isinstance(inner, cst.Call) and method_name(inner) in ("parameters", "named_parameters") \
                and isinstance(inner.func, cst.Attribute):
            parts = (dotted_name(inner.func.value) or "").split(".")
            owners |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if parts[0]}
    scope = ctx.enclosing(cst.FunctionDef) or ctx.module
    after = False
    for node in walk(scope):
        if node is call:
            after = True
        elif after and isinstance(node, cst.Call) and method_name(node) in ("cuda", "to") \
                and dotted_name(node.func.value) in owners:  # type: ignore[attr-defined]
            return True
    return False


def _trains_on_cuda(ctx) -> bool:
    """CUDA evidence in this file or in its program (the files connected to it by imports): a CPU example in a
    repository of examples does not fire because a sibling script uses CUDA, nor a TPU script (torch_xla)."""
    analysis = ctx.analysis
    if analysis.cuda_evidence or analysis.maybe_cuda_evidence:
        return True
    if ctx.imports_xla():
        return False
    return any(mentions(_CUDA_TEXT, text) for text in program_texts(ctx))


# ---------------------------------------------------------------------------------------------
# where do the optimizer's parameters live?


_CONTAINERS = frozenset({"torch.nn.ModuleList", "torch.nn.ModuleDict", "torch.nn.ParameterList",
                         "torch.nn.ParameterDict", "torch.nn.Sequential"})


def _stays_on_cpu(ctx, call: cst.Call) -> bool:  # noqa: ANN001 - RuleContext
    """The parameters are `X.parameters()` (possibly in a list, a comprehension or param groups) of modules `X`
    that are all local names built in this file's scope on the CPU and never moved, wrapped or handed to code
    that could move them. Anything unresolved answers False (the rule then keeps reporting)."""
    params = call_arg(call, "params", 0)
    if params is None:
        return False
    if isinstance(params.value, (cst.List, cst.Tuple)) and params.value.elements and all(
            Placement(ctx).of(element.value) == HOST for element in params.value.elements):
        return True  # `Adam([self.log_alpha])` with `log_alpha = torch.zeros(1, requires_grad=True)`: CPU scalars
    receivers = [inner.func.value for inner in walk(params) if isinstance(inner, cst.Call)
                 and method_name(inner) in ("parameters", "named_parameters") and isinstance(inner.func, cst.Attribute)]
    if not receivers or not all(isinstance(r, cst.Name) for r in receivers):
        return False  # `self.model.parameters()`, a parameter list from elsewhere: not resolved here
    if any(mentions(_DEFAULT_DEVICE, text) for text in program_texts(ctx)):
        return False
    return all(_Placement(ctx).cpu_only(r.value, ctx.ancestors) for r in receivers)


class _Placement:
    def __init__(self, ctx) -> None:  # noqa: ANN001 - RuleContext
        self.ctx = ctx
        self.a = ctx.analysis
        self._seen: set[tuple[int, str]] = set()

    def cpu_only(self, name: str, ancestors) -> bool:  # noqa: ANN001
        scope = next((sc for sc in self.a.scope_chain(ancestors) if name in sc.bindings
                      and name not in sc.globals_), None)
        if scope is None:
            return False
        bindings = scope.bindings[name]
        if not bindings or any(b.kind is not BindingKind.ASSIGN or b.value is None for b in bindings):
            return False  # a parameter, a loop variable, an import, `with ... as model`
        if not all(self._built_on_cpu(b.value) for b in bindings):
            return False
        if scope.node is self.a.module and len(program_texts(self.ctx)) > 1:
            return False  # a module-level model: other files of the program can import and move it
        return not self._moved_in(scope.node, name, 0)

    # -- how the module was built -------------------------------------------------------------

    def _built_on_cpu(self, value: cst.BaseExpression) -> bool:
        """`torch.nn.Linear(1, 1)`, `make_model(...)` / `Net(...)` of this file: built on the CPU, no move."""
        if not isinstance(value, cst.Call):
            return False
        for inner in walk(value, into_functions=True):
            if isinstance(inner, cst.Call) and (method_name(inner) in ("cuda", "to", "to_empty") or any(
                    a.keyword is not None and a.keyword.value in ("device", "device_map") for a in inner.args)):
                return False  # Net().cuda(), nn.Linear(1, 1, device="cuda")
        qual = self.a.call_qualname(value) or ""
        if qual in _CONTAINERS:
            # its parameters are those of the modules put in it (`trainable.append(student)`), which may be moved
            # through another container or name (`modules.cuda()`): built on the CPU only when made of layers
            return qual == "torch.nn.Sequential" and all(
                isinstance(a.value, cst.Call) and (self.a.call_qualname(a.value) or "").startswith("torch.nn.")
                for a in value.args)
        if qual.startswith("torch.nn.") and qual.rsplit(".", 1)[-1][:1].isupper() \
                and not qual.startswith("torch.nn.parallel."):
            return True
        if not isinstance(value.func, cst.Name):
            return False
        name = value.func.value
        if self.a.qualname(value.func) not in (None, name):
            return False  # imported: its body is not in sight
        info = self.a.classes.get(name)
        if info is not None:
            init = [fn for fn in walk(info.node.body, into_functions=True) if isinstance(fn, cst.FunctionDef)
                    and fn.name.value == "__init__"]
            return not any(_moves_anything(fn) for fn in init)
        functions = self.a.functions.get(name, [])
        return bool(functions) and not any(_moves_anything(fn) for fn in functions)

    # -- is it moved (or handed to code that could move it)? -----------------------------------

    def _moved_in(self, scope: cst.CSTNode, name: str, depth: int) -> bool:
        key = (id(scope), name)
        if key in self._seen:
            return False
        self._seen.add(key)
        if depth > 3:
            return True
        body = scope.body if isinstance(scope, cst.FunctionDef) else scope
        for node, parent in _with_parents(body):
            if not (isinstance(node, cst.Name) and node.value == name):
                continue
            if isinstance(parent, (cst.AssignTarget, cst.Param, cst.FunctionDef, cst.ClassDef, cst.ImportAlias,
                                   cst.AugAssign, cst.Del)) or (
                    isinstance(parent, (cst.Arg, cst.AnnAssign)) and node in (getattr(parent, "keyword", None),
                                                                              getattr(parent, "target", None))):
                continue  # a binding or a keyword name, not a use
            if isinstance(parent, cst.Attribute):
                if parent.attr is node:
                    continue  # `x.model`: another object's attribute
                if self._method_moves(parent, body):
                    return True
                continue  # model.train(), model.parameters(), model(x) through `.forward`
            if isinstance(parent, cst.Call) and parent.func is node:
                continue  # model(x)
            if isinstance(parent, cst.Arg) and parent.value is node:
                if self._argument_moves(parent, body, depth):
                    return True
                continue
            if isinstance(parent, cst.Comparison):
                continue  # `model is None`
            return True  # returned, stored, aliased, captured: it may be moved elsewhere
        return False

    def _method_moves(self, attribute: cst.Attribute, body: cst.CSTNode) -> bool:
        method = attribute.attr.value
        if method == "cuda":
            return True
        if method not in ("to", "to_empty"):
            return False
        call = next((c for c in walk(body, into_functions=True) if isinstance(c, cst.Call) and c.func is attribute),
                    None)
        if call is None:
            return True
        target = call_arg(call, "device", 0)
        return target is not None and not self._not_a_device(target.value)

    def _not_a_device(self, node: cst.BaseExpression) -> bool:
        """`"cpu"`, `torch.device("cpu")`, a dtype (`torch.float16`) or `memory_format=`: not a device move."""
        text = string_value(node)
        if text is not None:
            return text in ("cpu", "meta") or text.startswith("cpu")
        if isinstance(node, cst.Call) and self.a.call_qualname(node) == "torch.device" and node.args:
            return string_value(node.args[0].value) in ("cpu", "meta")
        qual = self.a.qualname(node) or ""
        return qual.startswith("torch.") and qual.rsplit(".", 1)[-1] != "device" and not qual.startswith("torch.cuda")

    def _argument_moves(self, arg: cst.Arg, body: cst.CSTNode, depth: int) -> bool:
        call = next((c for c in walk(body, into_functions=True) if isinstance(c, cst.Call)
                     and any(a is arg for a in c.args)), None)
        if call is None:
            return True
        callee = dotted_name(call.func) or ""
        last = callee.rsplit(".", 1)[-1]
        if last in _DEVICE_WRAPPERS:
            return True
        functions = self.a.functions.get(last, []) if isinstance(call.func, (cst.Name, cst.Attribute)) else []
        if not functions or (isinstance(call.func, cst.Name) and self.a.qualname(call.func) not in (None, last)):
            return last not in _HARMLESS_CALLS  # code we cannot see
        for fn in functions:
            params = [p.name.value for p in [*fn.params.posonly_params, *fn.params.params]]
            keywords = params + [p.name.value for p in fn.params.kwonly_params]
            if arg.keyword is not None:
                if arg.keyword.value not in keywords:
                    return True  # into **kwargs
                param = arg.keyword.value
            else:
                offset = 1 if isinstance(call.func, cst.Attribute) and params[:1] in (["self"], ["cls"]) else 0
                index = [a for a in call.args if a.keyword is None].index(arg) + offset
                if any(a.star for a in call.args) or index >= len(params):
                    return True  # into *args
                param = params[index]
            if self._moved_in(fn, param, depth + 1):
                return True
        return False


def _with_parents(root: cst.CSTNode):  # noqa: ANN202 - Iterator[tuple[node, parent]]
    stack = [(child, root) for child in reversed(child_nodes(root))]
    while stack:
        node, parent = stack.pop()
        yield node, parent
        stack.extend((child, node) for child in reversed(child_nodes(node)))


def _moves_anything(fn: cst.CSTNode) -> bool:
    """A body that moves something to a device or builds tensors with `device=`: its module may end up there."""
    for inner in walk(fn, into_functions=True):
        if isinstance(inner, cst.Call):
            if method_name(inner) in ("cuda", "to", "to_empty") and isinstance(inner.func, cst.Attribute):
                return True
            if any(a.keyword is not None and a.keyword.value in ("device", "device_map") for a in inner.args):
                return True
    return False
