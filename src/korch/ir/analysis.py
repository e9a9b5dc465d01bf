"""Counting what a primitive graph computes: FLOPs per node and bytes of parameters.

A FLOP is one scalar arithmetic operation; a multiply-add counts two. Layout
primitives move data and count zero; opaque nodes are not counted (their work
is unknown to korch).
"""

from __future__ import annotations

import math

from korch.ir import ops
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op


def node_flops(graph: Graph, node: Node) -> int:
    t = graph.tensors
    out = t[node.outputs[0]]
    if node.op in ops.ELEMENTWISE:
        return out.numel
    if node.op in ops.REDUCE:
        return t[node.inputs[0]].numel
    if node.op in ops.WINDOW:
        return out.numel * math.prod(node.attrs["kernel"])
    if node.op is Op.MATMUL:
        return 2 * out.numel * t[node.inputs[0]].shape[-1]
    if node.op is Op.CONV:
        w = t[node.inputs[1]]
        return 2 * out.numel * math.prod(w.shape[1:])
    if node.op is Op.CONV_TRANSPOSE:
        x, w = t[node.inputs[0]], t[node.inputs[1]]
        return 2 * x.numel * math.prod(w.shape[1:])
    return 0


def graph_flops(graph: Graph) -> int:
    return sum(node_flops(graph, n) for n in graph.nodes)


def parameter_bytes(graph: Graph) -> int:
    """Bytes of every constant the graph's nodes read."""
    used = {name for n in graph.nodes for name in n.inputs}
    return sum(int(v.nbytes) for name, v in graph.constants.items() if name in used)
