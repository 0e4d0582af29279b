from __future__ import annotations

import re

import libcst as cst

from gpulint import HotKind, Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import CUDA_OR_ACCELERATOR_TEXT
from gpulint.program import mentions
from gpulint.rule import is_test_path
from gpulint.semantic.precision import in_code
from gpulint.semantic.program_text import imported_texts, program_texts

_CONV = re.compile(
    r"\b(nn\.)?Conv(Transpose)?[123]d\(|\btorchvision\.models\.\w+\(|\bmodels\.__dict__\[|\bmodels\.(resnet|resnext|"
    r"wide_resnet|vgg|densenet|mobilenet|efficientnet|regnet|convnext|inception|squeezenet|shufflenet|mnasnet|"
    r"alexnet|googlenet)\w*\(")
_BENCHMARK = re.compile(r"\bcudnn\.benchmark\b|\bbenchmark\s*=\s*(True|False)")
_DETERMINISTIC = re.compile(r"\bcudnn\.deterministic\b|use_deterministic_algorithms\(")
# Input shapes that change from batch to batch: sequences padded to the batch maximum. They reach a cuDNN
# convolution only through a convolution over the sequence axis (a 1-d conv); a program whose only convs are 2-d/3-d
# image convs pads its sequences for an RNN or a transformer. `pack_padded_sequence` is no evidence: a packed
# sequence can only feed an RNN. (Multi-scale training has no reliable textual sign: "multiscale" is also a model
# name in timm.)
_VARIABLE_SHAPES = re.compile(r"\bpad_sequence\(")
_SEQUENCE_CONV = re.compile(r"\bConv(Transpose)?1d\(|\bconv(_transpose)?1d\(")


