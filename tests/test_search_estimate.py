"""``korch optimize --estimate``: the work a measured GPU search would do, counted from the candidates, and
its minutes from compile times measured here (kernels compiled for Hopper in spawned processes)."""

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from korch import search_estimate
from korch.backends.registry import BackendPredicate, backends_for
from korch.errors import KorchError
from korch.orchestrate.candidates import enumerate_candidates
from korch.pipeline import load_model
from korch.search_estimate import estimate
from tests.test_cli import assert_one_line_error, korch


def _model(tmp_path):
    """relu(x @ w + b) * 2: products, pointwise and a bias, a handful of candidates."""
    w = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Mul", ["r", "two"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (16, 32))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(w, "w"),
                               onnx.numpy_helper.from_array(np.ones(64, np.float32), "b"),
                               onnx.numpy_helper.from_array(np.array(2, np.float32), "two")])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_the_estimate_counts_every_distinct_kernel_and_the_plans(tmp_path):
    path = _model(tmp_path)
    e = estimate(path, target="h100", jobs=16, sample=1)
    _, graph, _ = load_model(path)
    candidates = enumerate_candidates(graph, predicate=BackendPredicate(backends_for("h100"))).candidates
    assert e.candidates == len(candidates) and e.every.signatures == len({c.signature for c in candidates})
    assert 0 < e.plan_only.signatures <= e.every.signatures
    # every kernel is Inductor's too; Triton's kernels compile once per launch variant, and each is timed
    assert e.every.compiles["inductor"] == e.every.signatures
    assert e.every.timed_variants >= sum(e.every.compiles.values())
    # what the search times is each signature as each backend built it: Inductor's, and Triton's or the library's
    assert e.every.signatures < e.every.built <= e.every.timed_variants
    assert e.every.kernels["inductor"] == e.every.signatures and set(e.every.kernels) <= set(e.timing_s)
    # each kernel timed at its backend's seconds, one worker at a time, each worker's inputs drawn once
    timing_s = sum(n * e.timing_s[b] for b, n in e.every.kernels.items()) + e.jobs * search_estimate.ARENA_S
    assert e.timing_seconds(e.every) == pytest.approx(timing_s) and e.minutes(e.every) >= timing_s / 60
    assert e.compile_s and all(s > 0 for s in e.compile_s.values())
    assert 0 < e.minutes(e.plan_only) < e.minutes(e.every)
    # the compiles spread over the cores, the timings one worker at a time: from the same compile times (a second
    # estimate would time its compiles again, as fast as the machine's load lets it), one core compiles 16x longer
    compiling = sum(n * e.compile_s.get(cls, e.mean_compile_s) for cls, n in e.every.compiles.items())
    one_core = dataclasses.replace(e, jobs=1)
    assert e.minutes(e.every) == pytest.approx(max(compiling / 16, e.timing_seconds(e.every)) / 60)
    assert one_core.minutes(one_core.every) == pytest.approx(max(compiling, one_core.timing_seconds(e.every)) / 60)
    assert one_core.minutes(one_core.every) >= compiling / 60


def test_the_estimate_is_for_gpu_targets(tmp_path):
    with pytest.raises(KorchError, match="GPU targets"):
        estimate(_model(tmp_path), target="cpu")


def test_optimize_estimates_without_writing_and_needs_an_outdir_otherwise(tmp_path):
    path = _model(tmp_path)
    result = korch("optimize", path, "--target", "h100", "--estimate", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "every kernel measured" in result.stdout and "the roofline plan's kernels only" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]
    assert_one_line_error(korch("optimize", path, "--target", "cpu"), "-o OUTDIR")
