"""Tests of the zoo's Hugging Face ``transformers`` models (``korch.zoo.hf``).

Each ``hf_*`` model is built, run eagerly, exported once into a module cache
directory and run in ONNX Runtime against its eager output; ``hf_bert`` then
goes through ``korch optimize`` for the CPU (reusing that export), whose
executable must pass its self-check against ONNX Runtime.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import onnx
import pytest
import torch

from korch import config
from korch.errors import KorchError
from korch.ir.ort import run_model
from korch.pipeline import optimize
from korch.zoo import build, export, get, hf, list_models

pytest.importorskip("transformers")

HF_NAMES = ["hf_bert", "hf_gpt2", "hf_llama", "hf_vit", "hf_whisper_encoder", "hf_t5_encoder", "hf_distilbert",
            "hf_phi", "hf_convnext", "hf_resnet", "hf_segformer", "hf_mobilenet_v2", "hf_efficientnet", "hf_swin"]

EXPECTED_OUTPUT_SHAPES = {
    "hf_bert": (1, 128, 256),
    "hf_gpt2": (1, 128, 256),
    "hf_llama": (1, 128, 256),
    "hf_vit": (1, 197, 384),
    "hf_whisper_encoder": (1, 128, 384),
    "hf_t5_encoder": (1, 128, 256),
    "hf_distilbert": (1, 128, 256),
    "hf_phi": (1, 128, 256),
    "hf_convnext": (1, 320, 7, 7),
    "hf_resnet": (1, 512, 7, 7),
    "hf_segformer": (1, 150, 64, 64),
    "hf_mobilenet_v2": (1, 1280, 7, 7),
    "hf_efficientnet": (1, 1280, 7, 7),
    "hf_swin": (1, 196, 192),
}
CONVOLUTIONAL = {"hf_convnext", "hf_resnet", "hf_mobilenet_v2", "hf_efficientnet"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A korch cache directory shared by this module's exports and its optimize run."""
    return tmp_path_factory.mktemp("korch-hf-cache")


def test_registered_after_the_other_models():
    names = [m.name for m in list_models()]
    assert names[-len(HF_NAMES):] == HF_NAMES
    for name in HF_NAMES:
        model = get(name)
        assert model.paper_primitive_nodes is None
        assert model.description.startswith("transformers ")
        assert all(s[0] == 1 for s in model.input_shapes.values())


def test_missing_transformers_is_a_one_line_korch_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    with pytest.raises(KorchError, match="pip install transformers") as info:
        build("hf_bert")
    assert "\n" not in str(info.value)


def test_token_ids_are_seeded_int64_in_the_vocabulary():
    _, (ids_a,) = build("hf_llama", seed=0)
    _, (ids_b,) = build("hf_llama", seed=0)
    _, (ids_c,) = build("hf_llama", seed=1)
    assert ids_a.dtype == torch.int64 and tuple(ids_a.shape) == (1, hf.SEQUENCE)
    assert 0 <= int(ids_a.min()) and int(ids_a.max()) < hf.VOCAB
    assert torch.equal(ids_a, ids_b) and not torch.equal(ids_a, ids_c)


@pytest.mark.parametrize("name", HF_NAMES)
def test_builds_exports_and_matches_onnxruntime(name, cache):
    model, inputs = build(name)
    assert not model.training
    spec = get(name)
    assert [tuple(t.shape) for t in inputs] == list(spec.input_shapes.values())
    with torch.no_grad():
        out = model(*inputs)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert tuple(out.shape) == EXPECTED_OUTPUT_SHAPES[name]
    assert torch.isfinite(out).all() and 1e-2 < out.std() and out.abs().max() < 1e4

    with config.patch(cache_dir=cache):
        path = export(name)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    assert [i.name for i in proto.graph.input] == list(spec.input_shapes)
    assert [o.name for o in proto.graph.output] == ["output"]
    # eager attention: plain MatMul + Softmax, nothing fused
    assert ("Softmax" in {n.op_type for n in proto.graph.node}) is (name not in CONVOLUTIONAL)

    result = run_model(str(path), {k: t.numpy() for k, t in zip(spec.input_shapes, inputs)})["output"]
    expected = out.numpy()
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(result, expected, rtol=1e-3, atol=1e-4 * scale)


def test_hf_bert_optimizes_for_the_cpu_and_passes_its_self_check(cache, tmp_path):
    with config.patch(cache_dir=cache), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = optimize("zoo:hf_bert", output=tmp_path / "out", target="cpu", cost="roofline")
    assert compiled.plan.kernels
    assert compiled.executable.check.ok, compiled.executable.check.summary()
