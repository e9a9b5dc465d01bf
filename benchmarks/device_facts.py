"""The device's own ceilings, measured once: copy bandwidth, matrix rates, the time of one kernel.

What the cost model's device table should hold instead of datasheet figures
(issue 14's "measured device ceilings", issue 16's "device facts"):

* copy bandwidth: a device-to-device ``copy_`` of 1 GiB (bytes read plus written);
* matrix rate: an 8192-cube ``matmul`` in float32 (tf32 off), tf32 and bf16 on random data;
* one kernel's time: 1000 one-element adds launched from Python, and the same adds captured in a
  CUDA graph and replayed (the executable's calling path), per kernel;
* the measured search's timer: the seconds ``measure._time_built`` spends on a kernel, by step (its input sets,
  tuning its launch variants, its timed runs, the rest), over a sample of Candy's candidates as each backend
  builds them. The H100's searches spent 0.39 s timing a kernel (2026-11-27), most of a GPU search's
  estimate (``korch/search_estimate.py``); these steps say where it goes;
* each backend's calling cost as the measured search takes it (``calling.calling_cost_s``): its empty kernel's
  fastest time as kernels are timed (between two events inside a CUDA graph on a GPU) and, on a GPU, its time
  chained in a replayed graph with nothing between (``timing.chained_in_graph_s``), the node's time every
  kernel now carries.

Each is the median of korch's kernel timer (``backends/timing.py``: warm-up, CUDA events on a GPU). On a
CPU (the campaign's dry run) the same measurements run smaller, timed with the host clock.

    python benchmarks/device_facts.py            # prints the JSON
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import torch


def _median_s(device: str, fn) -> float:
    """``fn``'s median time after warm-up, by korch's kernel timer (CUDA events on a GPU)."""
    from korch.backends.timing import time_kernel

    return time_kernel(lambda i: fn(), device=device).median_s


def copy_bandwidth(device: str) -> float:
    n = (1 << 30 if device == "cuda" else 64 << 20) // 4
    src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
    return 2 * src.nbytes / _median_s(device, lambda: dst.copy_(src))


def matrix_rates(device: str) -> dict[str, float]:
    n = 8192 if device == "cuda" else 1024
    rates = {}
    dtypes = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
    if device != "cuda":
        dtypes = {"fp32": torch.float32}
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, dtype in dtypes.items():
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
            rates[name] = 2 * n ** 3 / _median_s(device, lambda: a @ b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return rates


def kernel_time(device: str) -> dict[str, float]:
    count = 1000
    x = torch.zeros(1, device=device)

    def launches():
        for _ in range(count):
            x.add_(1)

    facts = {"launched_s": _median_s(device, launches) / count}
    if device == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            launches()  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launches()
        facts["graph_replayed_s"] = _median_s(device, graph.replay) / count
    return facts


@contextlib.contextmanager
def _timed_steps(seconds: dict[str, float]):
    """While active, the timer's steps that ``measure._time_built`` calls add their seconds to ``seconds``."""
    from korch.backends import measure

    def timed(step, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[step] = seconds.get(step, 0.0) + time.perf_counter() - start
        return run

    kept = measure.timing_inputs, measure.time_measured
    measure.timing_inputs = timed("input sets", measure.timing_inputs)
    measure.time_measured = timed("timed runs", measure.time_measured)  # a Triton kernel's: each launch variant's
    try:
        yield
    finally:
        measure.timing_inputs, measure.time_measured = kept


def search_timer(device: str, count: int = 4) -> dict:
    """Seconds the measured search's timer spends on a kernel, by step, over ``count`` of Candy's candidates (the
    first each backend of ``device``'s target claims and builds), each kernel timed as ``measure._time_built``
    times it; "rest" is what no step holds (the arena's reset, the warm path, Python)."""
    from korch.backends import measure
    from korch.backends.check import RandomArena
    from korch.backends.registry import backends_for
    from korch.ir.subgraph import extract
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.pipeline import load_model

    target = "h100" if device == "cuda" else "cpu"
    _, graph, _ = load_model("zoo:candy")
    backends = backends_for(target)
    arena, groups = RandomArena(device), {b.name: [] for b in backends}
    for candidate in enumerate_candidates(graph).candidates:  # each extracted once, for every backend
        if all(len(rows) == count for rows in groups.values()):
            break
        kernel = extract(graph, candidate.nodes, candidate.inputs, candidate.outputs)
        for backend in backends:
            if len(groups[backend.name]) == count or backend.claims(kernel) is not None:
                continue
            checked = measure._build_and_check(backend, kernel, device)
            if checked.status != "ok":
                continue
            steps: dict[str, float] = {}
            start = time.perf_counter()
            with _timed_steps(steps):
                measure._time_built(checked.built, kernel, checked.variants, arena, device,
                                    measure._warm_path(backend, device))
            total = time.perf_counter() - start
            groups[backend.name].append({"total_s": total, **steps, "rest": total - sum(steps.values())})
    every = _per_kernel([row for rows in groups.values() for row in rows])
    kernels, seconds = every.pop("kernels"), every.pop("seconds_per_kernel")
    return {"kernels": kernels, "seconds_per_kernel": seconds, "steps_per_kernel": every,
            "by_backend": {name: _per_kernel(rows) for name, rows in groups.items() if rows}}


def _per_kernel(rows: list[dict[str, float]]) -> dict:
    """The kernels timed, their mean seconds, and each step's mean (a step a kernel did not take counts 0)."""
    steps = sorted({key for row in rows for key in row} - {"total_s"})

    def mean(key: str) -> float | None:
        return sum(row.get(key, 0.0) for row in rows) / len(rows) if rows else None

    return {"kernels": len(rows), "seconds_per_kernel": mean("total_s"), **{step: mean(step) for step in steps}}


def calling_costs(device: str) -> dict[str, dict]:
    """Per backend of ``device``'s target: its empty kernel between events (``stamped_s``), chained in a graph
    (``chained_s``, a GPU's), and the calling cost the search takes off every kernel (``cost_s``)."""
    import dataclasses

    from korch.backends import calling
    from korch.backends.registry import backends_for

    found = {}
    for backend in backends_for("h100" if device == "cuda" else "cpu"):
        times = calling.empty_kernel_times(backend, device)
        if times is not None:
            found[backend.name] = {**dataclasses.asdict(times), "cost_s": times.cost_s}
    return found


def measure(timer_kernels: int = 4) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    facts = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "date": time.strftime("%Y-%m-%d"),
             "torch": torch.__version__, "copy_bandwidth_Bps": copy_bandwidth(device),
             "matmul_flops": matrix_rates(device), "one_kernel": kernel_time(device)}
    for name, fact in (("search_timer", lambda: search_timer(device, timer_kernels)),
                       ("calling_costs", lambda: calling_costs(device))):
        try:  # the newest facts, on code a GPU has not run yet: a failure must not lose the others
            facts[name] = fact()
        except Exception as exc:
            facts[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts["properties"] = {"multiprocessors": props.multi_processor_count, "memory_bytes": props.total_memory,
                               "l2_bytes": getattr(props, "L2_cache_size", None),
                               "capability": f"{props.major}.{props.minor}"}
    return facts


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    print(json.dumps(measure(), indent=1))
