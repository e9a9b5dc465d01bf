"""Timing one kernel: warm up, repeat within a time budget, report the median.

``time_kernel(call, device=...)`` calls ``call(i)``, where ``i`` picks one of
``rotate`` input sets, in turn: consecutive runs read different buffers, so a
small kernel is not flattered by finding its inputs already in cache (the
caller allocates enough sets with ``rotation_sets``, sized against the cache by
``cache_size``; ``timing_inputs`` rotates a GPU kernel's inputs, never a CPU
kernel's). Warm-up (module load, compilation, allocator growth, clock
ramp) is at least ``warmup`` calls and ``warmup_s`` seconds; then timed runs
follow until ``repeats`` runs or, once ``min_repeats`` are in, ``budget_s``
seconds of them. The median is the measurement; the minimum is kept beside it.
``prepare(i)``, if given, runs untimed before every call on a CPU:
``time_measured`` (the measured search's timing of a kernel) starts each call
as an executable does (``ColdStart``).

* CPU: ``time.perf_counter`` around each call. Other processes taking the
  cores the kernel's threads need make every call wait for the scheduler (a
  0.1 ms convolution read 40 ms beside two busy processes), so a timing during
  which they did (``cpu_load.Window``) is taken again after a pause, up to
  ``config.quiet_tries`` times; if the machine never quietens the fastest is
  kept and flagged ``disturbed``.
* CUDA: work is asynchronous, so each run sits between a pair of
  ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream; the
  warm-up, timed on the host with a synchronize at both ends, estimates one
  run's time, which sets how many runs fit the budget; every pair is recorded
  before a single synchronize reads them, so the host never stalls between
  runs. A device-side spin (``torch.cuda._sleep``) goes first, as long as
  the host takes to queue every timed run (``queued_runs``: its host time per
  call, measured in the warm-up): a small kernel is then timed back to back,
  as in a replayed CUDA graph, not waiting on the host's launch. A kernel's
  timing (``graphed=True``: the measured search's) goes further when the
  kernel is short: its runs are captured in one CUDA graph, each between two
  events the graph records, and replayed, so no run waits on the host.

These are the timer's mechanics only; the caller checks the kernel's output
separately (``backends/check.py``) and never times on zeros.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from korch import config
from korch.backends import cpu_load

T = TypeVar("T")
WARMUP_CALLS = 3
WARMUP_S = 0.01
MAX_REPEATS = 100
MIN_REPEATS = 5
BUDGET_S = 0.1
# A CPU kernel's timed runs stop after this (at least MIN_REPEATS): at least 10 runs of any kernel under 5 ms,
# where two searches' timings of the same kernels differ by 4% (median) whatever the budget; half of Candy's
# measuring was timing at 0.1 s
CPU_BUDGET_S = 0.05
# The measured search's CPU timing stops early, after SETTLE_MIN_RUNS runs or more, once its median is known
# within this fraction (``settled``): most kernels' runs agree, and half a second of a kernel's search went on
# runs its median did not need (Candy's search: 74 s of its 230 s timing, median kernel 0.53 ms)
SETTLE_WITHIN = 0.02
SETTLE_MIN_RUNS = 9
MAX_ROTATION_SETS = 64
DEFAULT_CPU_CACHE_BYTES = 32 << 20
DEFAULT_GPU_CACHE_BYTES = 50 << 20  # H100's L2
# Device spin before the timed CUDA runs: per queued run at least a generous host cost
# of one launch plus two events, more for a call whose host side is slower (an Inductor
# wrapper), capped (a host slower than that times fewer runs); cycles per second
# assumes a ~2 GHz clock.
HOST_LEAD_PER_RUN_S = 50e-6
EVENT_PAIR_S = 10e-6
MAX_HOST_LEAD_S = 0.02
GPU_CYCLES_PER_S = 2e9
# Kernels faster than this (by the warm-up) are timed inside a replayed CUDA graph when asked (``graphed``):
# where the host's launches could show; at most this many runs, each run's outputs held by the graph's pool
GRAPHED_UNDER_S = 200e-6
MAX_GRAPHED_RUNS = 50
# Calls of one kernel chained in a graph to read what a kernel costs there, stamps left out (``chained_in_graph_s``)
CHAINED_NODES = 100
# Seconds to wait before timing again when other processes took the cores (a test, a compile finishing)
QUIET_PAUSE_S = 0.25



@dataclasses.dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    runs: int
    disturbed: bool = False  # other processes held cores the kernel needed in every try (CPU)
    graphed: bool = False    # timed inside one replayed CUDA graph (``time_kernel(graphed=True)``)
    mean_s: float | None = None


def settled(samples: Sequence[float], within: float) -> bool:
    """Whether ``samples`` (``SETTLE_MIN_RUNS`` or more) know their median within ``within`` of it: the order
    statistics that bound the median with 95% confidence whatever the distribution (the ``n/2 -+ 1.96 sqrt(n)/2``
    th of ``n``) are at most ``within`` of it on either side."""
    n = len(samples)
    if n < SETTLE_MIN_RUNS:
        return False
    ordered = sorted(samples)
    low = max(int(n / 2 - 0.98 * math.sqrt(n)), 0)
    median = statistics.median(ordered)
    return median - ordered[low] <= within * median and ordered[n - 1 - low] - median <= within * median


def summarize(samples: Sequence[float]) -> Timing:
    if not samples:
        raise ValueError("no timed runs")
    return Timing(median_s=statistics.median(samples), min_s=min(samples), runs=len(samples),
                  mean_s=statistics.fmean(samples))


def planned_runs(estimate_s: float, budget_s: float, min_repeats: int, repeats: int) -> int:
    """How many runs of ``estimate_s`` each fit ``budget_s``, within [min_repeats, repeats]."""
    fit = int(budget_s / estimate_s) if estimate_s > 0 else repeats
    return max(min(fit, repeats), min(min_repeats, repeats), 1)


class _Rotation:
    """Input-set indices 0, 1, ..., rotate - 1, 0, ... across warm-up and timed runs alike."""

    def __init__(self, rotate: int | None):
        if rotate is not None and rotate < 1:
            raise ValueError(f"rotate must be >= 1, got {rotate}")
        self.rotate = rotate or 1
        self.count = 0

    def next(self) -> int:
        index = self.count % self.rotate
        self.count += 1
        return index


def time_kernel(call: Callable[[int], object], *, device: str | torch.device, warmup: int = WARMUP_CALLS,
                repeats: int = MAX_REPEATS, rotate: int | None = None, warmup_s: float = WARMUP_S,
                budget_s: float | None = None, min_repeats: int = MIN_REPEATS, graphed: bool = False,
                prepare: Callable[[int], object] | None = None, settle_within: float | None = None) -> Timing:
    """The median and fastest of timed runs of ``call(i)`` on ``device``, ``i`` cycling over ``rotate`` sets.
    ``graphed``: a kernel under ``GRAPHED_UNDER_S`` on a GPU is timed inside one replayed CUDA graph, as an
    executable runs it (a kernel's timing, never a whole system's: that would graph a peer that has none).
    ``prepare(i)``: untimed, before each CPU call (a GPU times calls queued back to back, with nothing between).
    ``settle_within``: CPU runs stop once their median is known within that fraction (``settled``)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rotation = _Rotation(rotate)
    device = torch.device(device)
    if device.type == "cuda":
        return _time_cuda(call, device, rotation, warmup, warmup_s, repeats, min_repeats,
                          BUDGET_S if budget_s is None else budget_s, graphed)
    if device.type != "cpu":
        raise ValueError(f"cannot time kernels on {device.type} devices")
    return _time_cpu(call, rotation, warmup, warmup_s, repeats, min_repeats,
                     CPU_BUDGET_S if budget_s is None else budget_s, prepare, settle_within)


