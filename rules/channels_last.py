from __future__ import annotations

import re
from functools import lru_cache

import libcst as cst

from gpulint import HotKind, Invalid, Rule, Safety, Severity, Valid
from gpulint.analysis import CUDA_OR_ACCELERATOR_TEXT, call_arg, string_value
from gpulint.program import mentions
from gpulint.rule import is_test_path
from gpulint.semantic.program_text import program_texts

_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast_mode.autocast"}
_CONV2D = re.compile(r"\bConv2d\(")
_BATCH_NORM_2D = re.compile(r"\bBatchNorm2d\(|\bSyncBatchNorm\(")
# torchvision CNN families (conv + batch norm by construction); `models.__dict__[arch]` as in the ImageNet example
_TORCHVISION_CNN = re.compile(
    r"\bmodels\.(resnet|resnext|wide_resnet|densenet|mobilenet|efficientnet|regnet|mnasnet|shufflenet|inception|"
    r"googlenet)\w*\(|\bmodels\.__dict__\[")
_CHANNELS_LAST = re.compile(r"channels_last")


class ChannelsLast(Rule):
    """
    ## What it does
    Finds mixed-precision training (`torch.autocast` in the training step) of a network built from `Conv2d`
    and `BatchNorm2d` layers (or a torchvision CNN) when the program never uses `torch.channels_last`.
    Reported once per file, at the autocast region.

    ## Why is this slow
    Tensor-core convolution kernels work in NHWC. With the default NCHW layout, cuDNN transposes activations
    around convolutions in fp16/bf16. The PyTorch tuning guide: channels_last "is meant to be used in
    conjunction with AMP". Measured on an H100, ResNet-50 batch 64: 37.4 ms per step in fp32 and about
    19 ms with channels_last + bf16 (the two changes together, not isolated).

    ## Example
    ```python
    model = torchvision.models.resnet50().cuda()
    for images, target in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(images.cuda()), target.cuda())
    ```

    ## Use instead
    ```python
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    for images, target in loader:
        images = images.cuda().to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(images), target.cuda())
    ```

    ## Fix safety
    Suggestion only: the model and its inputs must both be converted, and custom ops that call `.view()` on
    activations can fail on non-contiguous NHWC tensors. Outputs are equal (exact on a small fp32 conv on
    CPU); the gain depends on the network and the GPU.
    """

    code = "GPU034"
    name = "channels-last"
    message = "Conv2d/BatchNorm network trained with autocast in NCHW; `channels_last` speeds up tensor-core convs"
    severity = Severity.INFO
    safety = Safety.SUGGEST
    priority = "P3"
    default_enabled = False
    triggers = ("autocast",)
    examples = [
        Valid(
            """
            import torch
            import torch.nn as nn
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3)).cuda()
            model = model.to(memory_format=torch.channels_last)
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x.cuda()).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # a transformer: no conv/batch-norm body
            """
            import torch
            model = Transformer().cuda()
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x.cuda()).mean()
                loss.backward()
                optimizer.step()
            """
        ),
        Valid(  # inference in a self-play rollout (one position per environment): not the training step
            """
            import torch
            import torch.nn as nn
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3)).cuda()
            obs = env.reset()
            for move in range(10_000):
                with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
                    policy = model(torch.as_tensor(obs, device="cuda")[None])
                obs, reward, done, _ = env.step(int(policy.argmax()))
            """
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3)).cuda()
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x.cuda()).mean()
                loss.backward()
                optimizer.step()
            """
        ),
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._done = False

    def visit_Call(self, node: cst.Call) -> None:
        if self._done or self.ctx.qualname(node.func) not in _AUTOCAST or not self.ctx.in_hot_region():
            return
        if self.ctx.hot_kind() is HotKind.ROLLOUT:
            return  # acting or tree search: small inference batches, not the training step the advice is about
        if not isinstance(self.ctx.parent(), cst.WithItem):
            return
        enabled = call_arg(node, "enabled")
        if enabled is not None and isinstance(enabled.value, cst.Name) and enabled.value.value == "False":
            return
        device = call_arg(node, "device_type", 0)
        if self.ctx.qualname(node.func) in ("torch.autocast", "torch.amp.autocast") and device is not None \
                and string_value(device.value) not in (None, "cuda"):
            return
        self._done = True  # one finding per file
        texts = program_texts(self.ctx)
        if is_test_path(self.ctx.path) or any(mentions(_CHANNELS_LAST, t) for t in texts):
            return
        conv_bn = sum(_conv2d_count(t) for t in texts) >= 2 and any(mentions(_BATCH_NORM_2D, t) for t in texts)
        if not (conv_bn or any(mentions(_TORCHVISION_CNN, t) for t in texts)):
            return
        analysis = self.ctx.analysis
        if not (analysis.cuda_evidence or analysis.maybe_cuda_evidence
                or any(mentions(CUDA_OR_ACCELERATOR_TEXT, t) for t in texts)):
            return
        self.report(node)


@lru_cache(maxsize=1 << 16)
def _conv2d_count(text: str) -> int:
    """`Conv2d(` layers a text writes (remembered per text: asked of every related file for every file)."""
    return len(_CONV2D.findall(text))
