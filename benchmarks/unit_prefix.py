"""Where a CPU unit's time parts from its plan's prices: units of the plan's first N kernels, timed beside the sum
of those kernels' prices.

A measured plan prices each kernel alone; its unit runs them in sequence. When the unit runs slower than the
sum, this compiles the OUTDIR's unit (its chosen variant) again for prefixes of the plan (the first N kernels,
writing every value a later kernel or the model's output reads), times each, and prints the unit's time beside
the prefix's price: where the ratio climbs is where the time accrues.

    python benchmarks/unit_prefix.py OUTDIR [--cuts 4] [--calls 15] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path


def prefix(graph, plan, count: int):
    """The graph and plan of ``plan``'s first ``count`` kernels."""
    from korch.ir.subgraph import extract

    kernels = plan.kernels[:count]
    later = {name for k in plan.kernels[count:] for name in k.inputs} | set(graph.outputs)
    written = [name for k in kernels for name in k.outputs]
    outputs = list(dict.fromkeys(name for name in written if name in later))
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    nodes = sorted({index[n] for k in kernels for n in k.nodes})
    read = {name for i in nodes for name in graph.nodes[i].inputs}
    inputs = [name for name in graph.inputs if name in read]
    sub = extract(graph, nodes, inputs, outputs, name=f"{graph.name}_first{count}")
    return sub, dataclasses.replace(plan, kernels=tuple(kernels), conversions=())


def main(argv=None) -> int:
    import torch

    from korch import bench, heap
    from korch.backends import ort_gemm
    from korch.runtime import bundle, unit

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--cuts", type=int, default=4, help="prefixes, evenly spaced, the whole plan the last")
    parser.add_argument("--calls", type=int, default=15, help="timed calls of each unit (median)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    heap.keep_freed_memory()  # as the unit runs
    graph = bundle.read_graph(args.outdir)
    plan = bundle.read_plan(args.outdir)
    choice = json.loads((args.outdir / "manifest.json").read_text())["unit"]
    variant = unit.chosen_variant(choice)
    if variant.ort_kernels:
        ort_gemm.open_library()
    total = len(plan.kernels)
    rows = []
    for count in sorted({max(1, round(total * (i + 1) / args.cuts)) for i in range(args.cuts)}):
        sub, sub_plan = prefix(graph, plan, count)
        compiled = unit.CompiledUnit.from_bytes(unit.compile_unit(sub, sub_plan, "cpu", variant))
        inputs = unit.example_inputs(sub, "cpu")
        with torch.inference_mode():
            for _ in range(3):
                compiled(*inputs)
            seconds = []
            for _ in range(args.calls):
                start = time.perf_counter()
                compiled(*inputs)
                seconds.append(time.perf_counter() - start)
        priced = sum(k.cost_s for k in sub_plan.kernels)
        row = {"kernels": count, "priced_ms": round(priced * 1e3, 3),
               "unit_ms": round(statistics.median(seconds) * 1e3, 3)}
        row["unit_over_priced"] = round(row["unit_ms"] / row["priced_ms"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    bench.write_record(bench.record("unit prefixes against their prices", "benchmarks/unit_prefix.py", argv,
                                    model=plan.model, unit=choice, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
