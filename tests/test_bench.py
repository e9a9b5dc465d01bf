"""``korch bench``'s peers for a plain ONNX file: the file's own graph in torch (onnx2torch), labelled so."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from korch import bench
from korch.errors import KorchError
from korch.ir.ort import run_model
from tests.runtime.test_executable import _two_output_model


def test_an_onnx_file_becomes_its_own_torch_module():
    model = _two_output_model()
    module, note = bench.torch_module_for("m.onnx", model.SerializeToString(), "cpu")
    assert note == "(onnx2torch)"
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        got = module(torch.from_numpy(x))
    want = run_model(model, {"x": x})
    np.testing.assert_allclose(got[0].numpy(), want["p"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1].numpy(), want["y"], rtol=1e-4, atol=1e-5)


def test_the_torchvision_stand_in_stays_inside_onnx2torch():
    """Without torchvision, onnx2torch still imports, and the process sees no fake torchvision."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here; `make test` installs onnx2torch without it")
    script = """
import sys
from korch import bench
bench._onnx2torch_convert()
print("torchvision visible:", "torchvision" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torchvision visible: False" in result.stdout


def test_a_model_onnx2torch_cannot_convert_is_a_named_failure():
    from onnx import TensorProto, helper

    node = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph([node], "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2,))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(KorchError, match="onnx2torch cannot convert"):
        bench.torch_module_for("det.onnx", model.SerializeToString(), "cpu")
