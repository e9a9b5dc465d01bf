"""How many candidates a measured search must measure, replayed from a full profile, for floors of any tightness.

Every candidate of a model is measured once (``KernelMeasurer``, into the
profile database: a second run builds nothing). Then, without building
anything, for each floor model:

* the lazy search (``korch optimize --cost measured``) is replayed with an
  oracle that answers from those measurements: the signatures it asks for
  (its measured share) and the objective it reaches, which must equal the
  optimum that knows every latency;
* a certificate is searched: a set of measured signatures that proves the
  optimum with the other candidates at their floors (within ``--slack``, the
  relative gap the proof may leave). Greedy: starting from everything
  measured, each signature, largest floor gap first, is dropped if the proof
  still holds. No search strategy can do with fewer than the smallest such
  set; the greedy one is an upper bound on that least number.

Floor models: ``roofline`` (korch's floors for this host), ``parts`` (those with every product and
convolution timed alone first, as ``korch optimize`` does: ``cost/parts.py``), ``rooflineE``
(those floors with each elementwise kernel's, one without a product,
convolution, reduction or window, times E: what floors that much tighter for
the loops would save) and ``oracleF``, the true latency times F (a floor model
as tight as F could ever be). The search is replayed as ``korch optimize``
runs it: with layouts where it chooses them (a CPU) and measuring up to
``--ahead`` columns a round (its default: ``config.measure_ahead``; 0 is the
strictly lazy loop).
``--export FILE`` writes each model's measured latencies (as the search sees
them: the fastest backend's, less its calling cost) with this host's probe
record: ``tests/cost/test_zoo_floors.py`` checks every floor against them. With
``--known-only`` it exports what the database holds, measuring and replaying
nothing (the convolution networks' searches measure a part of their candidates).

    python benchmarks/floor_share.py zoo:bert_layer zoo:vit_block --floors roofline,roofline4,oracle0.9 \\
        --slack 0,0.05 [--ahead 0] --out benchmarks/results/floor_share_cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


class _Replay:
    """A measurer for ``solve_segments`` that answers from known latencies and counts the signatures asked."""

    def __init__(self, candidates, latency: dict[str, float], bounds):
        self.candidates, self.latency, self.bounds = candidates, latency, bounds
        self.asked: set[str] = set()

    def known(self, ids):
        return {}

    def measure(self, ids):
        self.asked.update(self.candidates[c].signature for c in ids)
        return {c: max(self.latency[self.candidates[c].signature], self.bounds[c]) for c in ids}

    def record_for(self, c):
        return None


def _loops_only(graph, candidate) -> bool:
    """Whether a candidate is elementwise and layout primitives alone (no product, convolution, reduction, window)."""
    from korch.ir.ops import Kind

    return all(graph.nodes[n].op.kind in (Kind.ELEMENTWISE, Kind.LAYOUT) for n in candidate.nodes)


def floors(name: str, graph, candidates, device, latency: dict[str, float]) -> list[float]:
    from korch.cost import candidate_bounds, measured_parts

    if name == "parts":  # the search's floors once its products and convolutions were timed alone
        parts = measured_parts(graph, candidates, lambda ids: {c: latency[candidates[c].signature] for c in ids})
        return candidate_bounds(graph, candidates, device, parts=parts)
    if name.startswith("roofline"):
        bounds = candidate_bounds(graph, candidates, device)
        scale = float(name.removeprefix("roofline") or 1)
        return [b * scale if _loops_only(graph, c) else b for b, c in zip(bounds, candidates)]
    if name.startswith("oracle"):
        share = float(name.removeprefix("oracle"))
        return [share * latency[c.signature] if math.isfinite(latency[c.signature]) else 0.0 for c in candidates]
    raise SystemExit(f"unknown floor model {name!r}: roofline, rooflineE, parts or oracleF")


def certificate(graph, cset, segments, truth: dict[int, float], bounds, slack: float, conversion_cost=None) \
        -> set[str]:
    """Signatures whose measurements, the rest at their floors, prove each segment's optimum (greedy, see above)."""
    from korch.orchestrate.problem import segment_problem
    from korch.orchestrate.solver import Solver

    needed: set[str] = set()
    for segment in segments:
        problem, ids, _ = segment_problem(graph, cset, segment, bounds, conversion_cost)
        moves = list(problem.costs[len(ids):])  # the layout conversions' columns, priced alike in every solve
        true = [truth[i] for i in ids]
        floor = [min(bounds[i], truth[i]) for i in ids]
        signature = [cset.candidates[i].signature for i in ids]
        solver = Solver(problem)
        optimum = solver.solve(true + moves)
        chosen = {signature[j] for j in optimum.order if j < len(ids)}
        gap = {}
        for j, s in enumerate(signature):
            gap[s] = max(gap.get(s, 0.0), true[j] - floor[j])
        measured = set(signature)
        for s in sorted(set(signature) - chosen, key=lambda s: -gap[s]):
            trial = measured - {s}
            costs = [true[j] if signature[j] in trial else floor[j] for j in range(len(ids))]
            if solver.solve(costs + moves).objective >= optimum.objective * (1 - slack) - 1e-12:
                measured = trial
        needed |= measured
    return needed


