"""Cutting a kernel out of a primitive graph: the nodes of one candidate as a graph of their own.

A kernel sees only its declared inputs and writes only its declared outputs;
``extract`` builds exactly that graph, so running it checks that a plan's
kernels are self-contained.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import dataclasses

from korch.ir.graph import CONTIGUOUS, Graph, Tensor


def has_layouts(tensor: Tensor) -> bool:
    """Whether ``tensor`` can be stored in more than one layout: a 4-D floating-point value (an image's
    activations; constants are the backends' to lay out, as they pack weights)."""
    return tensor.rank == 4 and tensor.dtype.startswith("float")


def extract(graph: Graph, node_indices: Iterable[int], inputs: Sequence[str], outputs: Sequence[str],
            name: str = "kernel", layout: str = CONTIGUOUS) -> Graph:
    """The graph of ``graph.nodes[i] for i in node_indices`` reading ``inputs`` and writing ``outputs``; with
    ``layout`` every input and output that ``has_layouts`` is stored so (the kernel reads and writes it so)."""
    nodes = [graph.nodes[i] for i in sorted(node_indices)]
    sub = Graph(name=name, opset=graph.opset)
    for tensor in inputs:
        if tensor in graph.constants:
            sub.add_constant(tensor, graph.constants[tensor])
        else:
            sub.add_tensor(graph.tensors[tensor])
            sub.inputs.append(tensor)
    for node in nodes:
        for tensor in node.inputs:
            if tensor and tensor not in sub.tensors:
                if tensor not in graph.constants:
                    raise ValueError(f"kernel {name}: node {node.name} reads {tensor!r}, which is not among its inputs")
                sub.add_constant(tensor, graph.constants[tensor])
        for tensor in node.outputs:
            sub.add_tensor(graph.tensors[tensor])
        sub.nodes.append(node)
    sub.outputs = list(outputs)
    if layout != CONTIGUOUS:
        for tensor in (*sub.inputs, *sub.outputs):
            if has_layouts(sub.tensors[tensor]):
                sub.tensors[tensor] = dataclasses.replace(sub.tensors[tensor], layout=layout)
    return sub
