"""A plan's kernels cut out of its graph: contiguous for the kernel-by-kernel executable, in the plan's layouts
for what measures them as the compiled unit stores their values (``benchmarks/warm_inputs.py``)."""

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper

from korch.ir.graph import CHANNELS_LAST, CONTIGUOUS
from korch.pipeline import optimize
from korch.runtime.build import kernel_graphs


def _conv_relu() -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, 8, 8))], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_kernel_graphs_keep_the_planned_layout_only_when_asked():
    result = optimize(_conv_relu(), target="cpu", cost="roofline")
    plan = dataclasses.replace(result.plan, kernels=tuple(dataclasses.replace(k, layout=CHANNELS_LAST)
                                                          for k in result.plan.kernels))
    images = lambda kernel: [kernel.tensors[n] for n in (*kernel.inputs, *kernel.outputs)  # noqa: E731
                             if n not in kernel.constants and kernel.tensors[n].rank == 4]
    laid_out = [t.layout for k in kernel_graphs(result.graph, plan, layouts=True) for t in images(k)]
    plain = [t.layout for k in kernel_graphs(result.graph, plan) for t in images(k)]
    assert laid_out and set(laid_out) == {CHANNELS_LAST}
    assert set(plain) == {CONTIGUOUS}