def _warm_up(call, rotation: _Rotation, calls: int, seconds: float, sync: Callable[[], None],
             prepare: Callable[[int], object] | None = None) -> tuple[float, float]:
    """Run at least ``calls`` calls and ``seconds`` seconds; returns the mean seconds per call, and per call
    on the host alone (before the closing ``sync``: on a GPU, the time to queue one call). The mean leaves the
    first call out when others follow: its one-off costs (a module's lazy load, a library's handle) made an
    H200's 3 us kernel read 20 ms or more, too long to be timed inside a CUDA graph (2026-11-30)."""
    def one_call() -> None:
        index = rotation.next()
        if prepare is not None:
            prepare(index)
        call(index)

    if calls < 1 and seconds <= 0:
        return 0.0, 0.0
    sync()
    start = time.perf_counter()
    one_call()
    sync()
    after_first = time.perf_counter()
    done = 1
    while done < calls or time.perf_counter() - start < seconds:
        one_call()
        done += 1
    queued = time.perf_counter()
    sync()
    if done == 1:
        return after_first - start, after_first - start
    return (time.perf_counter() - after_first) / (done - 1), (queued - after_first) / (done - 1)


def queued_runs(runs: int, host_s: float, min_repeats: int) -> tuple[int, float]:
    """How many timed runs to queue behind the device-side spin, and the spin's seconds: long enough for the
    host to queue every run (its call and two events, half again for safety), so that the GPU runs them back
    to back instead of waiting on the host between them. A host too slow for ``MAX_HOST_LEAD_S`` times fewer
    runs (never under ``min_repeats``)."""
    per_run = max(HOST_LEAD_PER_RUN_S, 1.5 * (host_s + EVENT_PAIR_S))
    fit = int(MAX_HOST_LEAD_S / per_run)
    runs = max(min(runs, fit), min(min_repeats, runs), 1)
    return runs, min(runs * per_run, MAX_HOST_LEAD_S)


