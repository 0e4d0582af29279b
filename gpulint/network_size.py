"""How big a program's networks are, read from literal layer widths and width settings (`nn.Linear(512, ...)`,
`hidden_size=768`, `--d-model 1024`) and well-known model constructors. Precision rules use it: on small
networks (every width <= 256) the step is launch-bound and lower-precision math gains little or loses."""

from __future__ import annotations

import ast
import re
from functools import lru_cache

# convolutional networks: their compute is convolutions, which cuDNN already runs in TF32
_CNN_CONSTRUCTORS = r"\bresnet\d+\(|\befficientnet|\bdensenet\d+\(|\bvgg\d+\(|\bconvnext_\w+\("
_BIG_CNN = re.compile(_CNN_CONSTRUCTORS)
_BIG_MODEL = re.compile(r"torchvision\.models(?!\._?utils)|from\s+torchvision\s+import\s+[^\n]*\bmodels\b|"
                        r"timm\.create_model|from_pretrained\(|\bAutoModel|\bvit_\w+\(|" + _CNN_CONSTRUCTORS)
_WIDTH_NAME = re.compile(
    r"^(n_?embd|n_?embed|d_model|d_ff|dim_feedforward|ffn_dim|hidden(_size|_dim|_units|_channels|_features)?|"
    r"embed(ding)?_dim|emb_dim|model_dim|width|num_hiddens|nhid|ninp|emsize|n_hidden|intermediate_size)$", re.I)
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


def _const_int(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub, ast.FloorDiv, ast.Pow)):
        left, right = _const_int(node.left), _const_int(node.right)
        if left is None or right is None or (isinstance(node.op, ast.Pow) and right > 32):
            return None
        if isinstance(node.op, ast.FloorDiv):
            return left // right if right else None
        return {ast.Mult: left * right, ast.Add: left + right, ast.Sub: left - right,
                ast.Pow: left ** right if isinstance(node.op, ast.Pow) else 0}[type(node.op)]
    return None


@lru_cache(maxsize=4096)
def _widths(text: str) -> tuple[tuple[tuple[str, int | None], ...], tuple[int, ...]]:
    """((layer class, literal width or None) of nn layers, literal values of width-named settings) in one file."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return (), ()
    layers: list[tuple[str, int | None]] = []
    settings: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            dims = []
            for position, keyword in _LAYER_ARGS.get(name, ()):
                value = next((k.value for k in node.keywords if k.arg == keyword), None)
                if value is None and len(node.args) > position and not any(
                        isinstance(a, ast.Starred) for a in node.args[:position + 1]):
                    value = node.args[position]
                width = _const_int(value) if value is not None else None
                if width is not None:
                    dims.append(width)
            if name in _TWO_SIDED:
                # a GEMM is only as wide as its smallest side: Linear(9216, 128) is a small layer, and
                # Linear(2048, num_classes) is of unknown width
                layers.append((name, min(dims) if len(dims) == len(_LAYER_ARGS[name]) else None))
            elif name in _LAYER_ARGS:
                layers.append((name, max(dims) if dims else None))
            if name == "add_argument" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) \
                    and _WIDTH_NAME.match(node.args[0].value.lstrip("-").replace("-", "_")):
                value = next((k.value for k in node.keywords if k.arg == "default"), None)
                width = _const_int(value) if value is not None else None
                if width is not None:
                    settings.append(width)
            for keyword in node.keywords:
                if keyword.arg and _WIDTH_NAME.match(keyword.arg) and _const_int(keyword.value) is not None:
                    settings.append(_const_int(keyword.value))  # type: ignore[arg-type]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(
                    target, ast.Attribute) else ""
                if _WIDTH_NAME.match(name) and _const_int(node.value) is not None:
                    settings.append(_const_int(node.value))  # type: ignore[arg-type]
        elif isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            for arg, default in zip(positional[len(positional) - len(node.defaults):], node.defaults):
                if _WIDTH_NAME.match(arg.arg) and _const_int(default) is not None:
                    settings.append(_const_int(default))  # type: ignore[arg-type]
            for arg, default in zip(node.kwonlyargs, node.kw_defaults):
                if default is not None and _WIDTH_NAME.match(arg.arg) and _const_int(default) is not None:
                    settings.append(_const_int(default))  # type: ignore[arg-type]
    return tuple(layers), tuple(settings)


def network_size(texts: dict[str, str], *, matmul_only: bool = False) -> str | None:
    """"large" (a width above SMALL_WIDTH, or a well-known large model), "small" (widths are written and all
    are at most SMALL_WIDTH), or None (nothing shows). With `matmul_only`, convolutions do not count (for
    TF32, which cuDNN convolutions already use): a network of convolutions, with at most classifier-like
    Linear layers of unwritten width, is "small"."""
    for text in texts.values():
        model = _BIG_MODEL.search(text)
        if model and not (matmul_only and _BIG_CNN.fullmatch(model.group())):
            return "large"
    layers = [layer for text in texts.values() for layer in _widths(text)[0]]
    settings = [width for text in texts.values() for width in _widths(text)[1]]
    convolutional = matmul_only and (any(name.startswith(("Conv", "LazyConv")) for name, _ in layers)
                                     or any(_BIG_CNN.search(text) for text in texts.values()))
    widths = [w for name, w in layers if not (matmul_only and name.startswith(("Conv", "LazyConv")))]
    if any(w is not None and w > SMALL_WIDTH for w in widths) or any(w > SMALL_WIDTH for w in settings):
        return "large"
    if convolutional:
        unknown = [name for name, w in layers if w is None and not name.startswith(("Conv", "LazyConv"))]
        return "small" if all(name == "Linear" for name in unknown) else None
    known = [w for w in widths if w is not None]
    return "small" if known or settings else None
