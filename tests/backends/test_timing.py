"""The kernel timer's mechanics: warm-up first, rotation over input sets, budgets, the CUDA event path (faked).

The timer reads ``time.perf_counter``; these tests hand it a fake clock that moves only when a fake
kernel "runs", so every count and every time below is exact: no test here depends on the machine's speed.
"""

import contextlib
import types
from typing import ClassVar

import pytest
import torch

from korch import config
from korch.backends import cpu_load, timing
from korch.backends.timing import planned_runs, rotation_count, rotation_sets, time_kernel

MS = 2.0 ** -10  # about a millisecond; a power of two, so sums of these are exact floats


class FakeClock:
    """Stands in for the ``time`` module the timer reads: the clock moves only by ``advance``."""

    def __init__(self):
        self.now = 0.0
        self.reads = 0

    def perf_counter(self):
        self.reads += 1
        if self.reads > 100_000:  # a timer loop the fake clock never ends: fail, do not hang
            raise AssertionError("the timer read the clock 100000 times")
        return self.now

    def advance(self, seconds):
        self.now += seconds

    def sleep(self, seconds):
        self.sleeps = getattr(self, "sleeps", []) + [seconds]
        self.advance(seconds)


class FakeLoad:
    """Stands in for ``cpu_load``: timing window k finds other processes on the cores if ``busy[k]``."""

    def __init__(self, busy=()):
        self.busy, self.windows = list(busy), 0
        outer = self

        class Window:
            def __init__(self):
                self.k = outer.windows
                outer.windows += 1

            def disturbed(self, threads):
                return outer.busy[self.k] if self.k < len(outer.busy) else False
        self.Window = Window


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", fake)
    monkeypatch.setattr(timing, "cpu_load", FakeLoad())  # the real machine's load must not change a count here
    return fake


def kernel(clock, durations, log=None):
    """A fake kernel: call number k (warm-up included) takes ``durations(k, i)`` seconds of the fake clock."""
    calls = []

    def call(i):
        if log is not None:
            log.append((i, clock.now))
        clock.advance(durations(len(calls), i))
        calls.append(i)
    call.calls = calls
    return call


def test_the_result_is_the_median_and_minimum_of_the_timed_runs_only(clock):
    times = [64 * MS] * 3 + [9 * MS, 1 * MS, 3 * MS, 2 * MS, 4 * MS]  # slow warm-up; median 3 ms, mean 3.8 ms
    call = kernel(clock, lambda k, i: times[k])
    result = time_kernel(call, device="cpu", warmup=3, warmup_s=0, repeats=5)
    assert result == timing.Timing(median_s=3 * MS, min_s=1 * MS, runs=5, mean_s=result.mean_s)
    assert result.mean_s == pytest.approx(3.8 * MS)
    assert len(call.calls) == 8


def test_runs_stop_at_the_budget_once_the_minimum_is_in(clock):
    slow = kernel(clock, lambda k, i: 20 * MS)
    assert time_kernel(slow, device="cpu", warmup=1, warmup_s=0, budget_s=30 * MS).runs == 5  # minimum wins
    assert len(slow.calls) == 1 + 5
    fast = kernel(clock, lambda k, i: MS)
    assert time_kernel(fast, device="cpu", warmup=1, warmup_s=0, budget_s=12 * MS).runs == 12  # budget wins
    free = kernel(clock, lambda k, i: 0.0)
    assert time_kernel(free, device="cpu", warmup=0, warmup_s=0, repeats=7).runs == 7  # repeats cap
    assert time_kernel(free, device="cpu", warmup_s=0).runs == timing.MAX_REPEATS  # zero time never ends the budget
    assert time_kernel(free, device="cpu", warmup_s=0, repeats=3, min_repeats=10, budget_s=0).runs == 3


