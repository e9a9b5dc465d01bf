"""A measured plan's kernels timed as the search times them (inputs rotated past the cache) and with warm inputs
(one input set, read again by every call), beside the plan's prediction and its executable's time.

The search rotates each kernel's inputs over enough sets to overflow the cache (``timing.rotation_sets``), so a
small kernel is not flattered by inputs a previous call left in the cache. Inside an executable a kernel mostly
reads what the kernel before it has just written, which is in the cache when the model's values fit there.
Which of the two the executable's time follows is measured here, on the plan's own kernels:

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
    from korch import bench
    from korch.backends.check import RandomArena
    from korch.backends.measure import calling_cost_s
    from korch.backends.registry import backends_for
    from korch.backends.timing import rotation_sets, time_kernel
    from korch.orchestrate.plan import Plan
    from korch.runtime import bundle
    from korch.runtime.build import kernel_graphs
    from korch.runtime.selfcheck import seeded_inputs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--rounds", type=int, default=3, help="turns of rotated and warm timing per kernel")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    graph = bundle.graph_from_bytes((args.outdir / "graph.json").read_bytes(),
                                    (args.outdir / "weights.npz").read_bytes())
    plan = Plan.from_bytes((args.outdir / "plan.json").read_bytes())
    backends = {b.name: b for b in backends_for("cpu")}
    calling = {name: calling_cost_s(b, "cpu") for name, b in backends.items()}
    arena = RandomArena("cpu")
    rows = []
    with torch.inference_mode():
        for k, kernel in zip(plan.kernels, kernel_graphs(graph, plan, layouts=True)):
            backend = k.backend or "inductor"  # a roofline plan names none: Inductor builds every kernel
            built = backends[backend].build(kernel, "cpu")
            nbytes = sum(kernel.tensors[n].nbytes for n in (*kernel.inputs, *kernel.outputs))
            arena.reset()
            sets = rotation_sets(lambda i: arena.inputs(kernel), nbytes, device="cpu")
            rotated, warm = [], []
            for _ in range(args.rounds):
                rotated.append(time_kernel(lambda i: built(*sets[i]), device="cpu", rotate=len(sets)).median_s)
                warm.append(time_kernel(lambda i: built(*sets[0]), device="cpu").median_s)
            less = calling[backend]
            rows.append({"kernel": k.name, "ops": k.ops, "backend": backend, "sets": len(sets),
                         "planned_us": round(k.cost_s * 1e6, 2),
                         "rotated_us": round(max(min(rotated) - less, 0.0) * 1e6, 2),
                         "warm_us": round(max(min(warm) - less, 0.0) * 1e6, 2)})
        executable = korch.load(args.outdir)
        feeds = seeded_inputs(executable.input_specs)
        inputs = [torch.from_numpy(feeds[n]) for n in executable.input_names]
        unit_s = time_kernel(lambda i: executable(*inputs), device="cpu", budget_s=2.0, min_repeats=10).median_s
    conversions_ms = sum(c.cost_s for c in plan.conversions) * 1e3
    summary = {"model": plan.model, "kernels": len(rows), "predicted_ms": round(plan.predicted_latency_s * 1e3, 3),
               "planned_sum_ms": round(sum(r["planned_us"] for r in rows) / 1e3 + conversions_ms, 3),
               "rotated_sum_ms": round(sum(r["rotated_us"] for r in rows) / 1e3 + conversions_ms, 3),
               "warm_sum_ms": round(sum(r["warm_us"] for r in rows) / 1e3 + conversions_ms, 3),
               "conversions_ms": round(conversions_ms, 3), "executable_ms": round(unit_s * 1e3, 3)}
    print(json.dumps(summary))
    bench.write_record(bench.record("warm inputs", "benchmarks/warm_inputs.py", argv, summary=summary, rows=rows),
                       args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
