"""The GPU campaign's dry run: every phase's code on this CPU (a tiny model, the CPU's peers), writing the files a
GPU run writes; a phase past its deadline records its models as skipped instead of starting them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = {"facts.json", "campaign.json", "smoke.json", "small.json", "tf32.json", "large.json", "measured.json"}


def campaign(out, *args):
    env = {**os.environ, "KORCH_COMPILED_UNIT": "0", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_campaign.py"), "--dry-run", "--out", str(out),
                           *args], capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def dry_run(built_once):
    def run(out):
        done = campaign(out)
        assert done.returncode == 0, done.stderr[-3000:]
    return built_once("campaign-dry-run", run)


def test_the_dry_run_writes_every_file_a_gpu_run_writes(dry_run):
    assert {p.name for p in dry_run.iterdir()} == FILES  # within the device's 8 files
    record = json.loads((dry_run / "campaign.json").read_text())
    assert record["dry_run"] is True and record["target"] == "cpu" and "torch" in record["versions"]
    assert set(record["phase_results"]) == {"facts", "smoke", "small", "tf32", "large", "measured"}


def test_the_facts_phase_splits_the_search_timers_seconds_into_its_steps(dry_run):
    timer = json.loads((dry_run / "facts.json").read_text())["search_timer"]
    assert timer["kernels"] >= 2 and set(timer["by_backend"]) >= {"inductor", "library"}
    steps = timer["steps_per_kernel"]
    assert {"input sets", "timed runs", "rest"} <= set(steps) and steps["timed runs"] > 0
    assert abs(sum(steps.values()) - timer["seconds_per_kernel"]) < 1e-9


def test_the_facts_phase_records_each_backends_calling_cost_as_the_search_takes_it(dry_run):
    """On a GPU its empty kernel between events and chained in a graph (the node's time every kernel carries);
    on this CPU the first alone, and the cost taken off every kernel is that."""
    costs = json.loads((dry_run / "facts.json").read_text())["calling_costs"]
    assert {"inductor", "library"} <= set(costs), costs
    for cost in costs.values():
        assert cost["stamped_s"] > 0 and cost["chained_s"] is None and cost["cost_s"] > 0


def test_the_smoke_phase_ran_the_gpu_tests_which_skip_here(dry_run):
    smoke = json.loads((dry_run / "smoke.json").read_text())
    assert smoke["exit"] == 0 and "skipped" in smoke["summary"] and "-m gpu" in smoke["command"]


@pytest.mark.parametrize("phase", ["small", "tf32", "large", "measured"])
def test_each_model_phase_optimized_checked_and_benched(dry_run, phase):
    rows = json.loads((dry_run / f"{phase}.json").read_text())
    assert rows and all("error" not in r and "skipped" not in r for r in rows), rows
    for row in rows:
        assert row["check"]["ok"] and row["korch"]["median_s"] > 0 and row["precision"] == "fp32"
        assert {p["name"] for p in row["peers"]} == {"eager", "compile", "ort"}
        assert row["cost"] == ("measured" if phase == "measured" else "roofline")
        in_place = row["kernels_in_place"]  # each kernel as the executable runs it, beside the plan's cost
        assert in_place["run_s"] > 0 and len(in_place["worst"]) == min(row["kernels"], 30), in_place
        assert sum(b["kernels"] for b in in_place["by_backend"].values()) == row["kernels"]
        assert in_place["stamp_s"] == 0.0 and in_place["run_less_stamps_s"] == in_place["run_s"]  # a CPU's clock
        assert all(k["bytes"] > 0 for k in in_place["worst"]) and in_place["memory_bound"]["kernels"] >= 0
        assert isinstance(row["plan"]["optimal"], bool)
    if phase == "measured":
        assert rows[0]["measurement"]["candidates"] > 0 and isinstance(rows[0]["below_floor"], list)


def test_past_its_deadline_a_phase_starts_nothing(tmp_path):
    done = campaign(tmp_path, "--phases", "small", "--deadline", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "small.json").read_text())
    assert rows and all(r["skipped"].startswith("deadline") for r in rows)


def test_each_measured_search_gets_its_share_of_the_time_left(tmp_path, monkeypatch):
    """A measured search has a time limit: what the deadline leaves once every run still to start has its
    reserve, shared among them (one search without a limit ran past an H200 call's end and left no row)."""
    import dataclasses

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_campaign

    setting = gpu_campaign.Setting(target="cpu", models={}, precisions={}, peers={}, budget_s=0.05, smoke_tests=[],
                                   measured_time_limit_s=None, smoke_workers=0, db=tmp_path / "db.sqlite")
    run = gpu_campaign.Campaign(tmp_path, setting, deadline_s=500, reserve_s=90, jobs=1)
    monkeypatch.setattr(run, "left_s", lambda: 480.0)
    assert run._search_limit_s(3) == pytest.approx((480 - 3 * 90) / 3)
    assert run._search_limit_s(1) == pytest.approx(480 - 90)
    monkeypatch.setattr(run, "left_s", lambda: 100.0)
    assert run._search_limit_s(2) == 30.0  # never under 30 s
    capped = gpu_campaign.Campaign(tmp_path, dataclasses.replace(setting, measured_time_limit_s=60), 500, 90, 1)
    monkeypatch.setattr(capped, "left_s", lambda: 480.0)
    assert capped._search_limit_s(1) == 60


def test_the_memory_bound_kernels_are_the_large_ones_without_a_product_timed_less_their_events(monkeypatch):
    """Issue 16's kernel quality: the rate at which the plan's memory-bound kernels move their bytes, against the
    device's copy bandwidth (``facts.json``); a kernel's in-place time holds one timing event's (``stamp_s``)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from zoo_bench import memory_bound

    rows = [{"ops": "Add+Relu", "bytes": 4 << 20, "run_s": 3e-6},
            {"ops": "MatMul+Add", "bytes": 8 << 20, "run_s": 5e-6},
            {"ops": "Pad+Conv", "bytes": 8 << 20, "run_s": 5e-6},
            {"ops": "Sigmoid", "bytes": 1000, "run_s": 2e-6},
            {"ops": "Softmax", "bytes": 2 << 20, "run_s": 2e-6}]
    found = memory_bound(rows, 1e-6)
    assert found == {"kernels": 2, "bytes": 6 << 20, "run_s": pytest.approx(3e-6),
                     "Bps": pytest.approx((6 << 20) / 3e-6)}
    assert memory_bound(rows[1:4], 1e-6)["Bps"] is None  # none large and memory-bound
