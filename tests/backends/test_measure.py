"""Measured optimization on the CPU: build, check, time, remember; failures dropped and named, never fatal."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from korch.backends import calling, measure, registry
from korch.backends.base import BuildError
from korch.backends.db import ProfileDB
from korch.report.markdown import render_markdown
from korch.cli import main
from korch.pipeline import optimize


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Gelu", ["a"], ["g"]),
             helper.make_node("LayerNormalization", ["g", "s", "t"], ["y"], axis=-1)]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w", (32, 32)), ("b", (32,)), ("s", (32,)), ("t", (32,)))]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (16, 32))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (16, 32))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


class Broken:
    """A backend that claims every multi-primitive kernel and builds wrong ones (or none)."""

    name = "broken"
    version = "0"

    def __init__(self, mode):
        self.mode = mode

    def supports_device(self, device):
        return True

    def claims(self, kernel):
        return None if len(kernel.nodes) > 1 else "broken: single primitives"

    def build(self, kernel, device):
        if self.mode == "build":
            raise BuildError("broken: refuses to build")

        class Wrong:
            backend, launches, source = "broken", 1, None

            def __call__(self, *inputs, out=None):
                for buffer in out:
                    buffer.fill_(1.0)
                return list(out)
        return Wrong()


def test_measured_plan_then_database_hit(tmp_path):
    db = tmp_path / "profile.sqlite"
    first = optimize(_model(), target="cpu", cost="measured", db=db, jobs=1, max_kernel_nodes=3)
    m = first.plan.stats["measurement"]
    assert m["kernels_measured"] > 0 and not m["failures"]
    assert 0 < m["signatures_asked"] <= m["signatures"] <= m["candidates"]
    assert m["measured_share"] == m["signatures_asked"] / m["signatures"]
    assert m["build_s"] > 0 and m["timing_s"] > 0
    assert f"{m['measured_share']:.0%} of the {m['signatures']} distinct" in render_markdown(first.plan, {}, None)
    assert all(k.measured and k.backend in m["backends"] for k in first.plan.kernels)  # the fastest wins
    assert all(k.cost_s >= k.bound_s for k in first.plan.kernels)
    rows = ProfileDB(db).stats()["rows"]
    # and the calling cost of each CPU backend that measured a kernel (the library's 1x1 convolutions: none here)
    calling = ProfileDB(db).get(measure.CALLING_COST, measure.device_key("cpu"))
    assert rows == m["kernels_measured"] + len(calling) and 3 <= len(calling) <= len(m["backends"])

    second = optimize(_model(), target="cpu", cost="measured", db=db, jobs=1, max_kernel_nodes=3)
    m2 = second.plan.stats["measurement"]
    # every signature the database holds is answered from it, never measured again. The second search may
    # still measure a signature the first never asked: one whose floor ties the optimum (a kernel measured below
    # its floor is raised to it), which the solver is free to pick first (seen once under load in a clean clone)
    fresh = m2["signatures_asked"] - m2["from_database"]
    assert m2["from_database"] > 0 and m2["kernels_measured"] <= fresh * len(m2["backends"])
    assert ProfileDB(db).stats()["rows"] == rows + m2["kernels_measured"]
    # both plans are optimal over the same latencies: the same objective (kernels may differ where plans tie)
    assert second.plan.predicted_latency_s == pytest.approx(first.plan.predicted_latency_s, rel=1e-9)


@pytest.mark.parametrize("mode", ["build", "check"])
def test_failing_kernels_are_dropped_counted_and_named(tmp_path, monkeypatch, mode):
    real = registry.backends_for

    def with_broken(target):
        return [Broken(mode)] + real(target)
    monkeypatch.setattr(registry, "backends_for", with_broken)
    monkeypatch.setattr(measure, "backends_for", with_broken)
    out = tmp_path / "out"
    onnx.save(_model(), tmp_path / "m.onnx")
    assert main(["optimize", str(tmp_path / "m.onnx"), "--target", "cpu", "--cost", "measured", "--jobs", "1",
                 "--db", str(tmp_path / "db.sqlite"), "--max-kernel-nodes", "3", "-o", str(out), "-q"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    failures = plan["stats"]["measurement"]["failures"]
    assert failures and all(f["backend"] == "broken" for f in failures)
    assert {f["status"] for f in failures} == {f"{mode}_failed"}
    assert all(k["backend"] != "broken" for k in plan["kernels"])
    report = (out / "report.md").read_text()
    assert "failed to build or check" in report and failures[0]["signature"][:12] in report


def test_a_measured_search_past_its_time_limit_plans_from_what_it_measured(tmp_path, capsys):
    onnx.save(_model(), tmp_path / "m.onnx")
    out = tmp_path / "out"
    assert main(["optimize", str(tmp_path / "m.onnx"), "--target", "cpu", "--cost", "measured", "--jobs", "1",
                 "--db", str(tmp_path / "db.sqlite"), "--max-kernel-nodes", "3", "--time-limit", "0.001",
                 "-o", str(out), "-q"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["kernels"] and all(k["measured"] for k in plan["kernels"])  # one round: the plan's kernels
    assert all(0 <= s["gap"] < 1 and s["optimal"] == (s["gap"] == 0) for s in plan["segments"])
    said = capsys.readouterr().out
    assert "optimal" in said and (all(s["optimal"] for s in plan["segments"]) or "gap" in said)


def test_parallel_workers_build_and_check(tmp_path):
    result = optimize(_model(), target="cpu", cost="measured", db=tmp_path / "p.sqlite", jobs=2, max_kernel_nodes=2)
    m = result.plan.stats["measurement"]
    assert m["kernels_measured"] > 0 and not m["failures"]
    # what the search's solves took, beside its measuring: per segment and in all
    segments = result.plan.segments
    assert m["solves"] == sum(s.solves for s in segments) >= len(segments) and 0 <= m["proofs"] <= m["solves"]
    assert 0 < m["solve_s"] == pytest.approx(sum(s.solve_s for s in segments))


def test_the_solver_sees_measured_latency_less_the_calling_cost(monkeypatch, tmp_path):
    """Kernels are timed through a Python call the executable does not make; that cost, measured once per
    backend, comes off every latency the solver sees (never below zero)."""
    import dataclasses

    from korch.backends.db import Record
    from korch.pipeline import load_model

    asked = []
    monkeypatch.setattr(measure, "calling_cost_s", lambda backend, device: asked.append(backend.name) or 2e-5)
    _, graph, _ = load_model(_model())
    db = ProfileDB(tmp_path / "p.sqlite")
    measurer = measure.KernelMeasurer(graph, [], [], target="cpu", db=db)
    record = Record(signature="s", device="cpu", backend="library", backend_version="1", status="ok",
                    latency_s=5e-5)
    assert measurer.in_place_s(record) == pytest.approx(3e-5)
    assert measurer.in_place_s(dataclasses.replace(record, latency_s=1e-5)) == 0.0
    assert asked == ["library"]
    # kept in the database: another measurer (another run) uses the same cost, so the same plan
    again = measure.KernelMeasurer(graph, [], [], target="cpu", db=db)
    assert again.in_place_s(record) == pytest.approx(3e-5) and asked == ["library"]


@pytest.mark.parametrize("backend", [registry.LibraryBackend(), registry.InductorBackend()])
def test_calling_cost_is_measured_on_an_empty_kernel(backend):
    kernel = calling.empty_kernel()
    assert backend.claims(kernel) is None
    assert 0.0 < calling.calling_cost_s(backend, "cpu") < 0.01


def test_the_calling_cost_is_the_fastest_empty_call_not_a_noisy_median(monkeypatch):
    from korch.backends.timing import Timing

    fastest = iter([9.3e-6, 5.2e-6, 7.1e-6])  # one timing slowed by a busy moment: the fastest is kept
    warmed = []
    # every run the budget allows: the fastest call is what is kept, not a median (settle_within=None)
    monkeypatch.setattr(calling, "time_measured", lambda call, sets, device, warm_path, settle_within:
                        (call(0), warmed.append(warm_path), Timing(9.9e-6, next(fastest), 100))[-1]
                        if settle_within is None else None)
    backend = registry.LibraryBackend()
    assert calling.calling_cost_s(backend, "cpu", timings=3) == 5.2e-6
    # the empty kernel is timed as kernels are: its calling path warmed by itself, built once per process
    assert warmed == [calling.empty_call(backend, "cpu")] * 3 and warmed[0] is not None


def test_on_a_gpu_the_calling_cost_is_less_what_an_empty_kernel_costs_chained_in_a_graph(monkeypatch):
    """A GPU kernel is timed between two events in a graph; the executable's graph runs it with nothing between,
    where each kernel costs the graph's time per node besides (an H200: 1.09 us for an empty kernel against
    0.3 us timed between events). What comes off every latency is the difference: negative, it adds."""
    from korch.backends.timing import Timing

    chained = []
    monkeypatch.setattr(calling, "empty_call", lambda backend, device: lambda: None)
    monkeypatch.setattr(calling, "time_measured", lambda call, sets, device, warm_path, settle_within:
                        Timing(4e-7, 3e-7, 50))
    monkeypatch.setattr(calling, "chained_in_graph_s", lambda call, device: chained.append(device) or 1.1e-6)
    backend = registry.LibraryBackend()
    assert calling.calling_cost_s(backend, "cuda:0") == pytest.approx(3e-7 - 1.1e-6)
    assert calling.calling_cost_s(backend, "cpu") == 3e-7 and chained == ["cuda:0"]  # a CPU has no graph

    def uncapturable(call, device):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(calling, "chained_in_graph_s", uncapturable)
    assert calling.calling_cost_s(backend, "cuda:0") == 3e-7  # the stamps' cost alone, as before


def test_a_cpu_kernels_calling_path_is_warmed_by_its_backends_empty_kernel(monkeypatch):
    """The cold start sweeps the timer's own calling path out of the cache too; the backend's empty kernel
    brings it back before each timed call, and the calling cost subtracted is timed the same way."""
    from korch.backends.check import RandomArena
    from tests.backends.kernels import fresh_kernels

    kernel, = fresh_kernels(1)
    backend = registry.LibraryBackend()
    seen = []
    real = measure.time_measured
    monkeypatch.setattr(measure, "time_measured", lambda call, sets, device, warm_path=None:
                        (seen.append(warm_path), real(call, sets, device, warm_path))[-1])
    checked = measure._build_and_check(backend, kernel, "cpu")
    assert checked.status == "ok"
    measure._time_checked(checked, kernel, backend, RandomArena("cpu"), "cpu")
    assert checked.latency_s > 0 and seen == [calling.empty_call(backend, "cpu")] and seen[0] is not None


def test_calling_costs_are_measured_before_the_first_batch_is_built(tmp_path, monkeypatch):
    """The build workers' start-up keeps the cores busy: calling costs timed after it read 2-4 us high."""
    real, seen = measure.KernelMeasurer._checked_builds, []

    def checked_builds(self, todo, kernels, *args, **kwargs):
        seen.append(set(self._calling_s))
        return real(self, todo, kernels, *args, **kwargs)
    monkeypatch.setattr(measure.KernelMeasurer, "_checked_builds", checked_builds)
    result = optimize(_model(), target="cpu", cost="measured", db=tmp_path / "p.sqlite", jobs=1, max_kernel_nodes=2)
    assert seen and seen[0] == {b.name for b in registry.backends_for("cpu")}
    assert result.plan.stats["measurement"]["kernels_measured"] > 0


