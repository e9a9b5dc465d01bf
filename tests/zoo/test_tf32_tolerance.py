"""The tf32 policy's tolerance is wide enough for TF32 arithmetic on the zoo (emulated on the CPU: every product's
operands rounded to TF32, what a GPU computes under ``--precision tf32``) and still fails a planted error."""

import warnings

import numpy as np
import pytest

from korch import precision, zoo
from korch.ir import interpret, ort
from korch.pipeline import load_model
from korch.runtime.selfcheck import check_outputs, seeded_inputs

# the Korch paper's models and the two single layers (the hf_* models are shallow: far inside either tolerance)
PAPER_ZOO = ["candy", "efficientvit", "yolov4", "yolox_nano", "segformer_b0", "bert_layer", "vit_block"]


@pytest.mark.parametrize("name", PAPER_ZOO)
def test_tf32_arithmetic_on_the_zoo_passes_the_tf32_check_and_a_planted_error_does_not(name):
    """The primitive graph run with every product's operands rounded to TF32 (what a GPU computes under
    ``--precision tf32``) matches ONNX Runtime within the tf32 tolerance; the same outputs with one element
    in a hundred off by the output's scale do not."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(f"zoo:{name}")
    feeds = seeded_inputs({n: (graph.tensors[n].shape, graph.tensors[n].dtype) for n in graph.inputs})
    expected = ort.run_model(str(zoo.export(name)), feeds, list(graph.outputs))
    with precision.emulated("tf32"):
        tf32 = interpret.run(graph, feeds)
    tolerance = precision.get("tf32").model_tolerance
    result = check_outputs(tf32, expected, tolerance)
    assert result.ok, result.summary()
    assert max(o.rel_norm for o in result.outputs) > 1e-6  # the emulation changed the arithmetic
    planted = {}
    for key, value in tf32.items():
        value = value.copy()
        flat = value.reshape(-1)
        flat[::100] += np.abs(flat).max() + 1.0
        planted[key] = value
    assert not check_outputs(planted, expected, tolerance).ok
