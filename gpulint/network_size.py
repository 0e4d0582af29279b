"""How big a program's networks are, read from literal layer widths and width settings (`nn.Linear(512, ...)`,
`hidden_size=768`, `--d-model 1024`) and well-known model constructors. Precision rules use it: on small
networks (every width <= 256) the step is launch-bound and lower-precision math gains little or loses."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from typing import NamedTuple

from gpulint.program import mentions
from gpulint.semantic import pyast
from gpulint.textscan import quick

# convolutional networks: their compute is convolutions, which cuDNN already runs in TF32
_CNN_CONSTRUCTORS = r"\bresnet\d+\(|\befficientnet|\bdensenet\d+\(|\bvgg\d+\(|\bconvnext_\w+\("
_BIG_CNN = re.compile(_CNN_CONSTRUCTORS)
_BIG_MODEL = re.compile(r"torchvision\.models(?!\._?utils)|from\s+torchvision\s+import\s+[^\n]*\bmodels\b|"
                        r"timm\.create_model|from_pretrained\(|\bAutoModel|\bvit_\w+\(|" + _CNN_CONSTRUCTORS)
_WIDTH_NAME = re.compile(
    r"^(n_?embd|n_?embed|d_model|d_ff|dim_feedforward|ffn_dim|hidden(_size|_dim|_units|_channels|_features)?|"
    r"embed(ding)?_dim|emb_dim|(\w+_)?model_dim(ension)?|width|num_hiddens|nhid|ninp|emsize|n_hidden|"
    r"intermediate_size)$", re.I)
_BATCH_NAME = re.compile(r"^(train_|per_device_train_|micro_|mini_?)?batch_?size$|^bs$|^bsz$|^(mini_?)?batch$", re.I)
# (not `num_steps`: in RL code, where it is most often written, it counts environment or training steps)
_LENGTH_NAME = re.compile(r"^(max_)?(seq(uence)?_?len(gth)?|block_size|bptt|n_ctx|context_len(gth)?|max_len(gth)?|"
                          r"chunk_len|max_position_embeddings|n_positions|seq)$", re.I)
# the side of the images a convolutional network is trained on (`img_size = 416`, `--image_size 256`); not
# `input_size`, which sizes an MLP's features as often
_IMAGE_NAME = re.compile(r"^(train_)?(img|image|crop|input_scale|load|fine)_?(size|res(olution)?)$|^resolution$", re.I)
_LAYER_ARGS = {
    "Linear": ((0, "in_features"), (1, "out_features")),
    "LazyLinear": ((0, "out_features"),),
    "Bilinear": ((0, "in1_features"), (1, "in2_features"), (2, "out_features")),
    "Embedding": ((1, "embedding_dim"),),
    "LSTM": ((1, "hidden_size"),),
    "GRU": ((1, "hidden_size"),),
    "RNN": ((1, "hidden_size"),),
    "MultiheadAttention": ((0, "embed_dim"),),
    "TransformerEncoderLayer": ((0, "d_model"), (2, "dim_feedforward")),
    "TransformerDecoderLayer": ((0, "d_model"), (2, "dim_feedforward")),
    "Transformer": ((0, "d_model"), (5, "dim_feedforward")),
}
for _conv in ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"):
    _LAYER_ARGS[_conv] = ((0, "in_channels"), (1, "out_channels"))
_TWO_SIDED = {"Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
              "ConvTranspose3d"}
SMALL_WIDTH = 256  # catalog F10: autocast made a 64-256-256 RL MLP step slower (0.80x)


def _const_int(node: ast.AST, constants: dict[str, int] | None = None) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if constants and isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub, ast.FloorDiv, ast.Pow)):
        left, right = _const_int(node.left, constants), _const_int(node.right, constants)
        if left is None or right is None or (isinstance(node.op, ast.Pow) and right > 32):
            return None
        if isinstance(node.op, ast.FloorDiv):
            return left // right if right else None
        return {ast.Mult: left * right, ast.Add: left + right, ast.Sub: left - right,
                ast.Pow: left ** right if isinstance(node.op, ast.Pow) else 0}[type(node.op)]
    return None


class _Sizes(NamedTuple):
    """What one file writes about the size of its networks and batches."""

    layers: tuple[tuple[str, int | None], ...]  # (layer class, literal width or None) of nn layers
    widths: tuple[int, ...]  # literal values of width-named settings
    batches: tuple[int, ...]  # of batch-size settings
    lengths: tuple[int, ...]  # of sequence-length settings
    named_layers: tuple[tuple[str, int | None], ...]  # the layers again, widths named by constants resolved
    # Linear layers whose width is a multiple of a model dimension (`nn.Linear(dim, 4 * dim)`): the expansion of a
    # transformer or ConvNeXt block, never a classifier head
    expansions: int = 0
    # products of two activations written out (`torch.bmm(q, k)`, `q @ k.transpose(-2, -1)`, an einsum): attention
    # in a network that may otherwise be convolutions
    activation_matmuls: int = 0
    images: tuple[int, ...] = ()  # literal values of image-size settings


@lru_cache(maxsize=4096)
def _sizes(text: str) -> _Sizes:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _Sizes((), (), (), (), (), 0, 0)
    layers: list[tuple[str, int | None]] = []
    settings: list[int] = []
    sized: dict[str, list[int]] = {"width": settings, "batch": [], "length": [], "image": []}
    constants = _single_constants(tree)
    resolved: list[tuple[str, int | None]] = []  # layers again, widths written as names of constants resolved
    expansions = 0
    activation_matmuls = 0
    for node in pyast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            activation_matmuls += 1
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            activation_matmuls += name in _ACTIVATION_MATMULS
            dims, named_dims, sides = [], [], []
            for position, keyword in _LAYER_ARGS.get(name, ()):
                value = next((k.value for k in node.keywords if k.arg == keyword), None)
                if value is None and len(node.args) > position and not any(
                        isinstance(a, ast.Starred) for a in node.args[:position + 1]):
                    value = node.args[position]
                width = _const_int(value) if value is not None else None
                sides.append(width)
                if width is not None:
                    dims.append(width)
                if width is None and isinstance(value, ast.Name):
                    width = constants.get(value.id)
                if width is not None:
                    named_dims.append(width)
            if name in _LAYER_ARGS:
                expansions += name == "Linear" and _widens_a_dimension(node.args[:2])
                layers.append((name, _projection_width(name, sides) or _layer_width(name, dims)))
                resolved.append((name, _layer_width(name, named_dims)))
            if name == "add_argument" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                value = next((k.value for k in node.keywords if k.arg == "default"), None)
                _record(sized, node.args[0].value.lstrip("-").replace("-", "_"), value)
            for keyword in node.keywords:
                if keyword.arg:
                    _record(sized, keyword.arg, keyword.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for element, value in _pairs(target, node.value):
                    name = element.id if isinstance(element, ast.Name) else element.attr if isinstance(
                        element, ast.Attribute) else ""
                    _record(sized, name, value)
            if isinstance(node.value, ast.Call):
                length = _positional_table_length(node.value, constants)
                if length is not None:
                    sized["length"].append(length)
        elif isinstance(node, ast.Dict):  # a config dict: `{"emb_dim": 768, "context_length": 1024}`
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    _record(sized, key.value, value)
        elif isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            for arg, default in zip(positional[len(positional) - len(node.defaults):], node.defaults):
                _record(sized, arg.arg, default)
            for arg, default in zip(node.kwonlyargs, node.kw_defaults):
                _record(sized, arg.arg, default)
    return _Sizes(tuple(layers), tuple(settings), tuple(sized["batch"]), tuple(sized["length"]), tuple(resolved),
                  expansions, activation_matmuls, tuple(n for n in sized["image"] if _IMAGE_SIDES[0] <= n <= _IMAGE_SIDES[1]))


_IMAGE_SIDES = (16, 4096)  # pixels per side a written image size may plausibly have


_ACTIVATION_MATMULS = frozenset({"bmm", "baddbmm", "matmul", "einsum", "scaled_dot_product_attention"})


def _widens_a_dimension(widths: list[ast.AST]) -> bool:
    """`Linear(dim, 4 * dim)`, `Linear(int(dim * ratio), dim)`: one width is the other multiplied (a block's MLP).
    Not `Linear(512 * block.expansion, num_classes)` nor `Linear(4 * w * h, w * h)`, classifier heads."""
    if len(widths) != 2:
        return False
    return _scaled(widths[0], widths[1]) or _scaled(widths[1], widths[0])


def _scaled(wide: ast.AST, narrow: ast.AST) -> bool:
    """Is `wide` `narrow` times a factor (`4 * dim`, `dim * mlp_ratio`, `int(dim * ratio)`)?"""
    if isinstance(wide, ast.Call) and isinstance(wide.func, ast.Name) and wide.func.id == "int" and wide.args:
        wide = wide.args[0]
    if not (isinstance(wide, ast.BinOp) and isinstance(wide.op, ast.Mult)):
        return False
    same = ast.dump(narrow)
    return ast.dump(wide.left) == same or ast.dump(wide.right) == same


def _pairs(target: ast.AST, value: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """`a, b = 1, 2` as (a, 1), (b, 2); a plain target with its value."""
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred) for e in target.elts):
        return [pair for t, v in zip(target.elts, value.elts) for pair in _pairs(t, v)]
    return [(target, value)]


_FACTORIES = {"zeros", "randn", "rand", "empty", "ones", "normal", "trunc_normal_"}


def _positional_table_length(call: ast.Call, constants: dict[str, int]) -> int | None:
    """The sequence length a learned positional table shows: `nn.Parameter(torch.zeros(1, L, d))` (the ViT and
    GPT idiom) gives L."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "Parameter" or isinstance(func, ast.Name)
            and func.id == "Parameter") or not call.args:
        return None
    inner = call.args[0]
    while isinstance(inner, ast.BinOp):  # torch.randn(1, L, d) * 0.02
        inner = inner.left
    if not (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr in _FACTORIES
            and len(inner.args) == 3):
        return None
    first, length = (_const_int(a, constants) for a in inner.args[:2])
    return length if first == 1 and length is not None and length > 1 else None


