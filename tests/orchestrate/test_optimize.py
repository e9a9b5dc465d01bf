"""The whole pipeline: every zoo model optimizes, and its plan run kernel by kernel computes the model."""

import json
import warnings

import pytest

from korch import zoo
from korch.pipeline import optimize
from korch.orchestrate.plan import Plan
from korch.ir import interpret
from korch.ir.ort import random_inputs
from korch.runtime.plan_executor import run_plan
from tests.models.test_models_match_ort import max_relative_error
from tests.test_cli import assert_one_line_error, korch


@pytest.mark.parametrize("name", [m.name for m in zoo.list_models()])
def test_plan_executes_kernel_by_kernel_and_matches_the_model(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = optimize(f"zoo:{name}", target="h100", cost="roofline")
    graph, plan = result.graph, result.plan
    assert plan.kernels and plan.segments and all(s.optimal for s in plan.segments)
    # the plan runs in its order: each kernel reads only given tensors or what an earlier kernel wrote, writes
    # only what its own nodes compute, and the kernels together write every model output
    nodes = {node.name: node for node in graph.nodes}
    available = set(graph.inputs) | set(graph.constants)
    for k in plan.kernels:
        assert k.nodes and set(k.nodes) <= nodes.keys(), k.name
        assert set(k.inputs) <= available, (k.name, set(k.inputs) - available)
        assert k.outputs and set(k.outputs) <= {out for n in k.nodes for out in nodes[n].outputs}, k.name
        available |= set(k.outputs)
    assert set(graph.outputs) <= available
    feeds = random_inputs({n: (graph.tensors[n].shape, graph.tensors[n].dtype) for n in graph.inputs}, seed=2)
    want = interpret.run(graph, feeds)
    got = run_plan(graph, Plan.from_json(json.loads(json.dumps(plan.to_json()))), feeds)
    for out in graph.outputs:
        assert max_relative_error(got[out], want[out]) <= 1e-5, out


def test_optimize_cli_writes_plan_and_report(tmp_path):
    result = korch("optimize", "zoo:bert_layer", "-o", tmp_path / "out", "--target", "h100", "--cost", "roofline", "-q")
    assert result.returncode == 0, result.stderr
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["format"] == "korch-plan" and plan["kernels"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Kernels in execution order" in report and "predicted latency" in report
    page = (tmp_path / "out" / "report.html").read_text()
    assert all(f'id="kernel-{k["name"]}"' in page for k in plan["kernels"])


@pytest.mark.parametrize("args,needle", [
    (["--target", "tpu9"], "tpu9"),
    (["--time-limit", "0"], "time limit"),
    (["--time-limit", "-3"], "time limit"),
    (["--cut-points", "/nonexistent/cuts.toml"], "cuts.toml"),
    (["--cost", "guess"], "guess"),
    (["--measure-ahead", "-1"], "--measure-ahead"),
])
def test_optimize_bad_input_is_a_one_line_error(tmp_path, args, needle):
    result = korch("optimize", "zoo:candy", "-o", tmp_path / "out", *args)
    assert_one_line_error(result, needle)
    assert not (tmp_path / "out").exists()


def test_unreadable_cut_point_file(tmp_path):
    bad = tmp_path / "cuts.toml"
    bad.write_text("cut_points = [[[")
    assert_one_line_error(korch("optimize", "zoo:candy", "-o", tmp_path / "out", "--cut-points", bad), "cuts.toml")


def test_measure_ahead_is_the_searchs_setting_for_the_call_only(monkeypatch):
    from korch import config, pipeline

    seen = []
    monkeypatch.setattr(pipeline, "_optimize", lambda *a, **k: seen.append(config.measure_ahead))
    default = config.measure_ahead
    optimize("zoo:candy", target="cpu", measure_ahead=0)
    optimize("zoo:candy", target="cpu")
    assert seen == [0, default] and config.measure_ahead == default
