"""Acceptance: every zoo model and the nine onnx light models optimize for the CPU, and the executable,
loaded back from its directory, matches ONNX Runtime on the original model (``korch run --check``)."""

import os
import warnings

import pytest

from korch import zoo
from korch.api import compile_model
from korch.runtime.selfcheck import check_against_onnxruntime
from korch.runtime.write import load
from tests.models.test_models_match_ort import LIGHT_DIR, LIGHT_MODELS, ZOO_MODELS

MODELS = [f"zoo:{name}" for name in ZOO_MODELS] + [os.path.join(LIGHT_DIR, name) for name in LIGHT_MODELS]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: os.path.basename(m).removeprefix("zoo:"))
def test_model_optimizes_runs_and_matches_onnxruntime(model, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = compile_model(model, output=tmp_path / "out", target="cpu", cost="roofline")
        assert compiled.executable.check.ok, compiled.executable.check.summary()
        loaded = load(tmp_path / "out")
    source = str(zoo.export(model.removeprefix("zoo:"))) if model.startswith("zoo:") else model
    check = check_against_onnxruntime(loaded, source, seed=5)
    assert check.ok, check.summary()