def _layer_width(name: str, dims: list[int]) -> int | None:
    if name in _TWO_SIDED:
        # a GEMM is only as wide as its smallest side: Linear(9216, 128) is a small layer, and
        # Linear(2048, num_classes) is of unknown width
        if len(dims) != len(_LAYER_ARGS[name]):
            return None
        if name.startswith("Conv") and dims[0] <= _IMAGE_CHANNELS:
            return None  # the stem reading the image (`Conv2d(3, 64)`) says nothing of the network's width
        return min(dims)
    return max(dims) if dims else None


_IMAGE_CHANNELS = 4  # RGBA at most


def _projection_width(name: str, sides: list[int | None]) -> int | None:
    """`Linear(flat_features, 512)`: a layer projecting computed features (a conv trunk's flattened output) to a
    written width is that wide; a head `Linear(512, num_actions)` is not (its output side may be tiny)."""
    if name == "Linear" and len(sides) == 2 and sides[0] is None and sides[1] is not None:
        return sides[1]
    return None


def _single_constants(tree: ast.AST) -> dict[str, int]:
    """Names bound exactly once in the file, to an integer (`hidden_size = 500`, `CELLS = ROWS * COLS` of such
    names, or a parameter default `def __init__(self, hidden_size=500)`)."""
    seen: dict[str, list[ast.AST | None]] = {}
    for node in pyast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for element, value in _pairs(target, node.value):
                    if isinstance(element, ast.Name):
                        seen.setdefault(element.id, []).append(value)
        elif isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            defaults = [None] * (len(positional) - len(node.defaults)) + list(node.defaults)
            for arg, default in [*zip(positional, defaults), *zip(node.kwonlyargs, node.kw_defaults)]:
                if default is not None:  # a parameter without one takes what callers pass: often the constant
                    seen.setdefault(arg.arg, []).append(default)
    single = {name: values[0] for name, values in seen.items() if len(values) == 1 and values[0] is not None}
    constants: dict[str, int] = {}
    for _ in range(3):  # names defined from names: a few rounds
        for name, value in single.items():
            if name not in constants:
                number = _const_int(value, constants)
                if number is not None:
                    constants[name] = number
    return constants