def test_db_check_compares_every_measured_kernel_with_its_floor(tmp_path, capsys):
    """``korch db check`` names every measured kernel faster than its floor (a floor the measurements disprove)
    and exits 1 when there is one: a kernel planted below its floor joins whatever this machine already shows."""
    import dataclasses

    from korch.backends.measure import device_key
    from korch.cost import part_columns
    from korch.dbcheck import check_floors
    from korch.ir import Op
    from korch.pipeline import candidate_kernels, load_model

    db, model = tmp_path / "profile.sqlite", tmp_path / "tiny.onnx"
    onnx.save(_model(), model)
    optimize(str(model), target="cpu", cost="measured", db=db, jobs=1, max_kernel_nodes=3)
    before = check_floors(str(model), target="cpu", db=db)
    assert before.records > 0 and before.signatures <= before.candidates
    already = {b.signature for b in before.below}
    # planted: a kernel that holds the product beside other primitives, whose floor is most of the product's time
    # alone (microseconds, far above the timer's resolution), not the product alone (that would lower the floor)
    _, graph, _ = load_model(str(model))
    candidates = candidate_kernels(graph, "cpu", "measured", 3).candidates
    alone = {candidates[c].signature for ids in part_columns(graph, candidates).values() for c in ids}
    product = next(i for i, n in enumerate(graph.nodes) if n.op is Op.MATMUL)
    holding = {c.signature for c in candidates if product in c.nodes} - alone - already
    profile = ProfileDB(str(db))
    slowest = max((r for r in profile._select("device = ? AND status = 'ok' AND signature != 'calling-cost'",
                                              (device_key("cpu"),)) if r.signature in holding),
                  key=lambda r: r.latency_s)
    profile.put([dataclasses.replace(slowest, latency_s=1e-12)])
    code, out = main(["db", "check", str(model), "--target", "cpu", "--db", str(db)]), capsys.readouterr().out
    after = check_floors(str(model), target="cpu", db=db)
    assert {b.signature for b in after.below} == already | {slowest.signature}
    assert code == 1 and f"{len(after.below)} faster than their floor" in out and slowest.signature[:10] in out


