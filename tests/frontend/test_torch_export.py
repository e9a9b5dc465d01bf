"""Models written by torch's two ONNX exporters load fully static and still compute the same."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")

from korch.frontend import load_onnx  # noqa: E402


class Net(torch.nn.Module):
    """A view computed from x.shape, a softmax, a dropout: the usual export clutter."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 32)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x):
        batch, tokens, _ = x.shape
        h = self.dropout(self.linear(x)).view(batch, tokens, 4, 8)
        return torch.softmax(h, dim=-1).reshape(batch, -1)


def run(model, x: np.ndarray) -> np.ndarray:
    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def check(path: str, batch: int) -> None:
    imported = load_onnx(path, {onnx.load(path).graph.input[0].name: (batch, 5, 16)})
    model = imported.model
    ops = [node.op_type for node in model.graph.node]
    assert not {"Shape", "Gather", "Concat", "Unsqueeze", "Identity", "Dropout", "Constant"} & set(ops), ops
    tensors = {out for node in model.graph.node for out in node.output}
    tensors |= {v.name for v in model.graph.input} | {v.name for v in model.graph.output}
    tensors |= {t.name for t in model.graph.initializer}
    assert tensors <= set(imported.shapes)
    assert all(all(d >= 0 for d in shape) for shape, _ in imported.shapes.values())
    assert imported.shapes[model.graph.output[0].name] == ((batch, 160), "float32")
    onnx.checker.check_model(model)
    x = np.random.default_rng(0).standard_normal((batch, 5, 16)).astype(np.float32)
    np.testing.assert_allclose(run(model, x), run(path, x), rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return Net().eval()


def test_torchscript_exporter_opset_11(net, tmp_path):
    path = str(tmp_path / "ts.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.randn(2, 5, 16),), path, dynamo=False, opset_version=11,
            input_names=["x"], dynamic_axes={"x": {0: "batch"}},
        )
    assert "Shape" in {node.op_type for node in onnx.load(path).graph.node}
    check(path, batch=3)


def test_dynamo_exporter(net, tmp_path):
    path = str(tmp_path / "dynamo.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.randn(2, 5, 16),), path, dynamo=True,
            dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
        )
    assert onnx.load(path).opset_import[0].version >= 18
    check(path, batch=3)