def _record(sized: dict[str, list[int]], name: str, value: ast.AST | None) -> None:
    """A setting written as an integer literal, filed by what its name says it sizes."""
    number = _const_int(value) if value is not None else None
    if number is None:
        return
    for kind, pattern in (("width", _WIDTH_NAME), ("batch", _BATCH_NAME), ("length", _LENGTH_NAME),
                          ("image", _IMAGE_NAME)):
        if pattern.match(name):
            sized[kind].append(number)


@lru_cache(maxsize=1 << 16)
def _big_model_named(text: str) -> str | None:
    """The first well-known large model `text` names (remembered per text: asked of every related file for every
    file)."""
    match = quick(_BIG_MODEL).search(text)
    return match.group() if match else None


def network_size(texts: dict[str, str], *, matmul_only: bool = False) -> str | None:
    """"large" (a width above SMALL_WIDTH, or a well-known large model), "small" (widths are written and all
    are at most SMALL_WIDTH), or None (nothing shows). With `matmul_only`, convolutions do not count (for
    TF32, which cuDNN convolutions already use): a network of convolutions, with at most classifier-like
    Linear layers of unwritten width (none widening a model dimension, as a block's MLP does) and no product of
    activations written out (attention's `torch.bmm(q, k)`), is "small"."""
    for text in texts.values():
        model = _big_model_named(text)
        if model and not (matmul_only and _BIG_CNN.fullmatch(model)):
            return "large"
    layers = [layer for text in texts.values() for layer in _sizes(text).layers]
    settings = [width for text in texts.values() for width in _sizes(text).widths]
    convolutional = matmul_only and (any(name.startswith(("Conv", "LazyConv")) for name, _ in layers)
                                     or any(mentions(_BIG_CNN, text) for text in texts.values()))
    widths = [w for name, w in layers if not (matmul_only and name.startswith(("Conv", "LazyConv")))]
    if any(w is not None and w > SMALL_WIDTH for w in widths) or any(w > SMALL_WIDTH for w in settings):
        return "large"
    if convolutional:
        unknown = [name for name, w in layers if w is None and not name.startswith(("Conv", "LazyConv"))]
        expanded = any(_sizes(text).expansions or _sizes(text).activation_matmuls for text in texts.values())
        return "small" if all(name == "Linear" for name in unknown) and not expanded else None
    known = [w for w in widths if w is not None]
    return "small" if known or settings else None


