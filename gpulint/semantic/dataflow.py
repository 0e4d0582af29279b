"""Values computed from given calls inside one function: the names a network's outputs flow into.

`h = net(x)`, `out = head(h)`, `value = out.mean()` all carry `net(x)`'s autograd graph; a call that reads the
value as data (`.item()`, `.detach()`) or hands it to a function that returns something of its own ends the
flow (the caller decides which, through `stops`). One fixed point over the function's assignments, shared by
the questions "is an output returned with its graph?" and "do the outputs die inside the call?".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import libcst as cst

from gpulint.analysis import walk


def names_in(node: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(node, into_functions=True) if isinstance(n, cst.Name)}


@dataclass(frozen=True)
class Flow:
    names: frozenset[str]  # names bound to the calls' results or to values computed from them
    kept: bool  # some such value is stored on an object or in a container slot (`self.h = ...`, `buf[i] = ...`)


def flow_from(function: cst.FunctionDef, calls: list[cst.Call],
              stops: Callable[[cst.BaseExpression, set[str]], bool], rounds: int = 4) -> Flow:
    """Follow the results of `calls` through the assignments of `function` (a few rounds: chains are short);
    an assignment whose value `stops(value, names so far)` does not carry the flow on."""
    assignments = [n for n in walk(function.body) if isinstance(n, cst.Assign)]
    holding = {id(a) for a in assignments if a.value in calls or any(  # `q = net(s).gather(1, a)` holds it too
        isinstance(inner, cst.Call) and inner in calls for inner in walk(a.value))}
    names: set[str] = set()
    kept = False
    for _ in range(rounds):
        grown = False
        for assign in assignments:
            if assign.value in calls or (id(assign) in holding or names_in(assign.value) & names) \
                    and not stops(assign.value, names):
                kept |= any(not isinstance(t.target, (cst.Name, cst.Tuple, cst.List)) for t in assign.targets)
                new = set().union(*(names_in(t.target) for t in assign.targets)) - names
                names |= new
                grown |= bool(new)
        if not grown:
            break
    return Flow(frozenset(names), kept)
