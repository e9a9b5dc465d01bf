"""A measured plan's kernels timed alone and in sequence, beside its compiled unit: which of the two the unit spends.

A measured search times a CPU kernel alone, call after call on one input set, each call from a cold start. In the
executable a kernel reads what its producer has just written and writes into memory other values left cold. This
builds each planned kernel again by the backend the plan chose (from the compilers' caches), times it alone as the
search does (``timing.time_measured`` on one input set), then runs all of them in the plan's order on the values
they pass each other (``backends/in_place.InPlaceTimer``, what the search prices an optimum's kernels with), and
times the OUTDIR's unit in the same process (before and after the kernels, the mean). Alone, each kernel is timed
as the search times it (``alone``: every call from a cold start, its calling path warmed again,
``timing.ColdStart``; ``alone_mean``: the mean of those calls, not their median) and, in turns with that, warm
(``alone_warm``: call after call, as the search did before the cold start). Each kernel's time is less its
backend's calling cost (the search's, timed as the search times it, for both).

    python benchmarks/in_sequence.py OUTDIR... [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace


def plan_sums(outdir: Path) -> tuple[dict, list[dict]]:
    """(the plan's sums and its unit's time, a row per kernel) for one OUTDIR."""
    import torch

    import korch
    from korch.backends.check import RandomArena
    from korch.backends.in_place import InPlaceTimer
    from korch.backends.calling import calling_cost_s, empty_call
    from korch.backends.registry import backends_for
    from korch.backends.timing import time_kernel, time_measured
    from korch.runtime import bundle
    from korch.runtime.build import kernel_graphs
    from korch.runtime.selfcheck import seeded_inputs

    graph, plan = bundle.read_graph(outdir), bundle.read_plan(outdir)
    backends = {b.name: b for b in backends_for("cpu")}
    calling = {name: calling_cost_s(b, "cpu") for name, b in backends.items()}
    kernels = kernel_graphs(graph, plan, layouts=True)
    names = [k.backend or "inductor" for k in plan.kernels]  # a roofline plan names none: Inductor builds them
    timer = InPlaceTimer(SimpleNamespace(
        device="cpu", backends=list(backends.values()), kernel_graph=lambda i: kernels[i],
        record_for=lambda i: SimpleNamespace(backend=names[i]), calling_s=lambda name: calling[name]))
    arena, alone, alone_mean, warm = RandomArena("cpu"), [], [], []
    executable = korch.load(outdir)
    feeds = seeded_inputs(executable.input_specs)
    unit_inputs = [torch.from_numpy(feeds[n]) for n in executable.input_names]

    def unit_time():
        return time_kernel(lambda _: executable(*unit_inputs), device="cpu", budget_s=3.0, min_repeats=15)

    with torch.inference_mode():
        unit_before = unit_time()
        for i, kernel in enumerate(kernels):
            built = timer.build(i)[1]
            arena.reset()
            inputs = arena.inputs(kernel)
            cold, warm_s = [], []
            warm_path = empty_call(backends[names[i]], "cpu")
            for _ in range(2):  # in turns: the host's speed drifts
                cold.append(time_measured(lambda _: built(*inputs), [inputs], "cpu", warm_path))
                warm_s.append(time_kernel(lambda _: built(*inputs), device="cpu").median_s)
            alone.append(max(min(t.median_s for t in cold) - calling[names[i]], 0.0))
            alone_mean.append(max(min(t.mean_s for t in cold) - calling[names[i]], 0.0))
            warm.append(max(min(warm_s) - calling[names[i]], 0.0))
        in_sequence = timer.time(range(len(kernels)))
        unit_after = unit_time()
        unit_s = (unit_before.median_s + unit_after.median_s) / 2
        unit_mean_s = (unit_before.mean_s + unit_after.mean_s) / 2
    conversions_ms = sum(c.cost_s for c in plan.conversions) * 1e3
    rows = [{"kernel": k.name, "ops": k.ops, "backend": names[i], "planned_us": round(k.cost_s * 1e6, 2),
             "alone_us": round(alone[i] * 1e6, 2), "alone_mean_us": round(alone_mean[i] * 1e6, 2),
             "alone_warm_us": round(warm[i] * 1e6, 2),
             "in_sequence_us": round(in_sequence[i] * 1e6, 2)}
            for i, k in enumerate(plan.kernels)]
    summary = {"model": plan.model, "kernels": len(rows), "predicted_ms": round(plan.predicted_latency_s * 1e3, 3),
               "alone_sum_ms": round(sum(alone) * 1e3 + conversions_ms, 3),
               "alone_mean_sum_ms": round(sum(alone_mean) * 1e3 + conversions_ms, 3),
               "alone_warm_sum_ms": round(sum(warm) * 1e3 + conversions_ms, 3),
               "in_sequence_sum_ms": round(sum(in_sequence.values()) * 1e3 + conversions_ms, 3),
               "conversions_ms": round(conversions_ms, 3), "unit_ms": round(unit_s * 1e3, 3),
               "unit_mean_ms": round(unit_mean_s * 1e3, 3)}
    return summary, rows


def main(argv=None) -> int:
    from korch import bench, heap

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdirs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    heap.keep_freed_memory()  # as the search times kernels and the unit runs
    summaries, rows = [], []
    for outdir in args.outdirs:
        summary, kernel_rows = plan_sums(outdir)
        print(json.dumps(summary), flush=True)
        summaries.append(summary)
        rows += [{"model": summary["model"], **r} for r in kernel_rows]
    bench.write_record(bench.record("kernels in sequence", "benchmarks/in_sequence.py", argv,
                                    summary={"plans": summaries}, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