# Rows of activations per step below which a network with no layer wider than SMALL_WORK_WIDTH is launch-bound:
# measured on an H100 (torch 2.11), bf16 autocast was slower than fp32 for a 784-500-10 MLP at batch 100
# (1024 vs 974 us per step) and for an LSTM language model of hidden size 1024 at 20 x 30 tokens (3100 vs 2896 us).
SMALL_WORK_ROWS = 4096
SMALL_WORK_WIDTH = 1024


def small_work_per_step(texts: dict[str, str]) -> bool:
    """A network of matmul layers (no convolutions, no well-known large model) whose widths are all written and at
    most SMALL_WORK_WIDTH, trained on batches whose written size times sequence length (when one is written) is at
    most SMALL_WORK_ROWS: too little work per kernel for lower-precision math to pay for its casts."""
    if any(_big_model_named(text) for text in texts.values()):
        return False
    sizes = [_sizes(text) for text in texts.values()]
    layers = [layer for size in sizes for layer in size.named_layers]
    widths = [w for _, w in layers] + [w for size in sizes for w in size.widths]
    batches = [b for size in sizes for b in size.batches]
    lengths = [n for size in sizes for n in size.lengths]
    if not layers or not batches or any(name.startswith(("Conv", "LazyConv")) for name, _ in layers):
        return False
    if any(w is None or w > SMALL_WORK_WIDTH for w in widths):
        return False
    return max(batches) * max(lengths, default=1) <= SMALL_WORK_ROWS


# Work per step: the precision rules offer TF32 / bf16 autocast where the matrix work of one kernel is large
# enough for tensor-core math to pay for its casts and launches. Measured on an H100 (torch 2.11, the catalog):
# bf16 autocast was slower than fp32 for a 784-500-10 MLP at batch 100 (~2.5e7 multiply-adds per GEMM) and for an
# LSTM of hidden size 1024 at 20 rows per time step (~8e7). The threshold, 2.7e8, sits above those; the e2e
# self-play trainer (512 x 43 tokens x 256, ~1.4e9) got TF32 + bf16 from it. Not yet measured point by point:
# benchmarks/e2e/precision_sweep.py times the MLP step across this range and should confirm or move it.
WORK_PAYS = 1 << 28  # multiply-adds of the largest GEMM / convolution of one step
_CONV_POSITIONS = 16 * 16  # spatial positions assumed per image when no image size is written
_CONV_DEFAULT_WIDTH = 64
_RNN = ("LSTM", "GRU", "RNN")
_SEQUENCE_LAYERS = ("TransformerEncoderLayer", "TransformerDecoderLayer", "Transformer", "MultiheadAttention",
                    "Embedding")


class Work(NamedTuple):
    """What the program shows about the work of one training step, and whether low precision pays for it."""

    macs: int  # multiply-adds of the largest GEMM (or convolution) per step, as estimated
    basis: str  # how: "22016 rows (512 x 43 tokens) x 256 x 256"
    convolutional: bool
    recurrent: bool = False  # the largest kernels are an RNN's, which cuDNN already runs in TF32

    @property
    def pays(self) -> bool:
        return self.macs >= WORK_PAYS

    def explain(self) -> str:
        verdict = "enough" if self.pays else "too little"
        return (f"estimated work per kernel: {self.basis} = {self.macs:.1e} multiply-adds, {verdict} for "
                f"tensor-core math to pay on an H100 (threshold {WORK_PAYS:.1e})")


