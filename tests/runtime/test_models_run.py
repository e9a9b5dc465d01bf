"""Models end to end: optimized for the CPU, the executable, loaded back from its directory, matches ONNX
Runtime on the original model (what ``korch run --check`` does).

CI runs a representative subset that finishes in minutes on two cores: a conv network with instance norm
and reflect padding (Candy), a transformer layer and block (BERT, ViT), and two ``onnx`` light models.
Every zoo model and all nine light models go through the command line in
``benchmarks/run_check_all.py`` (results in ``benchmarks/results/run_check_cpu_roofline.md``).
"""

import os
import warnings

import pytest

from korch import zoo
from korch.pipeline import optimize
from korch.runtime.selfcheck import check_against_onnxruntime
from korch.runtime.load import load
from tests.models.test_models_match_ort import LIGHT_DIR

MODELS = ["zoo:candy", "zoo:bert_layer", "zoo:vit_block",
          os.path.join(LIGHT_DIR, "light_squeezenet.onnx"), os.path.join(LIGHT_DIR, "light_shufflenet.onnx")]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: os.path.basename(m).removeprefix("zoo:"))
def test_model_optimizes_runs_and_matches_onnxruntime(model, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = optimize(model, output=tmp_path / "out", target="cpu", cost="roofline")
        assert compiled.executable.check.ok, compiled.executable.check.summary()
        loaded = load(tmp_path / "out")
    source = str(zoo.export(model.removeprefix("zoo:"))) if model.startswith("zoo:") else model
    check = check_against_onnxruntime(loaded, source, seed=5)
    assert check.ok, check.summary()