def test_a_cpu_kernel_is_timed_for_the_cpu_budget_unless_told_otherwise(clock):
    """Half of a CPU search's measuring was timing at the GPU's budget: a CPU kernel's default is its own."""
    fast = kernel(clock, lambda k, i: MS)
    runs = time_kernel(fast, device="cpu", warmup=1, warmup_s=0).runs
    assert timing.CPU_BUDGET_S < timing.BUDGET_S and abs(runs - timing.CPU_BUDGET_S / MS) <= 2
    assert time_kernel(fast, device="cpu", warmup=1, warmup_s=0, budget_s=timing.BUDGET_S).runs == 100


def test_warm_up_calls_happen_before_timed_calls_and_are_not_timed(clock):
    call = kernel(clock, lambda k, i: 50 * MS if k < 3 else MS)  # compiles on its first three calls
    result = time_kernel(call, device="cpu", warmup=3, warmup_s=0, repeats=6)
    assert result.runs == 6 and len(call.calls) == 9
    assert result.median_s == result.min_s == MS


def test_warm_up_lasts_at_least_its_time(clock):
    log = []
    call = kernel(clock, lambda k, i: 16 * MS, log)
    result = time_kernel(call, device="cpu", warmup=1, warmup_s=64 * MS, repeats=5)
    warmups = len(log) - result.runs
    assert (warmups, result.runs) == (4, 5)  # 4 calls of 16 ms make the 64 ms, though 1 call was asked for
    assert log[warmups][1] - log[0][1] == 64 * MS  # the first timed call starts once the warm-up time is spent
    assert result.median_s == 16 * MS


def test_the_first_calls_one_off_cost_stays_out_of_the_warm_ups_estimate(clock):
    """A kernel's first call can pay a module's lazy load or a library's handle: an H200's 3 us kernel read
    20 ms from a warm-up mean that held it, too long to be timed inside a CUDA graph (2026-11-30)."""
    call = kernel(clock, lambda k, i: 500 * MS if k == 0 else MS)
    estimate, host_s = timing._warm_up(call, timing._Rotation(1), 3, 8 * MS, lambda: None)
    assert estimate == host_s == MS and len(call.calls) == 3  # the warm-up's time was spent in the first
    alone = kernel(clock, lambda k, i: 2 * MS)
    assert timing._warm_up(alone, timing._Rotation(1), 1, 0, lambda: None) == (2 * MS, 2 * MS)
    assert timing._warm_up(alone, timing._Rotation(1), 0, 0, lambda: None) == (0.0, 0.0) and len(alone.calls) == 1


def test_rotation_cycles_through_the_sets_across_warm_up_and_runs():
    seen = []
    time_kernel(seen.append, device="cpu", warmup=4, warmup_s=0, repeats=5, rotate=3)
    assert seen == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    seen.clear()
    time_kernel(seen.append, device="cpu", warmup=2, warmup_s=0, repeats=2)
    assert seen == [0, 0, 0, 0]