def work_per_step(texts: dict[str, str]) -> Work | None:
    """Estimate the largest GEMM/convolution of a training step from the layers and batch shapes the program
    writes: rows (batch size x sequence length; the batch alone for recurrent layers, which run one time step
    per kernel; batch x assumed spatial positions for convolutions) x the widths either side. None when no
    batch size or no layer width is written (nothing to estimate from)."""
    if any(_big_model_named(text) for text in texts.values()):
        return None
    sizes = [_sizes(text) for text in texts.values()]
    layers = [layer for size in sizes for layer in size.named_layers]
    batches = [b for size in sizes for b in size.batches]
    lengths = [n for size in sizes for n in size.lengths if n > 1]
    settings = [w for size in sizes for w in size.widths]
    if not layers or not batches:
        return None
    batch = max(batches)
    convs = [w for name, w in layers if name.startswith(("Conv", "LazyConv"))]
    if convs:
        width = max([w for w in convs if w is not None] + settings, default=_CONV_DEFAULT_WIDTH)
        rows = batch * _CONV_POSITIONS
        work = Work(rows * width * width * 9, f"{batch} images x {_CONV_POSITIONS} positions (assumed) x "
                                              f"{width} x {width} channels x 3x3", True)
        sides = [n for size in sizes for n in size.images]
        if not sides:
            return work
        # the images' size is written: the first full-width convolutions run at half its side (after a stride-2
        # stem), as wide as the narrowest written convolution past the stem
        side = max(sides) // 2
        narrow = min([w for w in convs if w is not None and w > _IMAGE_CHANNELS], default=_CONV_DEFAULT_WIDTH)
        early = Work(batch * side * side * narrow * narrow * 9, f"{batch} images x {side}x{side} positions (half "
                                                                 f"the written image size) x {narrow} x {narrow} "
                                                                 f"channels x 3x3", True)
        return max(work, early, key=lambda w: w.macs)
    widths = [w for _, w in layers if w is not None] + settings
    if not widths:
        return None
    width = max(widths)
    names = {name for name, _ in layers}
    if names and all(name in _RNN or name == "Embedding" for name in names) and names & set(_RNN):
        return Work(batch * width * 4 * width, f"{batch} rows per time step x {width} x {4 * width}", False, True)
    length = max(lengths, default=1) if names & set(_SEQUENCE_LAYERS) or lengths else 1
    rows = batch * length
    shape = f"{rows} rows ({batch} x {length} tokens)" if length > 1 else f"{rows} rows"
    return Work(rows * width * width, f"{shape} x {width} x {width}", False)


# Kernels one eval-mode forward launches per layer class, roughly: a Transformer layer launches its projections,
# attention, norms and residual adds; a convolution usually comes with a norm and an activation. Each layer written
# once counts once (a block repeated in a loop is undercounted, which keeps the estimate conservative).
_LAUNCHES = {"Linear": 2, "LazyLinear": 2, "Bilinear": 2, "Embedding": 1, "LSTM": 4, "GRU": 4, "RNN": 2,
             "MultiheadAttention": 6, "TransformerEncoderLayer": 12, "TransformerDecoderLayer": 18, "Transformer": 180}
_CONV_LAUNCHES = 3
# From about this many kernels a batch-1 forward costs more in Python and launch overhead than a CUDA-graph replay
# with its input copies (benchmarks/graphed_inference.py: a 4-layer, 256-wide encoder, 1.4 -> 0.33 s per game on
# an H200; the catalog's 3-layer MLP costs ~62 us per batch-1 forward, too little to pay for the replay's copies).
LAUNCH_BOUND_KERNELS = 16


def launches_per_forward(texts: dict[str, str]) -> int:
    """Kernels one forward of the program's networks launches, estimated from the layers it writes; large
    well-known models (torchvision, timm, from_pretrained) count as far above the launch-bound threshold."""
    if any(_big_model_named(text) for text in texts.values()):
        return 10 * LAUNCH_BOUND_KERNELS
    return sum(_CONV_LAUNCHES if name.startswith(("Conv", "LazyConv")) else _LAUNCHES.get(name, 1)
               for text in texts.values() for name, _ in _sizes(text).named_layers)

