"""Tests of the model zoo: registry, eager runs, ONNX export and its cache.

Each model is built and run once per test session (``eager`` fixture) and
exported once (``exported`` fixture, into a session cache directory).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from korch import config
from korch.errors import KorchError
from korch.zoo import ZOO_VERSION, ZooModel, build, export, get, list_models

# the transformers models (hf_*) have their own tests: test_hf.py
NAMES = [m.name for m in list_models() if not m.name.startswith("hf_")]

EXPECTED_OUTPUT_SHAPES = {
    "candy": [(1, 3, 224, 224)],
    "efficientvit": [(1, 19, 256, 256)],
    "yolov4": [(1, 3015, 52, 52), (1, 3015, 26, 26), (1, 3015, 13, 13)],
    "yolox_nano": [(1, 3549, 85)],
    "segformer_b0": [(1, 150, 128, 128)],
    "bert_layer": [(1, 128, 768)],
    "vit_block": [(1, 197, 768)],
}


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@pytest.fixture(scope="session")
def eager():
    """name -> (model, inputs, outputs), each model built and run at most once."""
    results: dict[str, tuple[nn.Module, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = {}

    def get_result(name: str):
        if name not in results:
            model, inputs = build(name)
            with torch.no_grad():
                results[name] = (model, inputs, _as_tuple(model(*inputs)))
        return results[name]

    return get_result


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """name -> path of the model exported into a session cache directory."""
    cache = tmp_path_factory.mktemp("korch-cache")

    def get_path(name: str):
        with config.patch(cache_dir=cache):
            return export(name)

    return get_path


def test_list_models_order_and_metadata():
    assert NAMES == ["candy", "efficientvit", "yolov4", "yolox_nano", "segformer_b0", "bert_layer", "vit_block"]
    papers = {m.name: m.paper_primitive_nodes for m in list_models() if m.name in NAMES}
    assert papers == {
        "candy": 184,
        "efficientvit": 380,
        "yolov4": 569,
        "yolox_nano": 367,
        "segformer_b0": 672,
        "bert_layer": None,
        "vit_block": None,
    }
    for model in list_models():
        assert isinstance(model, ZooModel)
        assert get(model.name) is model
        assert model.description
        assert all(isinstance(s, tuple) and s[0] == 1 for s in model.input_shapes.values())


def test_get_unknown_raises():
    with pytest.raises(KorchError, match=r"unknown zoo model 'nope'; known: candy, efficientvit"):
        get("nope")
    with pytest.raises(KorchError):
        build("nope")
    with pytest.raises(KorchError):
        export("nope")


@pytest.mark.parametrize("name", NAMES)
def test_eager_run(name, eager):
    model, inputs, outputs = eager(name)
    assert not model.training
    spec = get(name)
    assert [tuple(t.shape) for t in inputs] == list(spec.input_shapes.values())
    assert all(t.dtype == torch.float32 for t in inputs)
    assert [tuple(o.shape) for o in outputs] == EXPECTED_OUTPUT_SHAPES[name]
    for out in outputs:
        assert out.dtype == torch.float32
        assert torch.isfinite(out).all()
        # not collapsed to ~0 or a constant, not blown up
        assert 1e-2 < out.std() and out.abs().max() < 1e4
    # BatchNorms normalize for real
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert not torch.allclose(module.running_mean, torch.zeros_like(module.running_mean))
            assert not torch.allclose(module.running_var, torch.ones_like(module.running_var))
            assert not torch.allclose(module.weight, torch.ones_like(module.weight))


@pytest.mark.parametrize("name", NAMES)
def test_forward_follows_its_inputs_device(name):
    """A tensor the forward makes itself lands on its inputs' device: the GPU peers run these modules on CUDA
    (YOLOX's decode grid once came from ``torch.arange`` on the CPU and failed there). The meta device stands in
    for CUDA: it computes nothing and refuses to mix with CPU tensors as CUDA does."""
    model, inputs = build(name)
    with torch.no_grad():
        outputs = _as_tuple(model.to("meta")(*(t.to("meta") for t in inputs)))
    assert all(o.device.type == "meta" for o in outputs)


@pytest.mark.parametrize("name", NAMES)
def test_onnx_export_matches_eager(name, eager, exported):
    _, inputs, outputs = eager(name)
    path = exported(name)
    spec = get(name)

    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    assert [i.name for i in proto.graph.input] == list(spec.input_shapes)
    static = [tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in proto.graph.input]
    assert static == list(spec.input_shapes.values())
    expected_names = ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]
    assert [o.name for o in proto.graph.output] == expected_names
    assert not any(init.data_location == onnx.TensorProto.EXTERNAL for init in proto.graph.initializer)

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    results = session.run(None, {k: t.numpy() for k, t in zip(spec.input_shapes, inputs)})
    assert len(results) == len(outputs)
    for result, out in zip(results, outputs):
        expected = out.numpy()
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(result, expected, rtol=1e-3, atol=1e-4 * scale)


def test_export_cache(tmp_path, monkeypatch):
    with config.patch(cache_dir=tmp_path):
        first = export("bert_layer")
        assert first == tmp_path / "zoo" / f"bert_layer-s0-v{ZOO_VERSION}.onnx"
        assert first.is_file()
        mtime = first.stat().st_mtime_ns

        def no_export(*args, **kwargs):
            raise AssertionError("re-exported a cached model")

        monkeypatch.setattr(torch.onnx, "export", no_export)
        second = export("bert_layer")
    assert second == first
    assert first.stat().st_mtime_ns == mtime
    # the temporary file of the atomic write is gone
    assert list((tmp_path / "zoo").iterdir()) == [first]


def test_export_to_explicit_path(tmp_path):
    target = tmp_path / "sub" / "vit.onnx"
    assert export("vit_block", target, seed=3) == target
    assert onnx.load(str(target)).graph.input[0].name == "tokens"
    assert list(target.parent.iterdir()) == [target]


def test_build_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    model_a, inputs_a = build("vit_block", seed=0)
    assert torch.equal(torch.get_rng_state(), before)
    model_b, inputs_b = build("vit_block", seed=0)
    model_c, inputs_c = build("vit_block", seed=1)
    state_a, state_b, state_c = (m.state_dict() for m in (model_a, model_b, model_c))
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert not torch.equal(state_a["mlp.fc1.weight"], state_c["mlp.fc1.weight"])
    assert all(torch.equal(a, b) for a, b in zip(inputs_a, inputs_b))
    assert not torch.equal(inputs_a[0], inputs_c[0])


def test_bert_layer_mask_is_additive():
    model, (hidden, mask) = build("bert_layer")
    assert torch.count_nonzero(mask) == 0
    masked = mask.clone()
    masked[..., 64:] = -math.inf
    with torch.no_grad():
        full = model(hidden, mask)
        half = model(hidden, masked)
        # with the last 64 tokens masked out, the first 64 do not see them
        alone = model(hidden[:, :64], mask[..., :64])
    assert not torch.allclose(full[:, :64], half[:, :64])
    torch.testing.assert_close(half[:, :64], alone, rtol=1e-4, atol=1e-4)