@pytest.mark.parametrize("kwargs", [{"rotate": 0}, {"repeats": 0}, {"device": "meta"}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        time_kernel(lambda i: None, **{"device": "cpu", **kwargs})


def test_planned_runs_fit_the_budget_within_bounds():
    assert planned_runs(0.001, 0.1, 5, 100) == 100
    assert planned_runs(0.002, 0.1, 5, 100) == 50
    assert planned_runs(1.0, 0.1, 5, 100) == 5
    assert planned_runs(1.0, 0.1, 5, 3) == 3
    assert planned_runs(0.0, 0.1, 5, 100) == 100


def test_rotation_count_overflows_the_cache_within_the_cap():
    mib = 1 << 20
    assert rotation_count(mib, 32 * mib) == 33           # 33 MiB > 32 MiB
    assert rotation_count(3 * mib, 32 * mib) == 11       # 33 MiB
    assert rotation_count(64 * mib, 32 * mib) == 1       # one set already overflows
    assert rotation_count(100, 32 * mib) == 64           # capped
    assert rotation_count(0, 32 * mib) == 1
    assert rotation_count(mib, 32 * mib, cap=8) == 8


def test_rotation_sets_makes_distinct_sets():
    sets = rotation_sets(lambda i: torch.full((256,), float(i)), nbytes=1024, cache_bytes=4000)
    assert len(sets) == 4 and [int(s[0]) for s in sets] == [0, 1, 2, 3]


def test_cpu_cache_size_is_what_sysfs_says(monkeypatch):
    from korch.cost import probe

    monkeypatch.setattr(probe, "cache_bytes", lambda: 40 << 20)
    assert timing.cache_size("cpu") == 40 << 20


def test_cpu_cache_size_falls_back_to_the_timer_default(monkeypatch):
    from korch.cost import probe

    # the probe's fallback is huge (a floor for cost bounds); too many rotation sets for timing
    monkeypatch.setattr(probe, "cache_bytes", lambda: probe.FALLBACK_CACHE_BYTES)
    assert timing.cache_size("cpu") == timing.DEFAULT_CPU_CACHE_BYTES != probe.FALLBACK_CACHE_BYTES


class FakeEvent:
    """A CUDA event on the fake clock: records when it is recorded, and the clock gap to another in ms."""

    log: ClassVar[list] = []
    clock: ClassVar[FakeClock | None] = None

    def __init__(self, enable_timing=False, external=False):
        assert enable_timing
        self.at, self.external = None, external

    def record(self, stream=None):
        self.at = FakeEvent.clock.now
        FakeEvent.log.append(("record", self))

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


@pytest.fixture
def fake_cuda(monkeypatch, clock):
    monkeypatch.setattr(FakeEvent, "log", [])
    monkeypatch.setattr(FakeEvent, "clock", clock)
    log = FakeEvent.log
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync", device)))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("spin", cycles)))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(L2_cache_size=60 << 20))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, **options: graph.capturing(log))
    return log


class FakeGraph:
    """A CUDA graph on the fake clock: capture runs the calls (the events record their times then); a replay
    is logged and changes nothing. ``fails`` makes the capture raise, as a kernel that syncs the host would."""

    fails = False

    @contextlib.contextmanager
    def capturing(self, log):
        log.append(("capture", None))
        if FakeGraph.fails:
            raise RuntimeError("operation not permitted when stream is capturing")
        yield
        log.append(("captured", None))

    def replay(self):
        FakeEvent.log.append(("replay", None))


def test_cuda_path_times_with_event_pairs(fake_cuda, clock):
    call = kernel(clock, lambda k, i: (i + 1) * MS)  # input set i takes i + 1 ms
    traced = lambda i: (fake_cuda.append(("call", i)), call(i))  # noqa: E731
    result = time_kernel(traced, device="cuda", rotate=4, warmup=3, warmup_s=10 * MS, budget_s=20 * MS)
    # warm-up: sets 0, 1, 2 take 6 ms < 10 ms, so set 3 runs too: 4 calls; the first left out, 3 ms each, so 6
    # runs fit 20 ms; but the fake call's time passes on the host (3 ms to queue each), and the spin's cap holds
    # 4 runs' queueing: the minimum of 5 runs wins, behind the longest spin
    assert result.runs == 5 and call.calls == [i % 4 for i in range(4 + 5)]
    assert result.median_s == pytest.approx(2 * MS) and result.min_s == pytest.approx(1 * MS)  # sets 0 1 2 3 0
    kinds = [entry[0] for entry in fake_cuda]
    first_record = kinds.index("record")
    # warm-up first (its first call synchronized apart), synchronized, a spin
    assert kinds[:first_record] == ["sync", "call", "sync", *["call"] * 3, "sync", "spin"]
    spin = fake_cuda[first_record - 1][1]
    assert spin == int(timing.MAX_HOST_LEAD_S * timing.GPU_CYCLES_PER_S)
    timed = kinds[first_record:]
    assert timed == ["record", "call", "record"] * 5 + ["sync"]  # one synchronize, after every pair


def test_the_spin_outlasts_the_hosts_queueing_of_every_timed_run():
    """A call quick to queue keeps its runs behind the least spin; one slow on the host (an Inductor wrapper
    around a small kernel) gets a longer spin, and fewer runs once the spin is at its cap, never a timing in
    which the GPU waits for the host between runs (YOLOX-Nano's kernels timed alone predicted 3x what ran)."""
    from korch.backends.timing import EVENT_PAIR_S, HOST_LEAD_PER_RUN_S, MAX_HOST_LEAD_S, queued_runs

    assert queued_runs(100, 5e-6, 5) == (100, pytest.approx(100 * HOST_LEAD_PER_RUN_S))
    runs, lead = queued_runs(100, 100e-6, 5)
    assert runs == 100 and lead == pytest.approx(100 * 1.5 * (100e-6 + EVENT_PAIR_S)) and lead <= MAX_HOST_LEAD_S
    runs, lead = queued_runs(100, 400e-6, 5)
    assert runs == int(MAX_HOST_LEAD_S / (1.5 * (400e-6 + EVENT_PAIR_S))) < 100
    assert runs * 1.5 * (400e-6 + EVENT_PAIR_S) <= lead <= MAX_HOST_LEAD_S
    assert queued_runs(100, 0.1, 5) == (5, MAX_HOST_LEAD_S)  # never under min_repeats


def test_cuda_gpu_cache_size_falls_back_when_torch_reports_none(fake_cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace())
    assert timing.cache_size("cuda") == timing.DEFAULT_GPU_CACHE_BYTES


def test_cuda_cache_size_is_the_l2(fake_cuda):
    assert timing.cache_size("cuda") == 60 << 20


def test_take_turns_interleaves_and_drops_a_failing_name():
    from korch.backends.timing import take_turns

    order, errors = [], []

    def time_one(name, round_):
        order.append((name, round_))
        if (name, round_) == ("b", 1):
            raise RuntimeError("gone")
        return round_

    results = take_turns(["a", "b"], time_one, 3, on_error=lambda name, exc: errors.append((name, str(exc))))
    assert order == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2)]
    assert results == {"a": [0, 1, 2]} and errors == [("b", "gone")]
    with pytest.raises(RuntimeError, match="gone"):
        take_turns(["b"], lambda name, round_: time_one("b", 1), 1)


