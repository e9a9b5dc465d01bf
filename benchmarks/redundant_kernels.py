"""Kernels of a written plan that the rest of it makes redundant: what ``Index.drop_redundant`` (the solver's last
step since 2026-11-29) drops from it, and the predicted milliseconds they held.

A plan a time limit stopped short of its optimum can select two kernels that write the same value; the compiled
unit computes it once (the other computation is dead code), so the plan predicts more than its unit spends. This
rebuilds each OUTDIR's plan as the program saw it (each kernel's 4-D values in its layout, the conversions as
columns, every graph output and every primitive required) and drops what the solver now drops.

    python benchmarks/redundant_kernels.py OUTDIR... [--out FILE.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def redundant(outdir: Path) -> dict:
    """The plan's kernels and predicted ms, and those ``drop_redundant`` removes."""
    from korch.ir.graph import other_layout
    from korch.orchestrate.layouts import laid_out, stored_name
    from korch.orchestrate.problem import Problem
    from korch.orchestrate.schedule import Index
    from korch.runtime import bundle

    graph, plan = bundle.read_graph(outdir), bundle.read_plan(outdir)
    ids: dict[str, int] = {}

    def tid(name: str) -> int:
        return ids.setdefault(name, len(ids))

    given = set(graph.inputs) | set(graph.constants)  # as stored: a graph input is given contiguous
    costs, needs, produces, names = [], [], [], []
    for k in plan.kernels:  # a planned kernel stores its values as the program's candidate did (``laid_out``)
        laid = set(laid_out(graph, k))
        stored = {t: stored_name(t, k.layout) if t in laid else t for t in (*k.inputs, *k.outputs)}
        costs.append(k.cost_s)
        needs.append(tuple(tid(stored[t]) for t in k.inputs if stored[t] not in given))
        produces.append(tuple(tid(stored[t]) for t in k.outputs) + tuple(tid(f"\0{n}") for n in k.nodes))
        names.append(f"{k.name} {k.ops}")
    for c in plan.conversions:
        source = stored_name(c.tensor, other_layout(c.to))
        costs.append(c.cost_s)
        needs.append(() if source in given else (tid(source),))
        produces.append((tid(stored_name(c.tensor, c.to)),))
        names.append(f"{c.tensor} to {c.to}")
    required = tuple(sorted({tid(t) for t in graph.outputs} | {tid(f"\0{node.name}") for node in graph.nodes}))
    problem = Problem(tuple(costs), tuple(needs), tuple(produces), required)
    order = list(range(len(costs)))
    kept = set(Index(problem).drop_redundant(order, costs))
    dropped = [c for c in order if c not in kept]
    return {"model": plan.model, "kernels": len(plan.kernels), "predicted_ms": round(plan.predicted_latency_s * 1e3, 3),
            "redundant": len(dropped), "redundant_ms": round(sum(costs[c] for c in dropped) * 1e3, 3),
            "dropped": [{"kernel": names[c], "ms": round(costs[c] * 1e3, 3)} for c in dropped]}


def main(argv=None) -> int:
    from korch import bench

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for outdir in args.outdirs:
        row = redundant(outdir)
        rows.append(row)
        print(f"{row['model']}: {row['redundant']} of {row['kernels']} kernels redundant, "
              f"{row['redundant_ms']} of {row['predicted_ms']} predicted ms")
    bench.write_record(bench.record("redundant kernels of written plans", "benchmarks/redundant_kernels.py", argv,
                                    rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