def test_a_build_worker_compiles_the_kernel_the_parent_times(monkeypatch):
    """A worker writes the kernel for the parent's thread count (Inductor bakes it into the parallel loops), so
    the parent's rebuild before timing finds it compiled: it compiles nothing, and times what was checked; the
    worker kept the kernel in korch's kernel store, so the parent does not even lower it again."""
    import torch
    from torch._dynamo.utils import counters
    from torch._inductor import cpp_builder

    from korch import precision, workers
    from tests.backends.kernels import fresh_kernels

    kernel, = fresh_kernels(1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the worker's default of one
    try:
        with workers.pool(1) as pool:
            checked, = pool.submit(measure._worker, "cpu", [(kernel, "inductor")], "cpu", precision.current().name,
                                   torch.get_num_threads()).result()
        assert checked.status == "ok", checked.message
        compiles = []
        build = cpp_builder.CppBuilder.build
        monkeypatch.setattr(cpp_builder.CppBuilder, "build", lambda self: compiles.append(self) or build(self))
        lowered = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"]
        # under the run's precision, as the worker built it and as a search builds: the store keys the policy
        with precision.applied():
            built = registry.InductorBackend().build(kernel, "cpu")
        # not even lowered again, nor looked up in Inductor's cache: loaded from the store
        assert counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"] == lowered
        assert "def call(" in built.source
    finally:
        torch.set_num_threads(threads)
    # (a process's first build also preprocesses Inductor's header, to key its caches: not a kernel)
    assert [c for c in compiles if c.get_target_file_path().endswith(".so")] == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_kernels_timed_in_the_build_workers_are_those_timed_here(tmp_path, monkeypatch, jobs):
    """On a GPU the build workers time their kernels themselves, one at a time under a lock
    (``time_in_workers``); what comes back is what timing here gives: every kernel measured once, checked,
    with a latency."""
    from korch.backends.registry import BackendPredicate, backends_for
    from korch.cost import candidate_bounds, get_device
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.pipeline import load_model

    _, graph, _ = load_model(_model())
    candidates = enumerate_candidates(graph, max_nodes=2, predicate=BackendPredicate(backends_for("cpu"))).candidates
    bounds = candidate_bounds(graph, candidates, get_device("cpu"))
    measured = {}
    timed_here = []  # kernels this process timed (spawned workers run the module unpatched)
    real = measure._time_checked
    monkeypatch.setattr(measure, "_time_checked", lambda checked, *a, **k: timed_here.append(1) or real(checked, *a, **k))
    for in_workers in (False, True):
        timed_here.clear()
        measurer = measure.KernelMeasurer(graph, candidates, bounds, target="cpu", jobs=jobs,
                                          db=ProfileDB(tmp_path / f"{in_workers}.sqlite"))
        measurer.time_in_workers = in_workers
        asked = []
        measurer.on_kernel = asked.append
        try:
            latencies = measurer.measure(range(len(candidates)))
        finally:
            measurer.close()
        assert len(asked) == measurer.stats.measured > 0 and not measurer.stats.failures
        assert all(0 < latencies[c] < float("inf") for c in range(len(candidates)))
        assert measurer.stats.timing_s > 0
        assert bool(timed_here) == (jobs == 1 or not in_workers)
        # which backend is fastest may differ from run to run; what was measured may not
        measured[in_workers] = sorted((s, r is not None) for s, r in measurer.best.items())
    assert measured[True] == measured[False]


def test_a_device_lock_never_released_delays_a_timing_but_does_not_hang_it(monkeypatch):
    """A build worker that died holding the device lock (a GPU search) leaves it taken: the others time
    without it after ``DEVICE_LOCK_WAIT_S`` instead of waiting forever."""
    import multiprocessing

    lock = multiprocessing.get_context("spawn").Lock()
    lock.acquire()  # held by a worker that died
    monkeypatch.setattr(measure, "DEVICE_LOCK_WAIT_S", 0.05)
    ran = []
    with measure._device_held(lock):
        ran.append(1)
    assert ran and not lock.acquire(block=False)  # still taken: not released by one that never held it
    free = multiprocessing.get_context("spawn").Lock()
    with measure._device_held(free):
        assert not free.acquire(block=False)  # held inside
    assert free.acquire(block=False)  # released after


def test_kernels_timed_beside_busy_processes_are_flagged_and_measured_again(tmp_path, monkeypatch):
    """A timing that found other processes on the cores in every try is kept for this search, flagged in the
    database, counted, warned about; the next search on that database measures it again."""
    import dataclasses

    real = measure.time_measured

    def busy(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), disturbed=True)
    monkeypatch.setattr(measure, "time_measured", busy)
    db = tmp_path / "p.sqlite"
    with pytest.warns(UserWarning, match="found other processes on the CPU cores"):
        first = optimize(_model(), target="cpu", cost="measured", db=db, jobs=1, max_kernel_nodes=2)
    m = first.plan.stats["measurement"]
    assert m["kernels_measured"] > 0 and m["disturbed"] == m["kernels_measured"]
    flagged = _messages(db)
    assert flagged and set(flagged) == {measure.DISTURBED}

    monkeypatch.setattr(measure, "time_measured", real)  # a quiet machine: measured again, trusted from then on
    again = optimize(_model(), target="cpu", cost="measured", db=db, jobs=1, max_kernel_nodes=2)
    m2 = again.plan.stats["measurement"]
    # nothing answered from the flagged records (the second search may ask fewer signatures: its timings differ)
    assert m2["from_database"] == 0 and m2["kernels_measured"] > 0 and m2["disturbed"] == 0
    # its first round asks what the first search's first round measured (the same floors, nothing trusted)
    assert _messages(db).count(measure.DISTURBED) < len(flagged)  # replaced by quiet records