def test_random_arena_hands_out_aligned_views_that_never_overlap_until_reset():
    from korch.backends.check import RandomArena
    from korch.ir.graph import Graph, Tensor

    kernel = Graph(name="k")
    for name, shape, dtype in (("a", (3, 5), "float32"), ("i", (7,), "int64"), ("m", (4, 4), "bool"),
                               ("s", (), "float32")):
        kernel.add_tensor(Tensor(name=name, shape=shape, dtype=dtype))
    kernel.inputs = ["a", "i", "m", "s"]
    arena = RandomArena()
    sets = [arena.inputs(kernel) for _ in range(3)]
    big = arena.inputs(Graph(name="big", tensors={"x": Tensor(name="x", shape=(1 << 17,), dtype="float32")},
                             inputs=["x"]))[0]  # grows the float pool past its first size
    views = [x for inputs in sets for x in inputs] + [big]
    for inputs in sets:
        assert [tuple(x.shape) for x in inputs] == [(3, 5), (7,), (4, 4), ()]
        assert [x.dtype for x in inputs] == [torch.float32, torch.int64, torch.bool, torch.float32]
        assert all(x.data_ptr() % RandomArena.ALIGN_BYTES == 0 for x in inputs)
        assert inputs[1].min() >= 0 and inputs[1].max() < 8 and inputs[0].std() > 0.1
    spans = sorted((x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()) for x in views)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert not torch.equal(sets[0][0], sets[1][0])  # different memory, different values
    arena.reset()
    assert arena.inputs(kernel)[1].data_ptr() == sets[0][1].data_ptr()  # reused from the start


def test_a_timing_other_processes_disturbed_is_taken_again_after_a_pause(clock, monkeypatch):
    monkeypatch.setattr(timing, "cpu_load", FakeLoad(busy=[True, False]))
    slow_then_fast = kernel(clock, lambda k, i: 40 * MS if k < 5 else MS)  # the first try's calls wait on others
    with config.patch(quiet_tries=3):
        result = time_kernel(slow_then_fast, device="cpu", warmup=0, warmup_s=0, repeats=5)
    assert result == timing.Timing(median_s=MS, min_s=MS, runs=5, disturbed=False, mean_s=pytest.approx(MS))
    assert clock.sleeps == [timing.QUIET_PAUSE_S] and len(slow_then_fast.calls) == 10


