"""Sites that run now and then rather than every iteration: gated by a step counter or a flag."""

from __future__ import annotations

import re

import libcst as cst

from gpulint.analysis import child_nodes, dotted_name

_DEVICE_GUARD = re.compile(r"cuda|is_available|device|gpu|accelerator", re.I)


def gated(ancestors: list[cst.CSTNode]) -> bool:
    """Inside an `if` that is more than a CUDA-availability guard, or an `except`/`finally`, within the
    current function: the call runs on a condition (a flag, every N steps, after an OOM), not every step."""
    for node in reversed(ancestors[:-1]):
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return False
        if isinstance(node, (cst.ExceptHandler, cst.Finally, cst.IfExp)):
            return True
        if isinstance(node, cst.If) and not _device_guard(node.test):
            return True
    return False


def _device_guard(test: cst.BaseExpression) -> bool:
    """`if torch.cuda.is_available():`, `if device.type == "cuda":`, `if args.cuda:`."""
    names: list[str] = []
    stack: list[cst.CSTNode] = [test]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute)):
            text = dotted_name(node)
            if text:
                names.append(text)
                continue
        if isinstance(node, cst.SimpleString):
            names.append(node.value)
            continue
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
            return False
        stack.extend(child_nodes(node))
    return bool(names) and all(_DEVICE_GUARD.search(n) for n in names)
