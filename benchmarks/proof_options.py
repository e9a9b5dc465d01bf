"""How long branch and cut takes to prove a zoo model's layout program optimal, under HiGHS's MIP options.

A measured search's proofs run on costs that are real latencies, where near-equal alternatives make the LP
relaxation fractional; the floors of the program alone make it integral (``layout_program.py``). This script
stands in for a full profile database: each candidate's cost is its floor times ``exp(N(1, sigma))``, drawn per
``--seeds`` seed, and ``solve`` proves that program's optimum with HiGHS's defaults as korch sets them and with
each ``--options`` change (``name=value``, several separated by ``;``), each seed in turn. Per solve: seconds,
the dive's and branch and cut's shares, the root relaxation's gap to the optimum and HiGHS's node count.

    python benchmarks/proof_options.py --model efficientvit --seeds 1,2,3 \
        --options "mip_heuristic_effort=0.0;mip_pscost_minreliable=2" --out FILE.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def layout_program(name: str):
    """The zoo model's layout-aware program (one segment), costed by its floors."""
    from korch import config
    from korch.backends.registry import BackendPredicate, backends_for
    from korch.cost import candidate_bounds, get_device
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.orchestrate.layouts import conversion_floor, with_layouts
    from korch.orchestrate.partition import partition
    from korch.orchestrate.problem import segment_problem
    from korch.pipeline import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(f"zoo:{name}")
    device = get_device("cpu")
    base = enumerate_candidates(graph, max_nodes=config.max_kernel_nodes,
                                predicate=BackendPredicate(backends_for("cpu")))
    cset = with_layouts(graph, base)
    bounds = candidate_bounds(graph, cset.candidates, device)
    (segment, *rest) = partition(graph, cset, max_segment_nodes=config.max_segment_nodes)
    if rest:
        raise SystemExit(f"{name}: {1 + len(rest)} segments; this script times one program")
    problem, _, _ = segment_problem(graph, cset, segment, bounds, lambda m: conversion_floor(graph, m, device))
    return problem


def _value(text: str):
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def timed_solve(problem, options: dict) -> dict:
    """``solve`` with ``options`` set on the HiGHS model, and where its time went."""
    from korch.orchestrate import solver

    spent = {"dive": 0.0, "mip": 0.0, "nodes": 0, "root": 0.0}
    build, dive, mip = solver._build_model, solver.Solver._dive, solver.Solver._mip

    def with_options(*args):
        h, upper = build(*args)
        for key, value in options.items():
            h.setOptionValue(key, value)
        return h, upper

    def timed(method, key: str, after):
        def run(self, *args):
            started = time.perf_counter()
            try:
                return method(self, *args)
            finally:
                spent[key] += time.perf_counter() - started
                after(self)
        return run

    def after_dive(self):
        spent["root"] = self.root_bound

    def after_mip(self):
        spent["nodes"] += int(self.h.getInfo().mip_node_count)

    timed_dive, timed_mip = timed(dive, "dive", after_dive), timed(mip, "mip", after_mip)
    solver._build_model, solver.Solver._dive, solver.Solver._mip = with_options, timed_dive, timed_mip
    try:
        solution = solver.solve(problem)
    finally:
        solver._build_model, solver.Solver._dive, solver.Solver._mip = build, dive, mip
    return {"solve_s": round(solution.seconds, 2), "optimal": solution.optimal, "objective": solution.objective,
            "dive_s": round(spent["dive"], 2), "branch_and_cut_s": round(spent["mip"], 2), "nodes": spent["nodes"],
            "root_gap": round((solution.objective - spent["root"]) / solution.objective, 5)}


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from korch import bench

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="efficientvit")
    parser.add_argument("--sigma", type=float, default=0.3, help="spread of the log cost factors")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--options", default="", help="HiGHS option changes to compare, name=value;...")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    problem = layout_program(args.model)
    settings = [{}] + [dict((k, _value(v)) for k, v in [change.split("=", 1)])
                       for change in args.options.split(";") if change]
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        factors = np.exp(np.random.default_rng(seed).normal(1.0, args.sigma, len(problem.costs)))
        costed = dataclasses.replace(problem, costs=list(np.asarray(problem.costs) * factors))
        for options in settings:
            rows.append({"model": args.model, "columns": len(problem.costs), "seed": seed,
                         "options": options, **timed_solve(costed, options)})
            print(rows[-1], flush=True)
    bench.write_record(bench.record("proofs of a layout program under HiGHS's options", "benchmarks/proof_options.py",
                                    argv, sigma=args.sigma, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