def test_when_every_try_is_disturbed_the_fastest_is_kept_and_flagged(clock, monkeypatch):
    load = FakeLoad(busy=[True, True, True, False])
    monkeypatch.setattr(timing, "cpu_load", load)
    durations = [3 * MS] * 5 + [2 * MS] * 5 + [4 * MS] * 5
    call = kernel(clock, lambda k, i: durations[k])
    with config.patch(quiet_tries=3):
        result = time_kernel(call, device="cpu", warmup=0, warmup_s=0, repeats=5)
    assert result == timing.Timing(median_s=2 * MS, min_s=2 * MS, runs=5, disturbed=True, mean_s=pytest.approx(2 * MS))
    assert load.windows == 3 and len(clock.sleeps) == 2
    with config.patch(quiet_tries=1):  # never retried: one try, flagged all the same
        once = FakeLoad(busy=[True])
        monkeypatch.setattr(timing, "cpu_load", once)
        assert time_kernel(kernel(clock, lambda k, i: MS), device="cpu", warmup=0, warmup_s=0, repeats=5).disturbed
        assert once.windows == 1
    with config.patch(quiet_tries=0):  # the load not looked at: no window, nothing flagged
        never = FakeLoad(busy=[True])
        monkeypatch.setattr(timing, "cpu_load", never)
        assert not time_kernel(kernel(clock, lambda k, i: MS), device="cpu", warmup=0, warmup_s=0, repeats=5).disturbed
        assert never.windows == 0


def test_a_window_counts_the_cores_other_processes_took(monkeypatch):
    """Others' work is the machine's busy time less this process's, a tick per core given back for rounding."""
    now = {"busy": 100.0, "own": 5.0, "wall": 0.0}
    monkeypatch.setattr(cpu_load, "_busy_s", lambda: now["busy"])
    monkeypatch.setattr(cpu_load.time, "process_time", lambda: now["own"])
    monkeypatch.setattr(cpu_load.time, "perf_counter", lambda: now["wall"])
    monkeypatch.setattr(cpu_load, "usable_cores", lambda: 2)
    window = cpu_load.Window()
    # 1 s: this process ran its two threads for 2 s, the machine was busy 3.02 s: others took one core
    now.update(busy=103.02 + 2 * cpu_load.TICK_S, own=7.0, wall=1.0)
    assert window.others_cores() == pytest.approx(1.02)
    assert window.disturbed(threads=2) and not window.disturbed(threads=0)  # no core spare / both spare
    now.update(busy=102.1 + 2 * cpu_load.TICK_S)  # a tenth of a core: housekeeping
    assert window.others_cores() == pytest.approx(0.1) and not window.disturbed(threads=2)
    monkeypatch.setattr(cpu_load, "_busy_s", lambda: None)  # no /proc/stat: nothing known, nothing disturbed
    assert cpu_load.Window().others_cores() is None and not cpu_load.Window().disturbed(threads=2)


def test_a_short_kernel_is_timed_inside_one_replayed_cuda_graph_when_asked(fake_cuda, clock):
    """The measured search's timings (``graphed``): runs captured between events, replayed; no spin needed."""
    call = kernel(clock, lambda k, i: MS / 16)  # 61 us, under GRAPHED_UNDER_S
    traced = lambda i: (fake_cuda.append(("call", i)), call(i))  # noqa: E731
    result = time_kernel(traced, device="cuda", warmup=2, warmup_s=0, budget_s=20 * MS, graphed=True)
    assert result.graphed and result.median_s == MS / 16
    assert result.runs == timing.MAX_GRAPHED_RUNS  # 320 runs fit the budget; the graph holds at most this many
    kinds = [entry[0] for entry in fake_cuda]
    captured = kinds[kinds.index("capture") + 1:kinds.index("captured")]
    assert captured == ["record", "call", "record"] * timing.MAX_GRAPHED_RUNS
    assert kinds[kinds.index("captured") + 1:] == ["replay", "replay", "sync"] and "spin" not in kinds


