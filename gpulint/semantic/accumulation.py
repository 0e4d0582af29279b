"""Gradient accumulation: loops that step the optimizer every N backward passes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from gpulint.analysis import FileAnalysis, FileStructure, PerFileFacts, child_nodes, dotted_name, method_name

_OPTIMIZER = re.compile(r"optim|^opt(_|\d|$)|_opt$|^opt[A-Z]|scaler", re.I)
_ACCUM_NAME = re.compile(r"accum|grad_acc|update_freq|micro|need_update|do_update|do_step|should_step|"
                         r"sync_grad|is_last_micro", re.I)
_INNER_LOOP_NAME = re.compile(r"accum|grad_acc|micro|update_freq", re.I)


@dataclass
class Accumulation:
    """Backward on every micro-step, optimizer step once per N micro-steps."""

    kind: str  # "every-n": `if (i + 1) % N == 0: opt.step()` in the same loop; "inner-loop": micro-step loop
    loop: cst.CSTNode  # the loop whose iterations are micro-steps
    region: cst.CSTNode  # the loop that contains both the micro-steps and the step
    backward_calls: list[cst.Call] = field(default_factory=list)  # unconditional, once per micro-step
    step_calls: list[cst.Call] = field(default_factory=list)
    steps: cst.BaseExpression | None = None  # N, when visible


def is_backward(call: cst.Call) -> bool:
    return method_name(call) == "backward"


def is_optimizer_step(call: cst.Call) -> bool:
    if method_name(call) != "step" or not isinstance(call.func, cst.Attribute):
        return False
    receiver = dotted_name(call.func.value) or ""
    return bool(_OPTIMIZER.search(receiver.rsplit(".", 1)[-1]))


def _children_in_body(node: cst.CSTNode):
    """Descendants of a loop body, not entering nested functions, classes, lambdas or loops; yields
    (node, enclosing Ifs within the body)."""
    stack: list[tuple[cst.CSTNode, tuple[cst.If, ...]]] = [(node, ())]
    while stack:
        current, ifs = stack.pop()
        if current is not node and isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.For,
                                                        cst.While)):
            yield current, ifs
            continue
        yield current, ifs
        inner_ifs = ifs + (current,) if isinstance(current, cst.If) else ifs
        for child in reversed(child_nodes(current)):
            # the `else` branch of an If is under the same condition (negated): count it as conditional too
            stack.append((child, inner_ifs if not (isinstance(current, cst.If) and child is current.test) else ifs))


def _body(loop: cst.CSTNode) -> list[cst.CSTNode]:
    body = getattr(loop, "body", None)
    return list(body.body) if isinstance(body, cst.IndentedBlock) else []


def _continue_gate(loop: cst.CSTNode) -> tuple[int | None, cst.BaseExpression | None]:
    """(index in the loop body, N) of a top-level `if <every N micro-steps test>: continue`; (None, None)."""
    for index, statement in enumerate(_body(loop)):
        if isinstance(statement, cst.If) and statement.orelse is None and isinstance(statement.body, cst.IndentedBlock) \
                and len(statement.body.body) == 1 and isinstance(statement.body.body[0], cst.SimpleStatementLine) \
                and all(isinstance(small, cst.Continue) for small in statement.body.body[0].body):
            found, steps = accumulation_test(statement.test)
            if found:
                return index, steps
    return None, None


def _statement_positions(loop: cst.CSTNode) -> dict[int, int]:
    """id of each call in the loop body (not in nested loops or functions) -> index of its top-level statement."""
    positions: dict[int, int] = {}
    for index, statement in enumerate(_body(loop)):
        for node, _ in _children_in_body(statement):
            if isinstance(node, cst.Call):
                positions[id(node)] = index
    return positions


def accumulation_test(test: cst.BaseExpression) -> tuple[bool, cst.BaseExpression | None]:
    """Does an `if` test look like "every N micro-steps"? Returns (yes, N when visible)."""
    steps = None
    found = False
    stack: list[cst.CSTNode] = [test]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
            found, steps = True, node.right
        elif isinstance(node, (cst.Name, cst.Attribute)):
            name = node.value if isinstance(node, cst.Name) else node.attr.value
            if isinstance(name, str) and _ACCUM_NAME.search(name):
                found = True
                if steps is None and re.search(r"accum|update_freq", name, re.I):
                    steps = node
        stack.extend(child_nodes(node))
    return found, steps


class Accumulations(PerFileFacts):
    def __init__(self, analysis: FileAnalysis) -> None:
        super().__init__(analysis)
        self.items: list[Accumulation] = []
        # the loops that (transitively) contain a backward call are the only candidates
        structure = FileStructure.of(analysis)
        parents = structure.parents
        backward = [call for call in structure.calls if is_backward(call)]
        has_step = backward and any(is_optimizer_step(call) for call in structure.calls)
        if not backward or not has_step:
            return
        candidates: dict[int, cst.CSTNode] = {}
        for call in backward:
            current = parents.get(id(call))
            while current is not None:
                if isinstance(current, (cst.For, cst.While)):
                    candidates.setdefault(id(current), current)
                current = parents.get(id(current))
        for loop in candidates.values():
            found = self._every_n(loop) or self._inner_loop(loop)
            if found is not None:
                self.items.append(found)

    def _every_n(self, loop: cst.CSTNode) -> Accumulation | None:
        backward: list[tuple[cst.Call, tuple[cst.If, ...]]] = []
        steps: list[tuple[cst.Call, tuple[cst.If, ...]]] = []
        for node, ifs in _children_in_body(loop.body):
            if isinstance(node, cst.Call):
                if is_backward(node):
                    backward.append((node, ifs))
                elif is_optimizer_step(node):
                    steps.append((node, ifs))
        if not backward or not steps:
            return None
        # `if step % accumulation != 0: continue` ahead of the step gates everything after it
        gate, gate_count = _continue_gate(loop)
        position = _statement_positions(loop) if gate is not None else {}
        count = None
        for call, ifs in steps:
            gates = [accumulation_test(i.test) for i in ifs]
            if not any(ok for ok, _ in gates):
                if gate is None or position.get(id(call), -1) <= gate:
                    return None  # an optimizer step on every iteration: not accumulation
                gates = [(True, gate_count)]
            count = count or next((n for ok, n in gates if ok and n is not None), None)
        gated_ifs = {id(i) for _, ifs in steps for i in ifs if accumulation_test(i.test)[0]}
        every_step = [call for call, ifs in backward if not any(id(i) in gated_ifs or accumulation_test(i.test)[0]
                                                                  for i in ifs)
                      and (gate is None or position.get(id(call), -1) < gate)]
        if not every_step:
            return None
        return Accumulation("every-n", loop, loop, every_step, [c for c, _ in steps], count)

    def _inner_loop(self, outer: cst.CSTNode) -> Accumulation | None:
        inner_loops: list[cst.CSTNode] = []
        steps: list[cst.Call] = []
        for node, _ in _children_in_body(outer.body):
            if isinstance(node, (cst.For, cst.While)) and node is not outer:
                inner_loops.append(node)
            elif isinstance(node, cst.Call) and is_optimizer_step(node):
                steps.append(node)
        if not steps:
            return None
        for inner in inner_loops:
            if not isinstance(inner, cst.For) or not _INNER_LOOP_NAME.search(
                    self_code(inner.target) + " " + self_code(inner.iter)):
                continue
            backward, inner_steps = [], []
            for node, ifs in _children_in_body(inner.body):
                if isinstance(node, cst.Call):
                    if is_backward(node) and not ifs:
                        backward.append(node)
                    elif is_optimizer_step(node):
                        inner_steps.append(node)
            if not backward or inner_steps:
                continue
            count = None
            if isinstance(inner.iter, cst.Call) and dotted_name(inner.iter.func) == "range" and \
                    len(inner.iter.args) == 1:
                count = inner.iter.args[0].value
            return Accumulation("inner-loop", inner, outer, backward, steps, count)
        return None


def self_code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)