def _messages(db) -> list[str]:
    """The message of every kernel's ok record in the database at ``db``."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        return [m for (m,) in conn.execute("SELECT message FROM measurements WHERE status = 'ok' AND signature != ?",
                                           (measure.CALLING_COST,))]


def test_a_cpu_kernel_is_timed_on_warm_inputs_and_a_gpu_kernel_on_rotated_ones(monkeypatch):
    """In an executable a kernel reads what the kernel before it has just written, so on a CPU every timed call
    reads the same input set (a small kernel's inputs would otherwise rotate over enough sets to overflow the
    cache); on a GPU the sets still rotate (``rotation_sets``)."""
    from korch.backends.check import RandomArena
    from korch.backends.timing import cache_size, rotation_count
    from tests.backends.kernels import fresh_kernels

    kernel, = fresh_kernels(1)
    nbytes = sum(kernel.tensors[n].nbytes for n in (*kernel.inputs, *kernel.outputs))
    assert rotation_count(nbytes, cache_size("cpu")) > 1  # small enough to rotate
    seen = []

    def built(*inputs):
        seen.append(tuple(x.data_ptr() for x in inputs))
        return [inputs[0]]

    built.launches = 1
    measure._time_built(built, kernel, [], RandomArena("cpu"), "cpu")
    assert len(seen) > 5 and len(set(seen)) == 1

    from korch.backends import timing

    rotated = []
    monkeypatch.setattr(timing, "rotation_sets", lambda make, nbytes, device: rotated.append(device) or [make(0)])
    assert len(timing.timing_inputs(lambda: "a set", 64, "cuda:0")) == 1 and rotated == ["cuda:0"]
    assert timing.timing_inputs(lambda: "a set", 64, "cpu") == ["a set"] and rotated == ["cuda:0"]


def test_kernels_timed_inside_a_cuda_graph_are_counted_and_reported_for_a_gpu(tmp_path, monkeypatch):
    """A GPU kernel that cannot be captured is timed as launched (``time_kernel(graphed=True)`` falls back):
    the plan's stats count those that were captured, and report.md says so on a GPU (never on a CPU)."""
    import dataclasses

    real = measure.time_measured
    monkeypatch.setattr(measure, "time_measured", lambda *a, **k: dataclasses.replace(real(*a, **k), graphed=True))
    result = optimize(_model(), target="cpu", cost="measured", db=tmp_path / "p.sqlite", jobs=1, max_kernel_nodes=2)
    m = result.plan.stats["measurement"]
    assert m["kernels_measured"] > 0 and m["timed_in_graph"] == m["kernels_measured"]
    assert "replayed CUDA graph" not in render_markdown(result.plan)
    on_gpu = dataclasses.replace(result.plan, stats={**result.plan.stats, "measurement": {**m, "device": "h100:fp32"}})
    assert f"inside a replayed CUDA graph: {m['kernels_measured']} of {m['kernels_measured']}" in render_markdown(on_gpu)