def replay(model: str, db: str | None, floor_models: list[str], slacks: list[float],
           jobs: int | None, ahead: int) -> tuple[dict, dict[str, float]]:
    """The model's row of results, and its measured latency by signature."""
    from korch import config
    from korch.backends.db import ProfileDB
    from korch.backends.measure import KernelMeasurer
    from korch.orchestrate.partition import partition
    from korch.orchestrate.segments import solve_segments
    from korch.pipeline import _conversion_cost, candidate_kernels, floor_device, load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(model)
    cset = candidate_kernels(graph, "cpu", "measured")  # as the search has them
    segments = partition(graph, cset, max_segment_nodes=config.max_segment_nodes)
    device = floor_device("cpu")
    started = time.perf_counter()
    measurer = KernelMeasurer(graph, cset.candidates, [0.0] * len(cset.candidates), target="cpu",
                              db=ProfileDB(db), jobs=jobs)
    try:
        truth = measurer.measure(list(range(len(cset.candidates))))
    finally:
        measurer.close()
    latency = {c.signature: truth[c.id] for c in cset.candidates}
    moves = _conversion_cost(graph, device, measurer)  # measured once, then from the database
    full, _, _ = solve_segments(graph, cset, segments, [truth[c.id] for c in cset.candidates], None,
                                conversion_cost=moves)
    row = {"model": model, "candidates": len(cset.candidates), "signatures": len(latency),
           "measure_everything_s": round(time.perf_counter() - started, 1),
           "optimum_ms": sum(k.cost_s for k in full) * 1e3, "floor_models": {}}
    for name in floor_models:
        bounds = floors(name, graph, cset.candidates, device, latency)
        oracle = _Replay(cset.candidates, latency, bounds)
        if name == "parts":  # measured before the search starts
            from korch.cost import measured_parts

            measured_parts(graph, cset.candidates, oracle.measure)
        kernels, _, _ = solve_segments(graph, cset, segments, bounds, None, measurer=oracle, conversion_cost=moves,
                                       measure_ahead=ahead)
        ratios = sorted(truth[c.id] / b for c, b in zip(cset.candidates, bounds)
                        if b > 0 and math.isfinite(truth[c.id]))
        entry = {"lazy_asked": len(oracle.asked), "lazy_share": len(oracle.asked) / len(latency),
                 "lazy_objective_ms": sum(latency[k.signature] for k in kernels) * 1e3,
                 "below_floor": sum(1 for c, b in zip(cset.candidates, bounds) if truth[c.id] < b),
                 "measured_over_floor_median": ratios[len(ratios) // 2] if ratios else None,
                 "certificate": {}}
        for slack in slacks:
            entry["certificate"][str(slack)] = len(certificate(graph, cset, segments, truth, bounds, slack,
                                                                        moves))
        row["floor_models"][name] = entry
        proofs = ", ".join(f"slack {s}: {n} ({n / len(latency):.0%})" for s, n in entry["certificate"].items())
        print(f"{model}: {name}: lazy search asks {entry['lazy_asked']} of {len(latency)} signatures "
              f"({entry['lazy_share']:.0%}), objective {entry['lazy_objective_ms']:.3f} ms (optimum "
              f"{row['optimum_ms']:.3f}); certificate {proofs}; median measured/floor "
              f"{entry['measured_over_floor_median']:.2f}, {entry['below_floor']} below their floor", flush=True)
    return row, latency


def known(model: str, db: str | None) -> dict[str, float]:
    """The model's latencies the database holds in full (as the search sees them), nothing built."""
    from korch.backends.db import ProfileDB
    from korch.backends.measure import KernelMeasurer
    from korch.pipeline import candidate_kernels, load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(model)
    cset = candidate_kernels(graph, "cpu", "measured")
    measurer = KernelMeasurer(graph, cset.candidates, [0.0] * len(cset.candidates), target="cpu", db=ProfileDB(db))
    try:
        found = measurer.known(list(range(len(cset.candidates))))
    finally:
        measurer.close()
    return {cset.candidates[c].signature: latency for c, latency in found.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--db", default=None, help="profile database (default: korch's)")
    parser.add_argument("--floors", default="roofline", help="comma-separated: roofline, parts, rooflineE, oracleF")
    parser.add_argument("--ahead", type=int, default=None, help="columns a round measures ahead "
                        "(default: the search's, config.measure_ahead)")
    parser.add_argument("--slack", default="0", help="comma-separated relative gaps a certificate may leave, "
                        "or none (no certificate: one solve a signature each)")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--export", default=None, help="write the measured latencies and the probe record here")
    parser.add_argument("--known-only", action="store_true", help="with --export: only the latencies the database "
                        "holds, nothing measured or replayed")
    args = parser.parse_args(argv)
    from korch import config

    ahead = config.measure_ahead if args.ahead is None else args.ahead
    slacks = [] if args.slack == "none" else [float(s) for s in args.slack.split(",")]
    if args.known_only:
        rows, latencies = [], {m: known(m, args.db) for m in args.models}
    else:
        replayed = {m: replay(m, args.db, args.floors.split(","), slacks, args.jobs, ahead) for m in args.models}
        rows = [row for row, _ in replayed.values()]
        latencies = {m: latency for m, (_, latency) in replayed.items()}
    if args.export:
        from korch.cost.probe import cpu_record

        exported = {"probe": cpu_record(), "date": time.strftime("%Y-%m-%d"),
                    "latency_s": {m: {s: (v if math.isfinite(v) else None) for s, v in sorted(lat.items())}
                                  for m, lat in latencies.items()}}
        Path(args.export).write_text(json.dumps(exported, indent=0) + "\n")
    if args.out:
        from korch.bench import device_description
        from korch.runtime.bundle import versions

        result = {"benchmark": "measured share under floors of any tightness", "date": time.strftime("%Y-%m-%d"),
                  "measure_ahead": ahead,
                  "device": device_description("cpu"), "versions": versions(),
                  "command": "python benchmarks/floor_share.py " + " ".join(argv or sys.argv[1:]), "rows": rows}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
