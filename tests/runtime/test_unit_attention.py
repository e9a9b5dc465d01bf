"""A unit whose weights' products run in oneDNN and whose attention runs in MLAS (``ort_within="activations"``)."""

import io
import re
import zipfile

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from korch.backends import ort_gemm
from korch.errors import KorchError
from korch.ir.ort import run_model
from korch.pipeline import optimize
from korch.runtime import unit

TOKENS, WIDTH = 24, 32


def _attention_model() -> onnx.ModelProto:
    """One attention head: projections by constant weights, softmax(q k^T) v, an output projection."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", w], [v]) for w, v in (("wq", "q"), ("wk", "k"), ("wv", "v"))]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"]),
              helper.make_node("MatMul", ["o", "wo"], ["y"])]
    weights = [onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) / 4, name)
               for name in ("wq", "wk", "wv", "wo")]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  (TOKENS, WIDTH))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (TOKENS, WIDTH))], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _products(graph, *, of_weights: bool) -> set[str]:
    return {n.name for n in graph.nodes if n.op.value == "MatMul" and (n.inputs[1] in graph.constants) == of_weights}


def test_activations_variant_replaces_attentions_products_and_softmax_but_not_the_weights_products():
    result = optimize(_attention_model(), target="cpu", cost="roofline")
    graph = result.graph
    attention = _products(graph, of_weights=False)
    assert len(attention) == 2 and len(_products(graph, of_weights=True)) == 4
    softmax_parts = {name for s in ort_gemm.softmaxes(graph, graph.nodes) for name in s.parts}
    assert ort_gemm.of_activations(graph) == attention | softmax_parts
    module = unit.PlanModule(graph, result.plan, ort_kernels=True, ort_within="activations")
    computed = {name for name, step in module._replaced.items() if step}
    assert attention <= computed and not computed & _products(graph, of_weights=True)


def _mlas_operators(package: bytes) -> set[str]:
    """The korch_ort operators a compiled unit calls (AOTInductor lists them in its wrapper's JSON)."""
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        text = "".join(archive.read(n).decode(errors="replace") for n in archive.namelist() if n.endswith(".json"))
    return set(re.findall(r"korch_ort_\w+::(\w+)", text))


def test_activations_variant_matches_onnx_runtime_and_leaves_the_weights_products_out_of_mlas():
    model = _attention_model()
    result = optimize(model, target="cpu", cost="roofline")
    variant = unit.Variant(prepack=True, ort_kernels=True, ort_within="activations")
    package = unit.compile_unit(result.graph, result.plan, "cpu", variant)
    assert _mlas_operators(package) == {"batched_matmul", "softmax"}
    everywhere = unit.compile_unit(result.graph, result.plan, "cpu", unit.VARIANTS["MLAS by ONNX Runtime"])
    assert "matmul" in _mlas_operators(everywhere)
    x = np.random.default_rng(6).standard_normal((TOKENS, WIDTH)).astype(np.float32)
    got = unit.CompiledUnit.from_bytes(package)(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(got, run_model(model, {"x": x})["y"], rtol=1e-4, atol=1e-5)


def test_choose_unit_times_attention_in_mlas_against_the_fastest_weights_variant(monkeypatch):
    """With the weights' variants left to oneDNN, choose_unit challenges the best with attention in MLAS, keeps
    the faster of the two by their measured times, and records which in the manifest's choice."""
    monkeypatch.setattr(unit, "VARIANTS", {"packed for oneDNN": unit.VARIANTS["packed for oneDNN"]})
    result = optimize(_attention_model(), target="cpu", cost="roofline")
    data, choice = unit.choose_unit(result.graph, result.plan)
    measured = choice["measured_ms"]
    pair = {"ATen": measured[f"packed for oneDNN, {unit.ACTIVATIONS} in ATen"],
            "MLAS": measured[f"packed for oneDNN, {unit.ACTIVATIONS} in MLAS"]}
    assert choice[unit.ACTIVATIONS] == min(pair, key=pair.get)
    in_mlas = choice[unit.ACTIVATIONS] == "MLAS"
    assert choice["variant"] == (f"packed for oneDNN, {unit.ACTIVATIONS} in MLAS" if in_mlas else "packed for oneDNN")
    assert bool(choice.get("libraries")) == (choice[unit.ACTIVATIONS] == "MLAS")
    assert unit.chosen_variant(choice).ort_within == ("activations" if choice[unit.ACTIVATIONS] == "MLAS" else "all")


def test_a_recorded_choice_with_attention_in_mlas_reads_back_and_needs_its_library():
    chosen = unit.chosen_variant({"weights": "packed for oneDNN", unit.ACTIVATIONS: "MLAS"})
    assert chosen == unit.Variant(prepack=True, ort_kernels=True, ort_within="activations")
    assert not unit.chosen_variant({"weights": "packed for oneDNN", unit.ACTIVATIONS: "ATen"}).ort_kernels
    recorded = {**unit.unit_manifest(), "weights": "packed for oneDNN", unit.ACTIVATIONS: "MLAS"}
    with pytest.raises(KorchError, match="earlier korch"):
        unit.check_compatible(recorded, "OUTDIR")
    unit.check_compatible({**recorded, "libraries": ["korch_ort_x.so"]}, "OUTDIR")


@pytest.mark.parametrize("onednn_ms, challenger_ms", [(1.02, 0.9), (1.02, 1.1), (1.3, 0.9)])
def test_an_all_mlas_unit_is_challenged_by_a_close_onednn_one_with_attention_in_mlas(monkeypatch, onednn_ms,
                                                                                   challenger_ms):
    """Where the all-MLAS unit is fastest and oneDNN's is within ATTENTION_CHALLENGE_WITHIN of it, oneDNN's is
    compiled again with attention in MLAS and raced against the all-MLAS one; the faster is kept and recorded so
    that it reads back. A oneDNN unit further behind is not compiled again."""
    monkeypatch.setattr(unit, "VARIANTS", {name: unit.VARIANTS[name]
                                           for name in ("packed for oneDNN", "MLAS by ONNX Runtime")})
    challenger = f"packed for oneDNN, {unit.ACTIVATIONS} in MLAS"
    table = {"packed for oneDNN": onednn_ms, "MLAS by ONNX Runtime": 1.0, challenger: challenger_ms}
    monkeypatch.setattr(unit, "_fastest_seconds", lambda units, inputs, device: {n: table[n] / 1e3 for n in units})
    result = optimize(_attention_model(), target="cpu", cost="roofline")
    _, choice = unit.choose_unit(result.graph, result.plan)
    close = onednn_ms <= unit.ATTENTION_CHALLENGE_WITHIN
    assert (challenger in choice["measured_ms"]) == close
    if close and challenger_ms < 1.0:
        assert (choice["weights"], choice[unit.ACTIVATIONS], choice["variant"]) == ("packed for oneDNN", "MLAS",
                                                                                  challenger)
        assert unit.chosen_variant(choice) == unit.Variant(prepack=True, ort_kernels=True, ort_within="activations")
    else:
        assert choice["weights"] == choice["variant"] == "MLAS by ONNX Runtime"
        assert unit.ACTIVATIONS not in choice and unit.chosen_variant(choice).ort_within == "all"
