"""Hand-built kernel graphs for the Triton generator tests: dtypes and layouts ONNX snippets do not reach easily."""

from __future__ import annotations

import numpy as np

from korch.ir import shapes
from korch.ir.graph import Attrs, Graph, Node, Tensor


def build(inputs: dict[str, tuple[tuple[int, ...], str]], nodes, outputs, constants=None) -> Graph:
    """A kernel graph from (op, inputs, output, attrs) tuples; shapes and dtypes are inferred."""
    g = Graph(name="kernel")
    for name, value in (constants or {}).items():
        g.add_constant(name, np.asarray(value))
    for name, (shape, dtype) in inputs.items():
        g.add_tensor(Tensor(name=name, shape=tuple(shape), dtype=dtype))
        g.inputs.append(name)
    for op, ins, out, attrs in nodes:
        shape, dtype = shapes.infer(op, attrs, [g.tensors[t] for t in ins])
        g.add_tensor(Tensor(name=out, shape=shape, dtype=dtype))
        g.nodes.append(Node(op=op, inputs=tuple(ins), outputs=(out,), attrs=Attrs(attrs), name=out))
    g.outputs = list(outputs)
    return g
