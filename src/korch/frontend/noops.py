"""Removal of the operators that do nothing in inference: Identity and Dropout.

Their consumers read the node's input instead. A graph output keeps its name:
when the removed node's input comes from another node, that node's output
takes the graph output's name; when the input is a graph input or a constant,
the node stays (as an Identity). Dropout's optional mask, in inference all
true, becomes a constant of the input's shape where anything reads it.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from korch.frontend.graph import is_op, reads, rename_inputs

Shapes = dict[str, tuple[tuple[int, ...] | None, str | None]]


def remove_noops(
    nodes: list[NodeProto],
    graph_outputs: list[str],
    constants: dict[str, np.ndarray],
    shapes: Shapes,
    opset: int,
) -> tuple[list[NodeProto], bool]:
    """Remove Identity and Dropout from topologically sorted ``nodes``.

    Adds Dropout masks to ``constants``. Returns the new node list and whether
    anything changed.
    """
    outputs = set(graph_outputs)
    used = set(graph_outputs)
    for node in nodes:
        used.update(reads(node))
    producer = {out: node for node in nodes for out in node.output if out}
    alias: dict[str, str] = {}

    def resolve(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    kept: list[NodeProto] = []
    changed = False
    for node in nodes:
        if not is_op(node, "Identity", "Dropout") or not node.input or not node.input[0]:
            kept.append(node)
            continue
        src, out = resolve(node.input[0]), node.output[0]
        mask = node.output[1] if len(node.output) > 1 else ""
        if mask in used:
            if src in constants:
                shape, dtype = constants[src].shape, constants[src].dtype.name
            else:
                shape, dtype = shapes.get(src, (None, None))
            if shape is None or dtype is None:
                kept.append(node)  # retried once shapes are known
                continue
            # Dropout-7 has a mask of the input's type; from opset 10 it is bool.
            constants[mask] = np.ones(shape, dtype=bool if opset >= 10 else np.dtype(dtype))
        if out not in outputs:
            alias[out] = src
            changed = True
        elif src in producer and src not in outputs:
            owner = producer.pop(src)
            owner.output[list(owner.output).index(src)] = out
            producer[out] = owner
            alias[src] = out
            changed = True
        elif is_op(node, "Identity"):
            kept.append(node)
        else:
            kept.append(helper.make_node("Identity", [src], [out], name=node.name))
            changed = True
    if not changed:
        return nodes, False
    mapping = {name: resolve(name) for name in alias}
    for node in kept:
        rename_inputs(node, mapping)
    return kept, True
