"""Whole models: the primitive graph computes what the original model computes.

For the nine ``onnx`` light models and every zoo model, on seeded random
inputs, the reference executor on the primitive graph and ONNX Runtime on its
ONNX export both match ONNX Runtime on the original model (max relative error
<= 1e-4), and no operator is left opaque (a text model's embedding lookup, a
Gather on token ids, included).
"""

import dataclasses
import glob
import os
import warnings

import numpy as np
import onnx
import onnx.backend.test
import pytest

from korch import zoo
from korch.ir.to_onnx import to_onnx
from korch.ir import interpret
from korch.ir.ort import random_inputs, run_model
from korch.pipeline import load_model

LIGHT_DIR = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "light")
LIGHT_MODELS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(LIGHT_DIR, "*.onnx")))
ZOO_MODELS = [m.name for m in zoo.list_models()]


def max_relative_error(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.max(np.abs(want.astype(np.float64)))) or 1.0
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


FLOAT32_NOISE = 1e-6  # the relative difference two float32 summation orders may make


def _softmax_logits(model: onnx.ModelProto, graph) -> dict[str, str]:
    """Graph output -> the logits the Softmax that makes it reads, where korch's graph keeps that tensor."""
    softmax_of = {node.output[0]: node.input[0] for node in model.graph.node if node.op_type == "Softmax"}
    return {name: softmax_of[name] for name in graph.outputs if softmax_of.get(name) in graph.tensors}


def check_model(path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported, graph, report = load_model(path)
    assert not report.opaque, f"operators left opaque: {report.opaque}"
    feeds = random_inputs({n: (graph.tensors[n].shape, graph.tensors[n].dtype) for n in graph.inputs}, seed=1)
    model = onnx.load(path)
    logits = _softmax_logits(model, graph)
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in logits.values())
    want = run_model(model, feeds)
    # a softmax of logits so large that float32 noise in them moves its exponents by more than 1 is compared
    # by its logits (the light models' random weights make logits of 8e11: ONNX Runtime's are equal and its
    # softmax uniform, another summation order's are not)
    compared = {name: logits[name] if name in logits and
                float(np.max(np.abs(want[logits[name]]))) * FLOAT32_NOISE > 1 else name for name in graph.outputs}
    extra = [t for t in compared.values() if t not in graph.outputs]
    ours = interpret.run(graph, feeds, outputs=[*graph.outputs, *extra])
    exported = run_model(to_onnx(dataclasses.replace(graph, outputs=[*graph.outputs, *extra])), feeds)
    for name, tensor in compared.items():
        assert ours[name].shape == want[name].shape
        assert max_relative_error(ours[tensor], want[tensor]) <= 1e-4, (name, tensor)
        assert max_relative_error(exported[tensor], want[tensor]) <= 1e-4, (name, tensor)


def test_light_models_are_all_present():
    assert len(LIGHT_MODELS) == 9, LIGHT_MODELS


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_onnxruntime(name):
    check_model(os.path.join(LIGHT_DIR, name))


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_model_matches_onnxruntime(name):
    check_model(str(zoo.export(name)))