def test_a_kernel_that_cannot_be_captured_or_a_systems_timing_is_launched_as_before(fake_cuda, clock, monkeypatch):
    call = kernel(clock, lambda k, i: MS / 16)
    monkeypatch.setattr(FakeGraph, "fails", True)
    failed = time_kernel(call, device="cuda", warmup=2, warmup_s=0, budget_s=20 * MS, graphed=True)
    assert not failed.graphed and failed.median_s == MS / 16 and "spin" in [e[0] for e in fake_cuda]
    monkeypatch.setattr(FakeGraph, "fails", False)
    fake_cuda.clear()
    system = time_kernel(call, device="cuda", warmup=2, warmup_s=0, budget_s=20 * MS)  # bench's: never graphed
    assert not system.graphed and "capture" not in [e[0] for e in fake_cuda]
    fake_cuda.clear()
    slow = time_kernel(kernel(clock, lambda k, i: MS), device="cuda", warmup=2, warmup_s=0, budget_s=20 * MS,
                       graphed=True)  # a long kernel: the host cannot show, launched as before
    assert not slow.graphed and "capture" not in [e[0] for e in fake_cuda]


def test_prepare_runs_untimed_before_every_cpu_call_with_its_sets_index(clock):
    log = []
    call = kernel(clock, lambda k, i: MS, log)
    prepared = []

    def prepare(i):
        prepared.append((i, len(log)))
        clock.advance(64 * MS)  # untimed: it must not show in the timing
    result = time_kernel(call, device="cpu", warmup=2, warmup_s=0, repeats=5, rotate=3, prepare=prepare)
    assert result.median_s == result.min_s == MS and result.runs == 5
    assert prepared == [(i % 3, i) for i in range(7)]  # before each call, warm-up included, same set as the call
    assert [i for i, _ in log] == [i % 3 for i in range(7)]


def test_cold_start_writes_a_buffer_over_the_inner_caches_then_the_calls_inputs(monkeypatch):
    monkeypatch.setattr(timing, "_inner_cache_bytes", lambda: 1 << 12)
    sets = [[torch.full((3,), -0.0), torch.tensor([True, False])], [torch.arange(4)]]
    cold = timing.ColdStart(sets)
    assert cold.buffer.numel() * 4 == timing.EVICTION_FACTOR * (1 << 12) * torch.get_num_threads()
    before = cold.buffer.clone()
    versions = [t._version for t in (*sets[0], *sets[1])]
    cold(0)
    assert torch.equal(cold.buffer, before + 1)  # every element written
    assert [t._version for t in (*sets[0], *sets[1])] == [versions[0] + 1, versions[1] + 1, versions[2]]
    assert torch.equal(sets[0][0], torch.zeros(3)) and sets[0][1].tolist() == [True, False]  # values kept
    cold(1)
    assert sets[1][0].tolist() == [0, 1, 2, 3] and sets[1][0]._version == versions[2] + 1


def test_cold_start_warms_the_calling_path_last(monkeypatch):
    """After the sweep and the inputs, the backend's empty kernel runs: the timer's own calling path is warm
    again, the kernel's data not (the empty kernel touches none of it)."""
    monkeypatch.setattr(timing, "_inner_cache_bytes", lambda: 1 << 12)
    x = torch.ones(3)
    order = []
    cold = timing.ColdStart([[x]], warm_path=lambda: order.append(("warm", x._version, float(cold.buffer[0]))))
    start = float(cold.buffer[0])  # the buffer is the process's, shared by every ColdStart
    cold(0)
    cold(0)
    # each time after the inputs and the buffer were written
    assert order == [("warm", 1, start + 1), ("warm", 2, start + 2)]


