"""Each kernel's time as the executable runs it: one time per kernel, in plan order, the heavy kernel timed
as heavy; a compiled unit has no kernels to time apart. (The GPU path, events in a replayed CUDA graph, runs
in the GPU smoke tests.)"""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from korch.errors import KorchError
from korch.pipeline import optimize
from korch.runtime.kernel_times import kernel_times


def _heavy_and_light_model() -> onnx.ModelProto:
    """Two unrelated kernels: a 384-cube matrix product (57 MFLOP) and the negation of one element."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Neg", ["z"], ["n"])]
    w = onnx.numpy_helper.from_array(rng.standard_normal((384, 384)).astype(np.float32), "w")
    graph = helper.make_graph(nodes, "heavy_and_light",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (384, 384)),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, (1,))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (384, 384)),
                               helper.make_tensor_value_info("n", TensorProto.FLOAT, (1,))], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _inputs(executable) -> list[torch.Tensor]:
    return [torch.randn(shape) for shape, _ in (executable.input_specs[n] for n in executable.input_names)]


def test_every_kernel_gets_its_own_time_and_the_heavy_one_takes_longer(tmp_path):
    compiled = optimize(_heavy_and_light_model(), output=tmp_path / "out", target="cpu", cost="roofline",
                        compiled_unit=False)
    executable, plan = compiled.executable, compiled.plan
    assert len(plan.kernels) == 2
    times = kernel_times(executable, _inputs(executable), runs=5)
    assert len(times) == len(plan.kernels) and all(t > 0 for t in times)
    heavy = next(i for i, k in enumerate(plan.kernels) if "y" in k.outputs)
    light = 1 - heavy
    # 57 MFLOP against one element: ms against us, far beyond what the machine's load can swap
    assert times[heavy] > 5 * times[light]


def test_a_compiled_unit_has_no_kernels_to_time_apart(tmp_path):
    compiled = optimize(_heavy_and_light_model(), output=tmp_path / "out", target="cpu", cost="roofline",
                        compiled_unit=True)
    with pytest.raises(KorchError, match="compiled unit"):
        kernel_times(compiled.executable, _inputs(compiled.executable))
