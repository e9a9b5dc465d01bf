"""Launch variants: every variant that can be chosen is checked before it is timed, a wrong one is never chosen
however fast, its compile is not timed, and a build worker that dies is a failure of its kernel, not of the run.
(Triton kernels run in the interpreter here: tests/conftest.py sets TRITON_INTERPRET=1.)"""

import concurrent.futures
import threading
from concurrent.futures.process import BrokenProcessPool
import dataclasses

from onnx import helper

from korch.backends.check import checked_variants
from korch.backends.db import Record
from korch.backends.measure import KernelMeasurer, _Checked
from korch.backends.triton.launch import TritonKernel
from korch.backends.triton.pointwise import POINTWISE
from tests.backends.kernels import kernel


def _relu_kernel_with_a_wrong_variant():
    graph = kernel([helper.make_node("Relu", ["x"], ["y"])], {"x": (64, 96)}, {"y": (64, 96)})
    generated = POINTWISE.generate(graph)
    right = generated.variants[0]
    wrong = dataclasses.replace(right, grid=(1,) * len(right.grid))  # one program: most of the output unwritten
    generated = dataclasses.replace(generated, variants=(right, wrong))
    return graph, TritonKernel(graph, generated, "cpu")


def test_a_variant_that_writes_wrong_outputs_does_not_check():
    graph, built = _relu_kernel_with_a_wrong_variant()
    assert checked_variants(built, graph) == (0,)
    assert built.variant is built.generated.variants[0]


def test_tune_times_checked_variants_only_each_after_its_first_call():
    graph, built = _relu_kernel_with_a_wrong_variant()
    events = []

    def time_call(call):
        events.append(("timed", built.variant))
        return 1.0 if built.variant is built.generated.variants[0] else 0.1  # the wrong one would win

    launch = built.fn

    class Recording:
        def __getitem__(self, grid):
            events.append(("launched", built.variant))
            return launch[grid]

    built.fn = Recording()
    assert built.tune(time_call, [list(_inputs(graph))], checked=(0,)) == 1.0
    assert built.variant is built.generated.variants[0]
    assert events == [("launched", built.generated.variants[0]), ("timed", built.generated.variants[0])]


def test_tune_times_each_variant_over_the_input_sets_and_returns_the_fastest_ones_timing():
    """The measured search's timing of a Triton kernel is its fastest variant's, each variant timed as any
    kernel is (over rotated input sets), so the winner is not timed a second time."""
    import types

    graph, built = _relu_kernel_with_a_wrong_variant()
    sets = [list(_inputs(graph)), [-x for x in _inputs(graph)]]
    read = []

    def time_call(call):
        outputs = [call(i)[0].clone() for i in range(len(sets))]  # each input set in turn, as the timer does
        read.append([float(o.sum()) for o in outputs])
        return types.SimpleNamespace(median_s=0.5 if built.variant is built.generated.variants[1] else 2.0)

    timing = built.tune(time_call, sets, checked=(0, 1), seconds=lambda t: t.median_s)
    assert timing.median_s == 0.5 and built.variant is built.generated.variants[1]
    assert len(read) == 2 and read[0][0] != read[0][1]  # the two sets were both run


def test_a_tuned_kernels_timing_is_its_fastest_variants_not_taken_again(monkeypatch):
    """``measure._time_built`` of a kernel with launch variants (a Triton kernel on a GPU; here in the
    interpreter, as if it tuned): each checked variant timed once, as any kernel is, and the fastest one's
    timing returned with its description; no timing after the tuning (it cost a third of a kernel's on an H200)."""
    from korch.backends import measure
    from korch.backends.check import RandomArena
    from korch.backends.timing import Timing

    graph, built = _relu_kernel_with_a_wrong_variant()
    timed = []

    def time_measured(call, sets, device, warm_path=None):
        call(len(sets) - 1)  # the call takes an input set's index
        timed.append(built.variant)
        return Timing(median_s=2e-6 if built.variant is built.generated.variants[0] else 3e-6, min_s=1e-6, runs=5)

    monkeypatch.setattr(measure, "_tunes", lambda built, device: True)
    monkeypatch.setattr(measure, "time_measured", time_measured)
    timing, variant, launches = measure._time_built(built, graph, (0, 1), RandomArena("cpu"), "cpu")
    assert timed == list(built.generated.variants) and timing.median_s == 2e-6
    assert variant == {"variant": built.generated.variants[0].describe()} and launches == built.launches


def _inputs(graph):
    from korch.backends.check import random_inputs

    return random_inputs(graph, 0)


def test_a_worker_that_dies_fails_its_kernel_and_the_next_batch_gets_a_fresh_pool():
    class DeadPool:
        shut = False

        def submit(self, *args):
            future = concurrent.futures.Future()
            future.set_exception(BrokenProcessPool("a child process terminated abruptly"))
            return future

        def shutdown(self, cancel_futures=False):
            DeadPool.shut = True

    measurer = KernelMeasurer.__new__(KernelMeasurer)
    measurer.device, measurer.jobs, measurer.target, measurer._pool = "cuda", 2, "h100", DeadPool()
    measurer.time_in_workers, measurer._device_lock = True, None
    measurer._barrier, measurer._batches = threading.Barrier(1), 0
    graph = kernel([helper.make_node("Relu", ["x"], ["y"])], {"x": (4,)}, {"y": (4,)})

    class Backend:
        name = "triton"

    results = measurer._checked_builds([("s1", Backend()), ("s2", Backend())], {"s1": graph, "s2": graph})
    # recorded as failed builds (a status the profile database takes), the search goes on
    assert [r.status for r in results] == ["build_failed", "build_failed"]
    assert all(isinstance(r, _Checked) and r.message.startswith("worker died") and "BrokenProcessPool" in r.message
               for r in results)
    Record(signature="s1", device="cpu", backend="triton", backend_version="1", status=results[0].status,
           message=results[0].message)
    assert DeadPool.shut and measurer._pool is None


def test_cpu_kernels_are_built_in_chunks_and_a_dead_chunk_is_built_again_kernel_by_kernel(monkeypatch):
    from korch import workers

    submitted = []

    class DeadPool:
        def submit(self, fn, target, jobs, *args):
            submitted.append(len(jobs))
            future = concurrent.futures.Future()
            future.set_exception(BrokenProcessPool("a child process terminated abruptly"))
            return future

        def shutdown(self, cancel_futures=False):
            pass

    monkeypatch.setattr(workers, "pool", lambda jobs, initializer=None: DeadPool())
    measurer = KernelMeasurer.__new__(KernelMeasurer)
    measurer.device, measurer.jobs, measurer.target, measurer._pool = "cpu", 2, "cpu", None
    measurer.time_in_workers, measurer._device_lock = False, None
    measurer._barrier, measurer._batches = threading.Barrier(1), 0
    graph = kernel([helper.make_node("Relu", ["x"], ["y"])], {"x": (4,)}, {"y": (4,)})

    class Backend:
        name = "inductor"

    todo = [(s, Backend()) for s in ("s1", "s2", "s3")]
    results = measurer._checked_builds(todo, {s: graph for s, _ in todo})
    # two chunks for two workers; the one of two kernels died: its kernels are built again, each alone
    assert submitted == [2, 1, 1, 1]
    assert [r.status for r in results] == ["build_failed"] * 3
    assert all(r.message.startswith("worker died") for r in results)