class CudnnBenchmark(Rule):
    """
    ## What it does
    Finds `torch.backends.cudnn.benchmark` left unset in a CUDA convolutional network, or set to `True` where
    the convolution input shapes vary from batch to batch. The two cases: a convolutional network trained on CUDA
    whose program never sets `torch.backends.cudnn.benchmark` (suggest `True`, reported once per file at the
    training loop); and `torch.backends.cudnn.benchmark = True` in a program whose convolution inputs vary from
    batch to batch (sequences padded per batch with `pad_sequence`, in a program with a 1-d convolution over
    them), where it should be `False`. Padded sequences that only feed RNNs or transformers (`pack_padded_sequence`, a
    program whose convs are image convs) do not count: they never reach a cuDNN convolution.
    Deterministic setups (`cudnn.deterministic`, `use_deterministic_algorithms`) are left alone.

    ## Why is this slow
    With `benchmark = True` cuDNN times the candidate convolution algorithms for each new input shape and
    keeps the fastest (PyTorch tuning guide). That helps fixed shapes on some GPUs and cuDNN versions; with
    variable shapes the autotuning runs again for every new shape. Measured on an H100 with the cuDNN of
    torch 2.11, ResNet-50 batch 64: 37.5 vs 37.4 ms per step (fp32), 18.8-19.4 vs 19.0-19.1 ms
    (channels_last + bf16) - no steady-state gain, while the first step took 9.9-15 s instead of 0.5-0.7 s.
    Measure on your GPU before keeping it.

    ## Example
    ```python
    model = torchvision.models.resnet50().cuda()
    for images, target in train_loader:
        loss = criterion(model(images.cuda()), target.cuda())
        ...
    ```

    ## Use instead
    ```python
    torch.backends.cudnn.benchmark = True  # fixed input shapes
    model = torchvision.models.resnet50().cuda()
    ```

    ## Fix safety
    Suggestion only: the effect depends on the GPU, the cuDNN version and the input shapes, and autotuning
    can pick non-deterministic algorithms.
    """

    code = "GPU033"
    name = "cudnn-benchmark"
    message = "Conv net trained on CUDA without `torch.backends.cudnn.benchmark`; autotuning may pick faster kernels"
    severity = Severity.INFO
    safety = Safety.SUGGEST
    priority = "P3"
    default_enabled = False
    at_training_entry = True
    # no text triggers: the training loop may sit in a file that names neither the network (built in another
    # file) nor a backward pass (`agent.update(...)` trains in another file)
    examples = [
        Valid(
            """
            import torch
            import torch.nn as nn
            torch.backends.cudnn.benchmark = True
            model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU()).cuda()
            for x, y in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Invalid(  # the only mention of the setting is commented out: it sets nothing
            """
            import torch
            import torch.nn as nn
            # torch.backends.cudnn.benchmark = False  # It harms performance.
            model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU()).cuda()
            for x, y in loader:  # error: GPU033
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # reproducibility run
            """
            import torch
            import torch.nn as nn
            torch.backends.cudnn.deterministic = True
            model = nn.Conv2d(3, 16, 3).cuda()
            for x, y in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Valid(  # fixed-size images into the conv encoder; the padded captions feed an RNN decoder
            """
            import torch
            import torch.nn as nn
            from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
            torch.backends.cudnn.benchmark = True
            encoder = nn.Sequential(nn.Conv2d(3, 64, 3), nn.AdaptiveAvgPool2d(1)).cuda()
            decoder = nn.GRU(64, 128, batch_first=True).cuda()
            def collate(batch):
                images = torch.stack([b[0] for b in batch])
                captions = pad_sequence([b[1] for b in batch], batch_first=True)
                return images, captions, [len(b[1]) for b in batch]
            for images, captions, lengths in loader:
                feats = encoder(images.cuda()).flatten(1)
                packed = pack_padded_sequence(embed(captions.cuda(), feats), lengths, batch_first=True)
                out, _ = decoder(packed)
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU()).cuda()
            for x, y in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            from torch.nn.utils.rnn import pad_sequence
            torch.backends.cudnn.benchmark = True
            encoder = nn.Conv1d(80, 256, 5).cuda()
            def collate(batch):
                return pad_sequence(batch, batch_first=True)
            """
        ),
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reported_loop = False

    def visit_For(self, node: cst.For) -> None:
        self._loop(node)

    def visit_While(self, node: cst.While) -> None:
        self._loop(node)

    def _loop(self, node: cst.CSTNode) -> None:
        if self._reported_loop or not self._trains(node):
            return
        self._reported_loop = True  # one finding per file, at its first training loop
        texts = program_texts(self.ctx)
        own = self.ctx.program.sources.get(self.ctx.path) or self.ctx.module.code
        # a loop file that names no convolution builds its network elsewhere: the conv layers must be in a file
        # it imports itself (`from nets import build`), not somewhere deep in a library it uses (peft's adapters
        # for Conv2d layers do not make a language model a conv net)
        conv_texts = texts if any(word in own for word in _NAMES_A_NETWORK) else imported_texts(self.ctx)
        if is_test_path(self.ctx.path) or not any(mentions(_CONV, t) for t in conv_texts) \
                or not _trains_on_cuda(self.ctx, texts):
            return
        # in code: a commented-out `torch.backends.cudnn.benchmark = False` sets nothing
        if any(in_code(_BENCHMARK, t) or in_code(_DETERMINISTIC, t) for t in texts):
            return
        self.report(node)

    def _trains(self, loop: cst.CSTNode) -> bool:
        """A training loop, or the environment loop of a script's function that trains (`for step in ...:
        env.step(a)`, then `agent.update(...)` in another file); a library's agents are judged where their
        script's loop is."""
        analysis = self.ctx.analysis
        kind = analysis.hot.get(id(loop))
        if kind is HotKind.STEP_LOOP:
            return True
        function = self.ctx.enclosing(cst.FunctionDef)
        return kind is HotKind.ROLLOUT and analysis.main_guard is not None \
            and f"{analysis.key_of(function)}#trains" in analysis.program_keys

    def visit_Assign(self, node: cst.Assign) -> None:
        if not (isinstance(node.value, cst.Name) and node.value.value == "True"):
            return
        if not any(self.ctx.qualname(t.target) == "torch.backends.cudnn.benchmark" for t in node.targets):
            return
        texts = program_texts(self.ctx)
        if any(mentions(_SEQUENCE_CONV, t) for t in texts) and any(mentions(_VARIABLE_SHAPES, t) for t in texts):
            self.report(node, "`cudnn.benchmark = True` with input shapes that vary per batch re-runs the "
                              "autotuner for every new shape; set it to False")


_NAMES_A_NETWORK = ("Conv", "models", "cudnn")  # a loop file naming one of these may build the network itself


def _trains_on_cuda(ctx, texts: list[str]) -> bool:
    analysis = ctx.analysis
    return analysis.cuda_evidence or analysis.maybe_cuda_evidence or any(
        mentions(CUDA_OR_ACCELERATOR_TEXT, t) for t in texts)


# -- the part of the run that belongs to this file's program: files connected to it by imports ---------------
# (shared with channels_last.py, optimizer_not_fused.py and graph_break_in_compiled_region.py; a candidate for the
# engine's ProgramFacts)


