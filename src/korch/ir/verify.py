"""Invariants of a primitive graph, checked after every stage (as tinygrad's ``spec.py``).

``verify(graph)`` raises ``IRError`` naming the first broken rule:
every tensor is declared with a static shape and a supported dtype; nodes have
unique names and are in
topological order and define each tensor once; every input of a node is a
graph input, a constant or an earlier output; each non-opaque node's output
type is what ``shapes.infer`` says; Gather indices are constants; graph outputs
exist.
"""

from __future__ import annotations

from korch.ir import dtypes
from korch.ir.graph import CHANNELS_LAST, LAYOUTS, Graph
from korch.ir.ops import Op
from korch.ir.shapes import IRError, infer


def verify(graph: Graph) -> Graph:
    for name, tensor in graph.tensors.items():
        if name != tensor.name:
            raise IRError(f"tensor table key {name!r} holds {tensor.name!r}")
        if any((not isinstance(d, int)) or d < 0 for d in tensor.shape):
            raise IRError(f"tensor {name!r} has a non-static shape {tensor.shape}")
        if tensor.layout not in LAYOUTS or (tensor.layout == CHANNELS_LAST and tensor.rank != 4):
            raise IRError(f"tensor {name!r} of rank {tensor.rank} has layout {tensor.layout!r}")
    for name, value in graph.constants.items():
        t = graph.tensors.get(name)
        if t is None or t.shape != value.shape or t.dtype != value.dtype.name:
            raise IRError(f"constant {name!r} disagrees with its declaration")

    names = [node.name for node in graph.nodes]
    if not all(names) or len(set(names)) != len(names):
        raise IRError("node names must be unique and non-empty (plans refer to nodes by name)")
    defined = set(graph.inputs) | set(graph.constants)
    if len(defined) != len(graph.inputs) + len(graph.constants):
        raise IRError("a graph input is also a constant")
    for node in graph.nodes:
        where = f"node {node.name or '?'} ({node.op.value})"
        for name in node.inputs:
            if name and name not in defined:
                raise IRError(f"{where}: input {name!r} is not defined before it")
        for name in node.outputs:
            if name in defined:
                raise IRError(f"{where}: output {name!r} is defined twice")
            if name not in graph.tensors:
                raise IRError(f"{where}: output {name!r} is not declared")
            defined.add(name)
        if node.op is Op.OPAQUE:
            for key in ("op_type", "domain", "opset", "node"):
                if key not in node.attrs:
                    raise IRError(f"{where}: opaque node lacks attribute {key!r}")
            continue
        if len(node.outputs) != 1:
            raise IRError(f"{where}: primitives have one output, got {len(node.outputs)}")
        inputs = [graph.tensors[name] for name in node.inputs]
        try:
            shape, dtype = infer(node.op, node.attrs, inputs)
        except (KeyError, TypeError) as exc:
            raise IRError(f"{where}: bad attributes {dict(node.attrs)}: {exc!r}") from None
        except IRError as exc:
            raise IRError(f"{where}: {exc}") from None
        out = graph.tensors[node.output]
        if (out.shape, out.dtype) != (shape, dtype):
            raise IRError(f"{where}: output {out.name!r} declared {out.shape} {out.dtype}, rules give {shape} {dtype}")
        if dtype not in dtypes.SUPPORTED:
            raise IRError(f"{where}: dtype {dtype} is not supported")
    for name in graph.outputs:
        if name not in defined:
            raise IRError(f"graph output {name!r} is never defined")
    return graph
