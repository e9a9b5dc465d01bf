"""How big the layout-aware program grows on the zoo (``orchestrate/layouts.py``): candidates, their
channels-last columns, the conversion columns, and the solve time of each program under lower bounds.

    python benchmarks/layout_program.py --out benchmarks/results/layout_program_cpu.json

Under floors both layouts of a kernel cost the same and a conversion costs more than nothing, so the solver
picks no conversion; the solve time is that of the larger program, not of a measured plan's choices.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def program_size(name: str) -> dict:
    from korch import config
    from korch.backends.registry import BackendPredicate, backends_for
    from korch.cost import candidate_bounds, get_device
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.orchestrate.layouts import contiguous_columns, conversion_floor, with_layouts
    from korch.orchestrate.partition import partition
    from korch.orchestrate.problem import segment_problem
    from korch.orchestrate.solver import solve
    from korch.pipeline import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(f"zoo:{name}")
    device = get_device("cpu")
    base = enumerate_candidates(graph, max_nodes=config.max_kernel_nodes, predicate=BackendPredicate(backends_for("cpu")))
    row = {"model": name, "primitives": len(graph.nodes), "candidates": len(base.candidates)}
    for label, cset in (("contiguous", base), ("layouts", with_layouts(graph, base))):
        bounds = candidate_bounds(graph, cset.candidates, device)
        columns = conversions = 0
        started = time.perf_counter()
        for segment in partition(graph, cset, max_segment_nodes=config.max_segment_nodes):
            problem, ids, moves = segment_problem(graph, cset, segment, bounds,
                                                  lambda m: conversion_floor(graph, m, device))
            solve(problem, first=contiguous_columns(cset, ids, moves))
            columns, conversions = columns + len(problem.costs), conversions + len(moves)
        row[label] = {"columns": columns, "conversion_columns": conversions,
                      "solve_s": round(time.perf_counter() - started, 2)}
    return row


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from korch import bench, zoo

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated zoo names (default: the seven zoo models)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else [m.name for m in zoo.list_models() if not m.name.startswith("hf_")]
    rows = []
    for name in names:
        rows.append(program_size(name))
        print(rows[-1], flush=True)
    bench.write_record(bench.record("layout program size", "benchmarks/layout_program.py", argv, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