def _time_cpu(call, rotation, warmup, warmup_s, repeats, min_repeats, budget_s, prepare=None,
              settle_within=None) -> Timing:
    """A timing no other process disturbed, taken again while one did (the fastest kept if all were)."""
    once = functools.partial(_time_cpu_once, call, rotation, warmup, warmup_s, repeats, min_repeats, budget_s,
                             prepare, settle_within)
    if config.quiet_tries < 1:  # the load is not looked at
        return once()
    kept = None
    for attempt in range(config.quiet_tries):
        if attempt:
            time.sleep(QUIET_PAUSE_S)
        window = cpu_load.Window()
        result = once()
        if not window.disturbed(torch.get_num_threads()):
            return result
        if kept is None or result.median_s < kept.median_s:
            kept = dataclasses.replace(result, disturbed=True)
    return kept


def _time_cpu_once(call, rotation, warmup, warmup_s, repeats, min_repeats, budget_s, prepare=None,
                   settle_within=None) -> Timing:
    _warm_up(call, rotation, warmup, warmup_s, sync=lambda: None, prepare=prepare)
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < repeats and (len(samples) < min_repeats or time.perf_counter() - started < budget_s):
        if settle_within is not None and settled(samples, settle_within):
            break
        index = rotation.next()
        if prepare is not None:
            prepare(index)
        start = time.perf_counter()
        call(index)
        samples.append(time.perf_counter() - start)
    return summarize(samples)


def _time_cuda(call, device, rotation, warmup, warmup_s, repeats, min_repeats, budget_s, graphed) -> Timing:
    with torch.cuda.device(device):
        def sync():
            torch.cuda.synchronize(device)

        estimate, host_s = _warm_up(call, rotation, warmup, warmup_s, sync)
        runs = planned_runs(estimate, budget_s, min_repeats, repeats)
        if graphed and estimate < GRAPHED_UNDER_S:
            samples = _replayed(call, rotation, min(runs, MAX_GRAPHED_RUNS), sync)
            if samples is not None:
                return dataclasses.replace(summarize(samples), graphed=True)
        runs, lead_s = queued_runs(runs, host_s, min_repeats)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(runs)]
        _hold_device(lead_s)
        for start, end in events:
            index = rotation.next()  # chosen before the start event: host work stays outside the timed region
            start.record()
            call(index)
            end.record()
        sync()
        return summarize([start.elapsed_time(end) * 1e-3 for start, end in events])  # elapsed_time is in ms


def _replayed(call, rotation: _Rotation, runs: int, sync) -> list[float] | None:
    """Each run's seconds inside one CUDA graph of ``runs`` calls, each between two stamps
    (``stamped_graph``), replayed twice (the first replay uploads the graph); None if the calls cannot be
    captured (the caller times them launched). Nothing waits on the host, as in an executable's graph: on an
    H100 whose cores the build workers' compiles filled, YOLOX-Nano's kernels timed launched summed 2.97x
    what its graph ran (2026-11-27; the host as the cause is a reading, not yet a measurement)."""
    def runs_between_stamps(stamp):
        for _ in range(runs):
            index = rotation.next()
            stamp()
            call(index)
            stamp()

    try:
        graph, intervals = stamped_graph(runs_between_stamps)
        for _ in range(2):
            graph.replay()
        sync()
        return intervals()[::2]  # a run, then the gap to the next run's start
    except Exception:  # a kernel that cannot be captured (a host synchronisation inside, say)
        sync()
        return None


