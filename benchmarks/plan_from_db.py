"""``korch optimize`` over what a profile database already holds: the plan is the optimum over the measured
candidates only (nothing is built or timed; a candidate the database lacks cannot be chosen), solved to gap 0.

For a measured search stopped before its proof (YOLOX-Nano's layout program measures on for an hour): the
best plan its measurements can prove, built and checked as ``korch optimize`` builds any plan.

    python benchmarks/plan_from_db.py zoo:yolox_nano --target cpu --db DB -o OUTDIR

Every argument after the model goes to ``korch optimize`` (``--cost measured`` is added).
"""

from __future__ import annotations

import math
import sys

from korch.orchestrate import segments
from korch.orchestrate.lazy import LazyResult
from korch.orchestrate.solver import Solver


def measured_only(problem, bounds, oracle, *, measured=None, time_limit=None, first=None, **_):
    """``solve_lazily``'s signature, solving once with every unmeasured candidate left out."""
    costs = [(measured or {}).get(c, math.inf) for c in range(len(bounds))]
    solution = Solver(problem).solve(costs, time_limit=time_limit, first=first)
    print(f"optimum over the measured candidates: {solution.objective * 1e3:.2f} ms "
          f"({'proven' if solution.optimal else f'gap {solution.gap:.1%}'})", file=sys.stderr)
    return LazyResult(solution, {}, 1)


def main(argv: list[str]) -> int:
    from korch.cli import main as korch

    segments.solve_lazily = measured_only
    return korch(["optimize", *argv, "--cost", "measured"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
