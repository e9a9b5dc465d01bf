"""Where a measured search's time goes: the orchestration program's solves against the measuring.

Runs ``korch.optimize(MODEL, cost="measured")`` without building the executable, with the solver's
``solve`` and the measurer's ``measure`` wrapped to add up their seconds, and prints one JSON line: seconds
and count of each, every solve's (proving?, seconds), every measurement's (candidates asked, kernels built,
seconds), and the measurement stats of the plan.

    python benchmarks/search_time_split.py zoo:candy --db /tmp/candy.sqlite [--target cpu]

An empty ``--db`` measures from nothing; compiler caches stay as they are (say which in the record).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def main(argv=None) -> int:
    from korch.backends import measure
    from korch.orchestrate import solver
    from korch.pipeline import optimize

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--db", required=True)
    parser.add_argument("--target", default="cpu")
    args = parser.parse_args(argv)
    split = {"solve_s": 0.0, "solves": [], "measure_s": 0.0, "measure_calls": 0, "measures": []}
    solve, measure_ids = solver.Solver.solve, measure.KernelMeasurer.measure

    def timed_solve(self, *a, **k):
        start = time.perf_counter()
        try:
            return solve(self, *a, **k)
        finally:
            took = time.perf_counter() - start
            split["solve_s"] += took
            split["solves"].append((bool(k.get("prove", True)), round(took, 3)))

    def timed_measure(self, ids):
        start, built = time.perf_counter(), self.stats.measured
        try:
            return measure_ids(self, ids)
        finally:
            took = time.perf_counter() - start
            split["measure_s"] += took
            split["measure_calls"] += 1
            split["measures"].append((len(ids), self.stats.measured - built, round(took, 3)))

    solver.Solver.solve, measure.KernelMeasurer.measure = timed_solve, timed_measure
    start = time.perf_counter()
    result = optimize(args.model, target=args.target, cost="measured", db=args.db, output=None)
    split["search_s"] = time.perf_counter() - start
    split["measurement"] = result.plan.stats["measurement"]
    split["optimal"] = all(s.optimal for s in result.plan.segments)
    split["predicted_ms"] = result.plan.predicted_latency_s * 1e3
    from korch.runtime import bundle

    split.update(date=time.strftime("%Y-%m-%d"), versions=bundle.versions(),
                 command=" ".join(["python", "benchmarks/search_time_split.py", *sys.argv[1:]]))
    print(json.dumps(split, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