def chained_in_graph_s(call: Callable[[], object], device: str | torch.device, nodes: int = CHAINED_NODES,
                       replays: int = 5) -> float:
    """Seconds per call of ``call`` captured ``nodes`` times back to back in one CUDA graph with nothing between,
    as an executable's graph runs its kernels; the fastest of ``replays`` replays, each between two events."""
    with torch.cuda.device(device):
        call()  # its module loaded, its workspace allocated, outside the capture
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(nodes):
                call()
        graph.replay()  # the first replay uploads the graph
        totals = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize(device)
            totals.append(start.elapsed_time(end) * 1e-3)  # elapsed_time is in ms
        return min(totals) / nodes


def stamped_graph(body: Callable[[Callable[[], None]], object]):
    """``body(stamp)`` captured in a CUDA graph, each ``stamp()`` a timing event the capture records as a node
    of its own (``external``); returns the graph and a function giving, after a replay and a synchronize, the
    seconds between consecutive stamps of that replay. Other threads' CUDA calls go on during the capture."""
    events: list[torch.cuda.Event] = []

    def stamp():
        events.append(torch.cuda.Event(enable_timing=True, external=True))
        events[-1].record()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        body(stamp)
    return graph, lambda: [a.elapsed_time(b) * 1e-3 for a, b in zip(events, events[1:])]  # elapsed_time: ms


def _hold_device(seconds: float) -> None:
    """Queue a device-side spin of about ``seconds`` on the current stream (if this torch has one)."""
    spin = getattr(torch.cuda, "_sleep", None)
    if spin is not None and seconds > 0:
        spin(int(seconds * GPU_CYCLES_PER_S))


