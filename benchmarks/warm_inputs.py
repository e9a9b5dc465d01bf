"""A measured plan's kernels timed as the search times them (inputs rotated past the cache), with warm inputs
(one input set, read again by every call) and with cold weights (warm inputs, the cache flushed of all else before
each call), beside the plan's prediction and its executable's time.

The search rotates each kernel's inputs over enough sets to overflow the cache (``timing.rotation_sets``), so a
small kernel is not flattered by inputs a previous call left in the cache. Inside an executable a kernel mostly
reads what the kernel before it has just written, which is in the cache when the model's values fit there.
A kernel timed call after call also finds its weights in the cache, which inside an executable whose weights and
values overflow the cache it does not: the third timing evicts everything (a pass over a buffer twice the
last-level cache) and reads the inputs again before each call, timed alone. Which of these the executable's time
follows is measured here, on the plan's own kernels:

    python benchmarks/warm_inputs.py OUTDIR [--out FILE.json]

OUTDIR is written by ``korch optimize --cost measured``. Each planned kernel is built again by the backend the
plan chose (from the compiler caches), then timed both ways in turns, in one process; both sums are less each
backend's calling cost (as the search's ``in_place_s``). The executable (its compiled unit) is timed in the same
process, after the kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    import torch

    import korch
    from korch import bench, heap
    from korch.backends.check import RandomArena
    from korch.backends.calling import calling_cost_s
    from korch.backends.registry import backends_for
    from korch.backends.timing import rotation_sets, time_kernel
    from korch.runtime import bundle
    from korch.runtime.build import kernel_graphs
    from korch.runtime.selfcheck import seeded_inputs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--rounds", type=int, default=3, help="turns of rotated and warm timing per kernel")
    parser.add_argument("--cold-calls", type=int, default=15, help="calls timed with cold weights per round")
    parser.add_argument("--cache-mib", type=int, default=32, help="the last-level cache the flush overflows twice")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    heap.keep_freed_memory()  # kernels are timed on the heap the search times them on, and the unit runs on
    graph = bundle.read_graph(args.outdir)
    plan = bundle.read_plan(args.outdir)
    backends = {b.name: b for b in backends_for("cpu")}
    calling = {name: calling_cost_s(b, "cpu") for name, b in backends.items()}
    arena = RandomArena("cpu")
    flush = torch.zeros((2 * args.cache_mib) << 18)  # float32: twice the cache
    rows = []
    with torch.inference_mode():
        for k, kernel in zip(plan.kernels, kernel_graphs(graph, plan, layouts=True)):
            backend = k.backend or "inductor"  # a roofline plan names none: Inductor builds every kernel
            built = backends[backend].build(kernel, "cpu")
            nbytes = sum(kernel.tensors[n].nbytes for n in (*kernel.inputs, *kernel.outputs))
            arena.reset()
            sets = rotation_sets(lambda i: arena.inputs(kernel), nbytes, device="cpu")
            rotated, warm, cold = [], [], []
            for _ in range(args.rounds):
                rotated.append(time_kernel(lambda i: built(*sets[i]), device="cpu", rotate=len(sets)).median_s)
                warm.append(time_kernel(lambda i: built(*sets[0]), device="cpu").median_s)
                cold.append(_cold_weights_s(built, sets[0], flush, args.cold_calls))
            less = calling[backend]
            rows.append({"kernel": k.name, "ops": k.ops, "backend": backend, "sets": len(sets),
                         "planned_us": round(k.cost_s * 1e6, 2),
                         "rotated_us": round(max(min(rotated) - less, 0.0) * 1e6, 2),
                         "warm_us": round(max(min(warm) - less, 0.0) * 1e6, 2),
                         "cold_weights_us": round(max(min(cold) - less, 0.0) * 1e6, 2)})
        executable = korch.load(args.outdir)
        feeds = seeded_inputs(executable.input_specs)
        inputs = [torch.from_numpy(feeds[n]) for n in executable.input_names]
        unit_s = time_kernel(lambda i: executable(*inputs), device="cpu", budget_s=2.0, min_repeats=10).median_s
    conversions_ms = sum(c.cost_s for c in plan.conversions) * 1e3
    summary = {"model": plan.model, "kernels": len(rows), "predicted_ms": round(plan.predicted_latency_s * 1e3, 3),
               "planned_sum_ms": round(sum(r["planned_us"] for r in rows) / 1e3 + conversions_ms, 3),
               "rotated_sum_ms": round(sum(r["rotated_us"] for r in rows) / 1e3 + conversions_ms, 3),
               "warm_sum_ms": round(sum(r["warm_us"] for r in rows) / 1e3 + conversions_ms, 3),
               "cold_weights_sum_ms": round(sum(r["cold_weights_us"] for r in rows) / 1e3 + conversions_ms, 3),
               "conversions_ms": round(conversions_ms, 3), "executable_ms": round(unit_s * 1e3, 3)}
    print(json.dumps(summary))
    bench.write_record(bench.record("warm inputs", "benchmarks/warm_inputs.py", argv, summary=summary, rows=rows),
                       args.out)
    return 0


def _cold_weights_s(built, inputs, flush, calls: int) -> float:
    """The median of ``calls`` calls of ``built`` on ``inputs``, each after ``flush`` was written (evicting the
    kernel's weights, and all else) and the inputs read again (warm, as the kernel before left them)."""
    import statistics
    import time

    seconds = []
    for _ in range(calls + 1):  # the first call after building is not timed
        flush.add_(1.0)
        for x in inputs:
            x.sum()
        start = time.perf_counter()
        built(*inputs)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds[1:])


if __name__ == "__main__":
    sys.exit(main())