def test_a_build_worker_gives_its_heap_back_after_each_kernel_it_builds_and_checks(monkeypatch):
    """A worker's heap keeps what it frees (for timing); building and checking a kernel allocates its values
    several times over, so without a release after each, EfficientViT's workers grew past 10 GB and died."""
    import torch

    from korch import precision
    from tests.backends import cases

    released = []
    monkeypatch.setattr(measure.heap, "keep_freed_memory", lambda: False)  # this process's heap stays as it is
    monkeypatch.setattr(measure.heap, "release_freed_memory", lambda: released.append(1) or True)  # given_back calls it
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    jobs = [(cases.softmax(), "inductor"), (cases.layer_norm(), "inductor"), (cases.gelu_erf(), "inductor")]
    checked = measure._worker("cpu", jobs, "cpu", precision.current().name, torch.get_num_threads())
    assert [c.status for c in checked] == ["ok"] * len(jobs)
    assert len(released) >= 2 * len(jobs)  # after each build and each check


def test_a_build_worker_draws_its_timing_inputs_once_however_many_calls_hand_it_kernels(monkeypatch):
    """A GPU search hands each worker one kernel a call; its timing inputs (a cache's worth of random values:
    0.4 s to draw for an H200's L2) must be drawn in its first call only, not again for every kernel."""
    import torch

    from korch import precision
    from korch.backends import check
    from tests.backends import cases

    pool_draws, draw = [], check._random_values

    def counted(rng, dtype, shape, positive=False):
        if int(np.prod(shape)) >= 1 << 16:  # an arena's pool, not a check's inputs
            pool_draws.append(shape)
        return draw(rng, dtype, shape, positive)

    monkeypatch.setattr(check, "_random_values", counted)
    monkeypatch.setattr(measure, "_ARENA", None)  # this process as a fresh worker
    monkeypatch.setattr(measure.heap, "keep_freed_memory", lambda: False)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    drawn = []
    for case in (cases.softmax(), cases.layer_norm()):
        checked = measure._worker("cpu", [(case, "inductor")], "cpu", precision.current().name,
                                  torch.get_num_threads(), timed=True)
        assert checked[0].status == "ok" and checked[0].latency_s > 0
        drawn.append(len(pool_draws))
    assert drawn[0] >= 1 and drawn[1] == drawn[0]


