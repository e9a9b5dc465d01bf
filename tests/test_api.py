"""The Python API: korch.optimize on torch modules (matching eager torch) and ONNX models; korch.load."""

import numpy as np
import pytest
import torch

import korch
from korch import zoo


@pytest.mark.parametrize("name", ["bert_layer", "candy"])
def test_optimize_a_torch_module_matches_eager(name, tmp_path):
    module, inputs = zoo.build(name)
    exe = korch.optimize(module, inputs, target="cpu", cost="roofline", output=tmp_path / "out")
    with torch.no_grad():
        want = module(*inputs)
    got = exe(*inputs)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
    again = korch.load(tmp_path / "out")
    np.testing.assert_allclose(again(*[x.numpy() for x in inputs]), want.numpy(), rtol=1e-3, atol=1e-4)


def test_optimize_needs_example_inputs_for_a_module(tmp_path):
    with pytest.raises(korch.KorchError, match="example_inputs"):
        korch.optimize(torch.nn.ReLU(), target="cpu", cost="roofline", output=tmp_path / "o")


def test_example_inputs_are_refused_for_onnx_models(tmp_path):
    with pytest.raises(korch.KorchError, match="example_inputs are for torch modules"):
        korch.optimize("zoo:bert_layer", (torch.zeros(1),), target="cpu", output=tmp_path / "o")
