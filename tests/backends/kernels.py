"""Kernel graphs for backend tests: small ONNX snippets lowered to primitives, and zoo candidates.

``kernel(nodes, inputs, outputs, initializers)`` makes a one-graph ONNX model
from ``onnx.helper`` nodes and lowers it with korch's fission: the whole
primitive graph is the kernel. ``fresh_kernels`` makes kernels no compiler cache
holds yet. ``check_built`` runs a built kernel against the
reference executor (``korch.backends.check``) and fails the test with the
reason.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from korch.backends.check import check
from korch.ir.graph import Graph
from tests.fission.oracle import lower

F32 = TensorProto.FLOAT


def kernel(nodes, inputs: dict[str, tuple], outputs: dict[str, tuple], initializers: dict[str, np.ndarray] | None = None,
           opset: int = 20) -> Graph:
    """The primitive graph of an ONNX graph of ``nodes`` (float32 inputs/outputs given by shape)."""
    graph = helper.make_graph(
        nodes, "kernel",
        [helper.make_tensor_value_info(n, F32, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, F32, s) for n, s in outputs.items()],
        [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in (initializers or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return lower(model)


def fresh_kernels(count: int) -> list[Graph]:
    """Elementwise-and-reduce kernels (``-exp(x)`` and its sum) no earlier run compiled: sizes drawn at random,
    and Inductor bakes sizes into its code."""
    import random

    from korch.ir.graph import Node, Tensor
    from korch.ir.ops import Op

    kernels = []
    for size in random.sample(range(10**5, 10**6), count):
        k = Graph(name=f"k{size}")
        for name in ("x", "e", "y", "s"):
            k.add_tensor(Tensor(name=name, shape=(size,) if name != "s" else (), dtype="float32"))
        k.nodes += [Node(op=Op.EXP, inputs=("x",), outputs=("e",), name="e"),
                    Node(op=Op.NEG, inputs=("e",), outputs=("y",), name="y"),
                    Node(op=Op.REDUCE_SUM, inputs=("y",), outputs=("s",), name="s",
                         attrs={"axes": (0,), "keepdims": False})]
        k.inputs, k.outputs = ["x"], ["y", "s"]
        kernels.append(k)
    return kernels


def check_built(built, graph: Graph, device: str = "cpu", seed: int = 0) -> None:
    result = check(built, graph, device=device, seed=seed)
    assert result.ok, result.message