def cache_size(device: str | torch.device) -> int:
    """Bytes of cache that could hold a kernel's inputs between runs: L2 on a GPU, all data caches on a CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or DEFAULT_GPU_CACHE_BYTES
    from korch.cost import probe

    size = probe.cache_bytes()
    return DEFAULT_CPU_CACHE_BYTES if size == probe.FALLBACK_CACHE_BYTES else size


def rotation_count(nbytes: int, cache_bytes: int, cap: int = MAX_ROTATION_SETS) -> int:
    """Fewest input sets of ``nbytes`` each whose total exceeds ``cache_bytes``, at most ``cap``."""
    if nbytes <= 0:
        return 1
    return max(1, min(cap, math.floor(cache_bytes / nbytes) + 1))


def rotation_sets(make_inputs: Callable[[int], T], nbytes: int, cache_bytes: int | None = None, *,
                  device: str | torch.device = "cpu", cap: int = MAX_ROTATION_SETS) -> list[T]:
    """``make_inputs(i)`` for i in range(n): enough sets of ``nbytes`` to overflow the cache (``cache_size``)."""
    if cache_bytes is None:
        cache_bytes = cache_size(device)
    return [make_inputs(i) for i in range(rotation_count(nbytes, cache_bytes, cap))]


def timing_inputs(make: Callable[[], object], nbytes: int, device: str | torch.device) -> list:
    """The input sets a kernel is timed on. On a CPU one set, read again by every call: in an executable a
    kernel reads what the kernel before it has just written, in the cache wherever the model's values fit
    (YOLOX-Nano's roofline kernels summed 16.5 ms with their inputs rotated past the cache, 13.5 ms warm, and
    its compiled unit ran 12.6 ms; Candy's and the BERT layer's sums moved by 2%: their values overflow the
    cache, or their products read weights, either way). On a GPU they rotate past the L2 cache (``rotation_sets``)
    until a device says otherwise (``runtime/kernel_times.py`` measures kernels inside the executable's graph)."""
    if torch.device(device).type == "cpu":
        return [make()]
    return rotation_sets(lambda i: make(), nbytes, device=device)


# The CPU timer's protocol, part of the profile database's key for CPU measurements (``measure.keyed_versions``):
# cold1: every call starts as in an executable (``ColdStart``); cold2: its calling path warmed again after that
CPU_PROTOCOL = "cold2"
# The eviction buffer over the inner caches of the threads that touch it (several times what they hold: a cache
# is not strictly least-recently-used)
EVICTION_FACTOR = 3


class ColdStart:
    """What a CPU kernel finds in the cache as an executable calls it, set up before each of its timed calls.

    Its inputs are warm: their producers have just written them. Nothing else of its own is in the caches of
    its cores (L1 and L2): since its last call the rest of the model ran, and a weight it read then has gone
    to the shared last level, or further if the model's bytes overflow that too (those models are priced in
    place, ``in_place.py``). Timed call after call on one input set, a kernel found its weights in L2: started
    this way, the sums of nine plans' kernels rose 1-12% toward their units (2026-11-29, Zen 5,
    ``benchmarks/in_sequence.py``; Candy's 1%, the `transformers` models' 3-12%). Each call is preceded by a
    write over a buffer several times the threads' inner caches (torch's parallel ``add_``: each thread sweeps
    its own share), then a write over each input of the call's set.

    Last, ``warm_path`` (the kernel's backend's empty kernel, ``calling.empty_call``) brings back what the
    sweep took from the timer's own calling path (the interpreter, torch's dispatcher, the backend's wrapper),
    which a compiled unit does not run: on a Xeon with 2 MB of L2 a core an empty kernel's call took 28-71 us
    from the cold start (its fastest and median calls 20-30 us apart, what a kernel's price then carries) and
    7.4-18 us so warmed, 1 us apart (2026-11-29)."""

    def __init__(self, sets: Sequence[Sequence[torch.Tensor]], warm_path: Callable[[], object] | None = None):
        self.sets, self.warm_path = sets, warm_path
        self.buffer = _eviction_buffer(EVICTION_FACTOR * _inner_cache_bytes() * torch.get_num_threads())

    def __call__(self, index: int) -> None:
        self.buffer.add_(1.0)
        for tensor in self.sets[index]:
            _rewrite(tensor)
        if self.warm_path is not None:
            self.warm_path()


def time_measured(call: Callable[[int], object], sets: Sequence[Sequence[torch.Tensor]],
                  device: str | torch.device, warm_path: Callable[[], object] | None = None,
                  settle_within: float | None = SETTLE_WITHIN) -> Timing:
    """A kernel's timing as the measured search takes it: ``call(i)`` on input set ``sets[i]`` in turn
    (``timing_inputs``), inside a CUDA graph on a GPU where the kernel is short, each CPU call started as an
    executable starts it, its calling path warmed by ``warm_path`` (``ColdStart``), its runs stopped once their
    median is known within ``settle_within`` (CPU)."""
    cold = ColdStart(sets, warm_path) if torch.device(device).type == "cpu" else None
    return time_kernel(call, device=device, rotate=len(sets), graphed=True, prepare=cold,
                       settle_within=settle_within)


def _rewrite(tensor: torch.Tensor) -> None:
    """Write ``tensor`` over in place, as its producer leaves it: in the cache (its values unchanged but the sign
    of a zero)."""
    if tensor.dtype == torch.bool:
        tensor.logical_and_(tensor)
    else:
        tensor.add_(0)


@functools.cache
def _eviction_buffer(nbytes: int) -> torch.Tensor:
    return torch.ones(max(nbytes // 4, 1), dtype=torch.float32)


@functools.cache
def _inner_cache_bytes() -> int:
    from korch.cost import probe

    return probe.inner_cache_bytes()


def take_turns(names: Sequence[str], time_one: Callable[[str, int], T], rounds: int,
               on_error: Callable[[str, Exception], None] | None = None) -> dict[str, list[T]]:
    """``time_one(name, round)`` for every name, round after round, so that a slow spell of a shared
    machine lands on all of them alike. A name whose timing raises is dropped after ``on_error(name, exc)``
    (without ``on_error`` the exception propagates)."""
    results: dict[str, list[T]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in [n for n in names if n in results]:
            try:
                results[name].append(time_one(name, round_))
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(name, exc)
                del results[name]
    return results
