from __future__ import annotations

import re

import libcst as cst

from gpulint import Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import call_arg, string_value
from gpulint.rule import is_test_path

_CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
# A helper whose whole purpose is determinism: whoever calls it decides (often under a flag).
_DETERMINISM_HELPER = re.compile(r"determin|reproduc", re.I)
_TRAINING = re.compile(r"\.backward\(")
# What deterministic mode slows down. `cudnn.deterministic` only touches cuDNN: convolutions and recurrent
# layers (also inside torchvision/timm models). `use_deterministic_algorithms` / the cuBLAS workspace setting
# also replace the atomic-add kernels of scatter/index accumulation, embedding and interpolation backward. A
# program that builds its network from layers, none of them affected (an MLP of nn.Linear layers), runs at the
# same speed either way: not reported. A program that builds no layer (the model comes from elsewhere) is.
_BUILDS_LAYERS = re.compile(r"\bnn\.[A-Z]\w*\s*\(|\b(?:Linear|Sequential)\s*\(")
# (one `\b` before one alternation: a case-blind regex of many `\b...` branches is several times slower)
_CUDNN_WORK = re.compile(r"\b(?:conv(?:transpose)?[123]d\b|conv(?:_transpose)?[123]d\s*\(|(?:lstm|gru|rnn)\b|timm\b|"
                         r"resnet|vgg|unet|efficientnet|convnext)|torchvision\.models", re.I)
_ATOMIC_WORK = re.compile(r"scatter_add|scatter_reduce|index_add|index_put|\.put_\(|\bEmbedding(?:Bag)?\b|"
                          r"\bembedding(?:_bag)?\s*\(|interpolate|Upsample|grid_sample|ctc_loss|CTCLoss|bincount|"
                          r"histc|nll_loss2d|cumsum|transformers|AutoModel")
# `if` tests that are a reproducibility switch (`--deterministic`, `--seed`, debug runs); `if using_cuda:` is not.
_SWITCH = re.compile(r"determin|reproduc|seed|debug|exact|bitwise|benchmark|fast|strict", re.I)


class DeterministicModeInTraining(Rule):
    """
    ## What it does
    Finds deterministic-kernel settings switched on unconditionally in a training program:
    `torch.backends.cudnn.deterministic = True`, `torch.use_deterministic_algorithms(True)` and
    `os.environ["CUBLAS_WORKSPACE_CONFIG"] = ...` (often inside a `set_seed` helper, next to
    `cudnn.benchmark = False`). Settings behind a reproducibility switch (`if args.deterministic:`,
    `if args.seed is not None:`) are fine and not reported; `if using_cuda:` is not such a switch.

    ## Why is this slow
    Deterministic mode restricts cuDNN and cuBLAS to deterministic algorithms, which can be slower, and
    `use_deterministic_algorithms(True)` makes ops such as `index_put_(accumulate=True)` and scatter-add fall
    back to slower deterministic implementations (Inductor also disables CUDA graphs for some of them). That
    is the right trade-off for a reproducibility run, not for every throughput run.

    ## Example
    ```python
    def set_seed(seed):
        torch.manual_seed(seed)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    ```

    ## Use instead
    ```python
    def set_seed(seed, deterministic=False):
        torch.manual_seed(seed)
        if deterministic:  # --deterministic for reproducibility runs only
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
    ```

    ## Fix safety
    Suggestion only: whether a run must be bitwise reproducible is the author's decision.
    """

    code = "GPU035"
    name = "deterministic-mode-in-training"
    message = "Deterministic kernels forced on for every training run; put them behind a flag"
    severity = Severity.INFO
    safety = Safety.SUGGEST
    priority = "P3"
    default_enabled = False
    triggers = ("deterministic", _CUBLAS_ENV)
    examples = [
        Valid(
            """
            import torch
            def setup(args):
                if args.deterministic:
                    torch.backends.cudnn.deterministic = True
            loss.backward()
            """
        ),
        Valid(
            """
            import torch
            torch.backends.cudnn.deterministic = args.torch_deterministic
            loss.backward()
            """
        ),
        Valid(  # an MLP: neither cuDNN nor atomic-add kernels, deterministic mode costs nothing
            """
            import torch
            from torch import nn
            torch.backends.cudnn.deterministic = True
            torch.use_deterministic_algorithms(True)
            model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
            for x, y in loader:
                nn.functional.cross_entropy(model(x), y).backward()
            """
        ),
        Invalid(
            """
            import torch
            def set_seed(seed):
                torch.manual_seed(seed)
                torch.backends.cudnn.deterministic = True
                torch.backends.cudnn.benchmark = False
            def train(model, loader, opt):
                for x, y in loader:
                    model(x, y).backward()
                    opt.step()
            """
        ),
    ]

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            expr = target.target
            if self.ctx.qualname(expr) == "torch.backends.cudnn.deterministic" and _is_true(node.value):
                self._maybe_report(node, cudnn_only=True)
            elif self._is_cublas_env(expr):
                self._maybe_report(node)

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual == "torch.use_deterministic_algorithms":
            mode = call_arg(node, "mode", 0)
            if mode is not None and _is_true(mode.value):
                self._maybe_report(node)
        elif qual in ("os.environ.setdefault", "os.putenv") and node.args \
                and string_value(node.args[0].value) == _CUBLAS_ENV:
            self._maybe_report(node)

    def _is_cublas_env(self, expr: cst.BaseExpression) -> bool:
        return isinstance(expr, cst.Subscript) and self.ctx.qualname(expr.value) == "os.environ" \
            and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index) \
            and string_value(expr.slice[0].slice.value) == _CUBLAS_ENV

    def _maybe_report(self, node: cst.CSTNode, cudnn_only: bool = False) -> None:
        if is_test_path(self.ctx.path) or not self.ctx.program.search(_TRAINING):
            return
        if self.ctx.program.search(_BUILDS_LAYERS) and not self.ctx.program.search(_CUDNN_WORK) and (
                cudnn_only or not self.ctx.program.search(_ATOMIC_WORK)):
            return  # the program's network has nothing that runs slower in deterministic mode
        for ancestor in reversed(self.ctx.ancestors[:-1]):
            if isinstance(ancestor, cst.If) and _SWITCH.search(self.ctx.code(ancestor.test)):
                return  # behind a reproducibility switch: already a decision
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                if isinstance(ancestor, cst.FunctionDef) and _DETERMINISM_HELPER.search(ancestor.name.value):
                    return
                break
        self.report(node)


def _is_true(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"
