"""Each kernel's time as the executable runs it, beside what the plan predicted for it.

A plan predicts a model's latency as the sum of its kernels' latencies, each
timed alone (``backends/timing.py``). Where the prediction misses what the
executable runs (YOLOX-Nano's measured plan on an H100 predicted 2.49 ms and
ran 0.84), these times say which kernels the timer got wrong.

* GPU: the executable's launch sequence is captured in a CUDA graph of its
  own with a timing event before each kernel and one after the last
  (``external`` events, which a capture records as graph nodes), and replayed:
  the time between two events is one kernel inside a replayed graph, as the
  executable runs it, with the gap to the next launch.
* CPU: the launch sequence runs with ``time.perf_counter`` read before each
  kernel and after the last.

Either way the median over ``runs`` runs of the sequence. On a GPU the events
are nodes of the graph and take time of their own: ``stamp_cost_s`` is what
one costs between two others with nothing between (on the H200, each kernel's
time ran 2-4 us above what it added to the unstamped graph, 2026-11-30). A
compiled unit (one AOTInductor library for the whole plan) has no kernels to
time apart (``Executable.launch_sequence`` says so).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from korch import precision
from korch.backends.timing import stamped_graph

RUNS = 20
STAMPS = 32  # events back to back in the graph that reads one event's own time (``stamp_cost_s``)


class _Stamped:
    """A kernel that marks the moment it is called before running."""

    def __init__(self, kernel: Callable, stamp: Callable[[], None]):
        self.kernel, self.stamp = kernel, stamp

    def __call__(self, *args, **kwargs):
        self.stamp()
        return self.kernel(*args, **kwargs)


def kernel_times(executable, inputs: Sequence[torch.Tensor], *, runs: int = RUNS) -> list[float]:
    """Seconds of each of ``executable``'s kernels in plan order, as it runs them (medians of ``runs``)."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    inputs = [x.to(executable.device) for x in inputs]
    with torch.inference_mode(), precision.applied(executable.precision):
        timed = _on_gpu if executable.device.type == "cuda" else _on_cpu
        per_run = timed(executable, inputs, runs)
    return [statistics.median(column) for column in zip(*per_run)]


def _on_cpu(executable, inputs, runs: int) -> list[list[float]]:
    stamps: list[float] = []
    stamped = [_Stamped(k, lambda: stamps.append(time.perf_counter())) for k in executable.kernels]
    executable.launch_sequence(executable.kernels, inputs)  # warm-up
    per_run = []
    for _ in range(runs):
        stamps.clear()
        executable.launch_sequence(stamped, inputs)
        stamps.append(time.perf_counter())
        per_run.append([b - a for a, b in zip(stamps, stamps[1:])])
    return per_run


def _on_gpu(executable, inputs, runs: int) -> list[list[float]]:
    def stamped_sequence(stamp):
        executable.launch_sequence([_Stamped(k, stamp) for k in executable.kernels], inputs)
        stamp()

    with torch.cuda.device(executable.device):
        executable.launch_sequence(executable.kernels, inputs)  # warm-up: Triton's and Inductor's first calls compile
        torch.cuda.synchronize()
        graph, intervals = stamped_graph(stamped_sequence)
        per_run = []
        for _ in range(runs):
            graph.replay()
            torch.cuda.synchronize()
            per_run.append(intervals())
    return per_run


def stamp_cost_s(device: torch.device | str, runs: int = RUNS) -> float:
    """Seconds one timing event of ``kernel_times`` adds inside a replayed CUDA graph: the median interval
    between ``STAMPS`` events captured back to back; 0 on a CPU (a clock read between Python calls)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0.0

    def stamps_alone(stamp):
        for _ in range(STAMPS):
            stamp()

    with torch.cuda.device(device):
        graph, intervals = stamped_graph(stamps_alone)
        seen = []
        for _ in range(runs):
            graph.replay()
            torch.cuda.synchronize()
            seen += intervals()
    return statistics.median(seen)