def test_cpu_measurements_are_keyed_by_the_timers_protocol_gpu_ones_by_the_backend_alone():
    from korch.backends.measure import keyed_versions
    from korch.backends.timing import CPU_PROTOCOL

    backends = [Broken("wrong")]
    assert keyed_versions(backends, "cpu") == {"broken": f"0+{CPU_PROTOCOL}"}
    assert keyed_versions(backends, "cuda") == {"broken": "0"}


def test_a_measured_search_bounds_each_kernel_holding_a_product_by_the_product_timed_alone(tmp_path):
    """Before its rounds the search times every product alone ("products alone"), and from then on each kernel
    holding one is bounded by most of that time (``cost/parts.py``): the planned kernel with the MatMul too, far
    above the product's FLOPs at the host's peak."""
    from korch.cost import candidate_bounds, part_columns
    from korch.cost.parts import part_floor_s
    from korch.ir import Op
    from korch.pipeline import candidate_kernels, floor_device

    db = tmp_path / "p.sqlite"
    result = optimize(_model(), target="cpu", cost="measured", db=db, jobs=1, max_kernel_nodes=3)
    assert "products alone" in result.plan.stats["stage_seconds"]
    graph = result.graph
    product = next(n.name for n in graph.nodes if n.op is Op.MATMUL)
    kernel = next(k for k in result.plan.kernels if product in k.nodes)
    candidates = candidate_kernels(graph, "cpu", "measured", 3).candidates
    (node, columns), = part_columns(graph, candidates).items()
    assert graph.nodes[node].name == product
    profile, key = ProfileDB(str(db)), measure.device_key("cpu")
    calling = profile.get(measure.CALLING_COST, key)
    alone = min(max(r.latency_s - calling[r.backend].latency_s, 0.0)
                for c in columns for r in profile.get(candidates[c].signature, key).values() if r.ok)
    roofline = candidate_bounds(graph, [c for c in candidates if c.signature == kernel.signature],
                                floor_device("cpu"))[0]
    assert kernel.bound_s >= part_floor_s(alone) * (1 - 1e-9) > roofline