def test_a_measured_cpu_kernel_is_timed_from_a_cold_start_and_a_gpu_one_is_not(monkeypatch):
    seen = {}
    monkeypatch.setattr(timing, "time_kernel", lambda call, **kw: seen.update(kw))
    monkeypatch.setattr(timing, "_inner_cache_bytes", lambda: 1 << 12)
    sets = [[torch.ones(2)], [torch.ones(2)]]
    warm = lambda: None  # noqa: E731
    timing.time_measured(lambda i: None, sets, "cpu", warm)
    assert isinstance(seen["prepare"], timing.ColdStart) and seen["prepare"].sets is sets
    assert seen["prepare"].warm_path is warm
    assert seen["rotate"] == 2 and seen["graphed"]
    timing.time_measured(lambda i: None, sets, "cuda")
    assert seen["prepare"] is None


def test_a_kernels_cost_chained_in_a_graph_is_read_with_nothing_between_its_calls(fake_cuda, clock, monkeypatch):
    """What a kernel costs in an executable's graph, where nothing stands between kernels: its calls captured
    back to back, no event among them, each replay timed whole; the fastest replay over the calls."""
    call = kernel(clock, lambda k, i: MS / 4)
    traced = lambda: (fake_cuda.append(("call", None)), call(0))  # noqa: E731
    replays = iter([3 * MS, 2 * MS, 5 * MS])  # a replay's time for its 8 calls: 2 ms the fastest

    def replay(graph):
        fake_cuda.append(("replay", None))
        clock.advance(next(replays, 4 * MS))

    monkeypatch.setattr(FakeGraph, "replay", replay)
    per_call = timing.chained_in_graph_s(traced, "cuda", nodes=8, replays=3)
    assert per_call == 2 * MS / 8
    kinds = [entry[0] for entry in fake_cuda]
    captured = kinds[kinds.index("capture") + 1:kinds.index("captured")]
    assert captured == ["call"] * 8  # no event between the calls
    after = kinds[kinds.index("captured") + 1:]
    assert after == ["replay"] + ["record", "replay", "record", "sync"] * 3  # an untimed upload, then 3 timed


def test_a_cpu_timing_that_settles_stops_once_its_median_is_known(clock):
    """Runs stop at SETTLE_MIN_RUNS when they agree; runs that disagree go on to the budget or the cap."""
    steady = time_kernel(kernel(clock, lambda k, i: MS), device="cpu", warmup=0, warmup_s=0, settle_within=0.02)
    assert steady.runs == timing.SETTLE_MIN_RUNS and steady.median_s == MS
    # one run in nine far off: the median's bounds leave it out
    one_off = time_kernel(kernel(clock, lambda k, i: 3 * MS if k == 4 else MS), device="cpu", warmup=0,
                          warmup_s=0, settle_within=0.02)
    assert one_off.runs == timing.SETTLE_MIN_RUNS
    spread = time_kernel(kernel(clock, lambda k, i: MS * (1 + k % 2)), device="cpu", warmup=0, warmup_s=0,
                         repeats=40, min_repeats=40, settle_within=0.02)
    assert spread.runs == 40
    unsettled = time_kernel(kernel(clock, lambda k, i: MS), device="cpu", warmup=0, warmup_s=0, repeats=30,
                            min_repeats=30)
    assert unsettled.runs == 30  # without settle_within every run the budget allows


def test_settled_reads_the_medians_bounds_from_the_order_statistics():
    assert not timing.settled([1.0] * (timing.SETTLE_MIN_RUNS - 1), 0.5)
    assert timing.settled([1.0] * 9, 0.0)
    assert timing.settled([1.0] * 8 + [5.0], 0.01) and timing.settled([0.2] + [1.0] * 8, 0.01)
    assert not timing.settled([1.0] * 7 + [5.0, 5.0], 0.01)  # two far off of nine: the bound reaches them
    assert not timing.settled([1.0, 1.02, 1.04, 1.06, 1.08, 1.10, 1.12, 1.14, 1.16], 0.05)
    assert timing.settled([1.0, 1.02, 1.04, 1.06, 1.08, 1.10, 1.12, 1.14, 1.16], 0.1)
