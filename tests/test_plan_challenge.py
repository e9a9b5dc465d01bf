"""An unproven measured plan challenged by the floors' plan: which searches are challenged, the faster plan kept
with the challenge recorded (the timing decided by a stand-in: which unit is faster is the host's to say), and
the kept plan's executable written, reported and checked against ONNX Runtime."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from korch import config, pipeline, plan_challenge
from korch.ir.ort import run_model
from korch.orchestrate.plan import SegmentReport
from korch.pipeline import optimize
from korch.runtime import unit

from tests.backends.test_nchwc import _inverted_residual

ATEN = "as given to ATen"


def _report(optimal: bool) -> SegmentReport:
    return SegmentReport(nodes=1, candidates=1, exact=True, dropped=0, kernels=1, objective_s=1e-3, seconds=0.1,
                         optimal=optimal, gap=0.0 if optimal else 0.3, cycle_cuts=0)


@pytest.mark.parametrize("cost, target, optimal, on, expected", [
    ("measured", "cpu", [True, False], True, True),
    ("measured", "cpu", [True, True], True, False),  # proven: nothing to challenge
    ("roofline", "cpu", [False], True, False),  # it is the floors' plan
    ("measured", "h100", [False], True, False),  # GPU executables have no compiled unit
    ("measured", "cpu", [False], False, False),  # KORCH_PLAN_CHALLENGE=0
])
def test_only_unproven_measured_cpu_plans_are_challenged(cost, target, optimal, on, expected, monkeypatch):
    monkeypatch.setattr(config, "plan_challenge", on)
    assert plan_challenge.wanted(cost, target, [_report(o) for o in optimal]) is expected


def _faster(winner: str, monkeypatch) -> None:
    """Make ``winner`` ("plan" or "challenger") the faster unit of a challenge; every other timing is real."""
    real = unit._fastest_seconds

    def timed(units, inputs, device):
        if set(units) == {"plan", "challenger"}:
            return {name: 1e-3 if name == winner else 2e-3 for name in units}
        return real(units, inputs, device)
    monkeypatch.setattr(unit, "_fastest_seconds", timed)


def test_the_faster_plan_is_kept_with_the_search_stats_and_the_challenge(monkeypatch):
    model = _inverted_residual(c_mid=48)
    result = optimize(model, target="cpu", cost="roofline")
    ours = dataclasses.replace(result.plan, stats={**result.plan.stats, "measurement": {"asked": 7}})
    result.challenger = optimize(model, target="cpu", cost="roofline", max_kernel_nodes=1).plan
    assert [k.nodes for k in result.challenger.kernels] != [k.nodes for k in ours.kernels]
    data = unit.compile_unit(result.graph, ours, "cpu", unit.VARIANTS[ATEN])
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    for winner in ("challenger", "plan"):
        result.plan = ours
        _faster(winner, monkeypatch)
        kept_data, kept = plan_challenge.challenged(result, {"weights": ATEN}, data, "cpu")
        assert kept is result.plan
        assert kept.kernels == (result.challenger if winner == "challenger" else ours).kernels
        assert (kept_data == data) == (winner == "plan")
        record = kept.stats["plan challenge"]
        assert record == {"measured plan ms": 2.0 if winner == "challenger" else 1.0,
                          "floors' plan ms": 1.0 if winner == "challenger" else 2.0,
                          "kept": "floors'" if winner == "challenger" else "measured"}
        assert kept.stats["measurement"] == {"asked": 7}  # the search's own statistics stay
        got = unit.CompiledUnit.from_bytes(kept_data)(torch.from_numpy(x))[0]
        np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_a_search_writes_the_kept_plan_its_unit_and_the_challenge_in_its_report(tmp_path, monkeypatch):
    """Through ``optimize``: a challenged search (forced, since a small search may finish proven) whose floors'
    plan (forced apart: one primitive a kernel) runs faster writes that plan, its unit checked against ONNX
    Runtime, and the challenge in plan.json and report.md. The unit's own variants are not compared here."""
    monkeypatch.setattr(plan_challenge, "wanted", lambda cost, target, reports: True)
    floors = plan_challenge.floors_plan
    monkeypatch.setattr(plan_challenge, "floors_plan", lambda g, t, d, nodes, cuts: floors(g, t, d, 1, cuts))

    def one_variant(graph, plan, device):
        return unit.compile_unit(graph, plan, device, unit.VARIANTS[ATEN]), "", {"weights": ATEN}
    monkeypatch.setattr(pipeline, "_compile_unit", one_variant)
    _faster("challenger", monkeypatch)
    out = tmp_path / "out"
    result = optimize(_inverted_residual(c_mid=48), target="cpu", cost="measured", db=tmp_path / "db.sqlite",
                      jobs=1, time_limit=5, output=out, compiled_unit=True)
    assert result.manifest["check"]["ok"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["stats"]["plan challenge"]["kept"] == "floors'" and "measurement" in plan["stats"]
    assert all(len(k["nodes"]) == 1 for k in plan["kernels"])  # the floors' plan, one primitive a kernel
    report = (out / "report.md").read_text()
    assert "plan challenge: the measured search's unproven plan" in report
    assert "proven optimal: **no**" in report  # the floors' plan is optimal for its floors only
    assert "plan challenge" in (out / "report.html").read_text()


def test_a_challenger_that_fails_to_compile_leaves_the_measured_plan_and_says_so(monkeypatch):
    from korch.report.markdown import challenge_summary, proven

    model = _inverted_residual(c_mid=48)
    result = optimize(model, target="cpu", cost="roofline")
    ours = result.plan
    result.challenger = optimize(model, target="cpu", cost="roofline", max_kernel_nodes=1).plan

    def broken(*args, **kwargs):
        raise RuntimeError("Inductor says no")
    monkeypatch.setattr(unit, "challenge_plan", broken)
    data, kept = plan_challenge.challenged(result, {"weights": ATEN}, b"the measured plan's unit", "cpu")
    assert data == b"the measured plan's unit" and kept.kernels == ours.kernels
    record = kept.stats["plan challenge"]
    assert record["kept"] == "measured" and "Inductor says no" in challenge_summary(record)
    assert proven(kept) == all(s.optimal for s in ours.segments)