def test_kernels_timed_in_rounds_keep_their_fastest_round(monkeypatch):
    """Rounds go over every kernel in turn (one kernel's timings are seconds apart on a real search), each
    kernel keeps its fastest round's latency and the rounds' seconds summed, and a round that fails fails it."""
    readings = {"a": [3.0, 1.0, 2.0], "b": [1.0, 4.0, 5.0], "c": [2.0, float("nan")]}
    order = []

    def fake_time_checked(checked, kernel, backend, arena, device, lock=None):
        order.append(kernel)
        reading = readings[kernel].pop(0)
        if reading != reading:  # nan: this round's timing fails
            checked.status, checked.message = "timing_failed", "no timing"
            return
        checked.latency_s, checked.timing_s, checked.variant = reading, 0.5, {"round": reading}

    monkeypatch.setattr(measure, "_time_checked", fake_time_checked)
    kernels = [(measure._Checked("ok", built=object()), name, None) for name in ("a", "b", "c")]
    skipped = measure._Checked("build_failed", "no build")
    measure._time_in_rounds([*kernels, (skipped, "d", None)], None, "cpu", rounds=3)
    assert order == ["a", "b", "c", "a", "b", "c", "a", "b"]  # c stopped after its failed round, d never timed
    (a, _, _), (b, _, _), (c, _, _) = kernels
    assert (a.latency_s, a.variant, a.timing_s) == (1.0, {"round": 1.0}, 1.5)
    assert (b.latency_s, b.timing_s) == (1.0, 1.5)
    assert c.status == "timing_failed" and skipped.status == "build_failed" and skipped.latency_s is None


def test_a_measurer_asked_for_rounds_times_each_kernel_that_often_and_keeps_the_fastest(tmp_path, monkeypatch):
    """``measure(ids, rounds=3)`` (the products and convolutions alone, ``cost/parts.py``): every kernel it
    builds is timed three times and the database keeps the fastest of the three."""
    from korch.cost import candidate_bounds, get_device
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.pipeline import load_model
    from korch.backends.registry import BackendPredicate, backends_for

    _, graph, _ = load_model(_model())
    candidates = enumerate_candidates(graph, max_nodes=1, predicate=BackendPredicate(backends_for("cpu"))).candidates
    timings: dict[str, list[float]] = {}
    real = measure._time_checked

    def recorded(checked, kernel, backend, *args, **kwargs):
        real(checked, kernel, backend, *args, **kwargs)
        timings.setdefault(f"{kernel.name} {backend.name}", []).append(checked.latency_s)
    monkeypatch.setattr(measure, "_time_checked", recorded)
    measurer = measure.KernelMeasurer(graph, candidates, candidate_bounds(graph, candidates, get_device("cpu")),
                                      target="cpu", jobs=1, db=ProfileDB(tmp_path / "p.sqlite"))
    try:
        measurer.measure(range(len(candidates)), rounds=3)
    finally:
        measurer.close()
    assert timings and all(len(t) == 3 for t in timings.values())
    assert measurer.stats.measured == len(timings)
    stored = measurer.db.lookup({c.signature for c in candidates}, measurer.device_key, measurer.versions)
    fastest = sorted(min(t) for t in timings.values())
    assert sorted(r.latency_s for records in stored.values() for r in records if r.ok) == pytest.approx(fastest)
