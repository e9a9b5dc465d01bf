"""Whole models: the primitive graph computes what the original model computes.

For the nine ``onnx`` light models and every zoo model, on seeded random
inputs, the reference executor on the primitive graph and ONNX Runtime on its
ONNX export both match ONNX Runtime on the original model (max relative error
<= 1e-4), and no operator is left opaque (a text model's embedding lookup, a
Gather on token ids, included).
"""

import glob
import os
import warnings

import numpy as np
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


def check_model(path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported, graph, report = load_model(path)
    assert not report.opaque, f"operators left opaque: {report.opaque}"
    feeds = random_inputs({n: (graph.tensors[n].shape, graph.tensors[n].dtype) for n in graph.inputs}, seed=1)
    want = run_model(path, feeds)
    ours = interpret.run(graph, feeds)
    exported = run_model(to_onnx(graph), feeds)
    for name in graph.outputs:
        assert ours[name].shape == want[name].shape
        assert max_relative_error(ours[name], want[name]) <= 1e-4, name
        assert max_relative_error(exported[name], want[name]) <= 1e-4, name


def test_light_models_are_all_present():
    assert len(LIGHT_MODELS) == 9, LIGHT_MODELS


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_onnxruntime(name):
    check_model(os.path.join(LIGHT_DIR, name))


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_model_matches_onnxruntime(name):
    check_model(str(zoo.export(name)))
