"""Lazy measurement: time only the candidates an optimal plan could use.

Every candidate starts at its lower bound (``korch.cost``: no kernel can beat
it); measured candidates cost their measured latency. Solve, measure the
unmeasured kernels the plan selected, re-solve; stop when the plan selects only
measured kernels and is proven optimal (a round before may take the plan of
the relaxation's dive unproven: measuring what it selects is as good a next
step, and only the last round must prove the optimum; a proof that fails measures what the relaxation leaned on
first). That plan is optimal for the true latencies (the argument is
in docs/orchestration.md), usually after measuring a small part of the
candidates. The solver keeps its model and cuts between rounds.

With ``in_place`` a second tier prices the kernels as they run in sequence
(``backends/in_place.py``): a time alone is a floor of that price, so once a
plan selects only measured kernels, those not yet priced in place are run in
the plan's order and priced by what they took there, and the search goes on
until the plan selects only kernels priced in place (docs/orchestration.md,
"Priced in place").
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from korch.errors import KorchError
from korch.orchestrate.dominance import Replacements
from korch.orchestrate.problem import Problem
from korch.orchestrate.solver import InfeasibleError, Solution, Solver

# A measured latency may sit this far (relative) below its bound before the
# oracle counts as broken: float noise, not a faster kernel.
BOUND_TOLERANCE = 1e-9
# Seconds of branch and cut a proving round starts with, unlimited once its plan, all measured, stays unproven
# with nothing left to measure: a round whose plan is not the optimum stops early with a better plan to measure
# instead of proving first (YOLOX-Nano's measured layout program: 20 minutes of branch and cut in one round
# before this); doubled instead, EfficientViT's proofs priced in place took 580 s of solving, 254 s unlimited
PROOF_BUDGET_S = 10.0
# A measured plan within this (relative) of the lower bound is proven optimal (the solver's tolerance)
PROVEN_TOLERANCE = 1e-7
# Seconds a solve gets when the search's time limit has passed: enough for the dive to return a plan
MIN_SOLVE_S = 0.5
# Seconds of the last solve of a search its time limit ends: the cheapest plan of measured kernels alone
MEASURED_ONLY_S = 5.0
# Sequences at most that price plans in place once a search's time limit has ended its pricing in place
# (``_priced_in_place_at_the_end``): each is a few seconds to tens of seconds past the limit
END_SEQUENCES = 3


class OracleError(KorchError):
    """A cost oracle broke the promise lazy measurement relies on."""


class CostOracle(Protocol):
    def measure(self, candidate_ids: Sequence[int]) -> Mapping[int, float]:
        """Seconds per candidate; ``math.inf`` for one that failed to build or check. It may answer for more
        candidates than asked (those that are the same kernel): they count as measured too."""
        ...


@dataclass(frozen=True)
class LazyResult:
    solution: Solution
    measured: dict[int, float]   # what this call measured through the oracle (not the ``measured`` passed in)
    rounds: int                  # solves
    solve_s: float = 0.0         # seconds in them
    proofs: int = 0              # of them, rounds of branch and cut (the rest: the relaxation's dive)
    dominated: int = 0           # columns the last solve left out: measured columns replace them (dominance.py)
    placed: dict[int, float] = dataclasses.field(default_factory=dict)  # latencies in place (``in_place``)
    sequences: int = 0           # calls of ``in_place``


def solve_lazily(problem: Problem, bounds: Sequence[float], oracle: CostOracle, *,
                 measured: Mapping[int, float] | None = None, time_limit: float | None = None,
                 first: Sequence[bool] | None = None,
                 on_round: Callable[[int, int], None] | None = None,
                 in_place: Callable[[Sequence[int]], Mapping[int, float]] | None = None,
                 placed: Mapping[int, float] | None = None, measure_ahead: int = 0) -> LazyResult:
    """The cheapest executable plan under measured latencies, measuring as few candidates as it can.

    ``problem.costs`` is ignored: a candidate costs ``measured[c]`` when known
    (passed in, say from a database, or measured by an earlier round) and
    ``bounds[c]`` otherwise. A latency of ``math.inf`` excludes the candidate.
    ``first``: the columns whose optimum starts the first solve (``Solver.solve``).
    ``time_limit``: seconds for the whole search, measurements included. Once
    it has passed, no new round starts: the result is the cheapest plan of
    measured kernels (one more solve, over them alone, ``MEASURED_ONLY_S``
    at most; else the cheapest of the rounds' plans), flagged not optimal, its
    gap taken against the highest lower bound a round proved (valid for the
    true latencies: no unmeasured kernel beats its bound).
    A proving round runs branch and cut for ``PROOF_BUDGET_S`` at first, with no
    limit once its plan stays unproven with nothing left to measure, so that a plan that is not optimal
    gives way to a better one (measured next) before any proof completes.
    ``on_round(round, count)`` is called before each round's measurement with
    the number of candidates about to be measured.
    ``in_place(order)``: latencies of a plan's kernels (in its order) as they run
    in sequence; a plan whose kernels are all measured has those not yet priced
    so priced (each keeps its first such price), and only a plan of kernels all
    priced in place is proven and returned. An empty answer (the sequence did not
    run), or the time limit passing, leaves the times alone in force from then on; the plan the time limit ends
    with then has its kernels not yet priced in place run in sequence, and so do the optima over the measured
    kernels at the prices found so (``END_SEQUENCES`` sequences at most): the cheapest in place answers, its
    objective its price there (its gap grows to match).
    ``placed``: prices in place an earlier search found (``InPlaceTimer.known``), with ``in_place``: those of
    kernels measured here (in ``measured``) stand as if a sequence of this search had found them.
    ``measure_ahead``: unmeasured columns a round measures beside its plan's, at most: those that the root relaxation's
    reduced costs leave in reach of a plan cheaper than the cheapest measured one (``Solver.could_improve``),
    least reduced cost first, and no more than the time limit leaves room for at the slowest pace measured (once
    a plan of measured kernels is in hand, a round measures no more than that room, its plan's kernels first).
    Fewer rounds, more measurements (docs/orchestration.md, "Measuring ahead").
    """
    if len(bounds) != len(problem.costs):
        raise ValueError(f"{len(bounds)} bounds for {len(problem.costs)} candidates")
    for c, bound in enumerate(bounds):
        if not bound >= 0:
            raise ValueError(f"candidate {c} has lower bound {bound}: bounds must be >= 0")
    known = {c: float(v) for c, v in (measured or {}).items()}
    fresh: dict[int, float] = {}
    earlier = {c: v for c, v in (placed or {}).items() if c in known} if in_place is not None else {}
    placed = {}
    _place(list(earlier), earlier, bounds, known, placed)  # as if a sequence here had priced them
    sequences = 0

    def final(c: int) -> bool:  # priced for good: measured, and in place where kernels are priced so
        return c in known and (in_place is None or c in placed)

    sequence = in_place  # kept past the time limit, which ends ``in_place``: the last plans are still priced

    def result(plan: Solution, extra_s: float = 0.0) -> LazyResult:
        """The search's answer: ``plan``, or where the time limit ended the pricing in place before its kernels
        were, the cheapest in place of the plans ``_priced_in_place_at_the_end`` runs in sequence."""
        nonlocal sequences
        if sequence is not None and any(c not in placed for c in plan.order):
            plan, ran, seconds = _priced_in_place_at_the_end(solver, plan, sequence, known, placed, bounds, lower)
            sequences, extra_s = sequences + ran, extra_s + seconds
        return LazyResult(plan, fresh, rounds, solve_s + extra_s, proofs, len(left_out), placed, sequences)

    solver, replacements = Solver(problem), Replacements(problem)
    rounds, quick, budget, solve_s, proofs = 0, True, PROOF_BUDGET_S, 0.0, 0
    deadline = math.inf if time_limit is None else time.perf_counter() + time_limit
    lower, cheapest = 0.0, None  # the highest lower bound proved, the cheapest plan whose kernels are all measured
    per_column = 0.0  # the most seconds an oracle call took per column asked (its twins and database answers are
    # quick, building a large kernel is not: the slowest pace is the one a limited search can rely on)
    while True:
        costs = [known.get(c, bound) for c, bound in enumerate(bounds)]
        # measured kernels replace them: no optimum needs them (only kernels priced for good replace: a time alone
        # may rise in place)
        left_out = replacements.dominated(costs, known if in_place is None else placed)
        for c in left_out:
            costs[c] = math.inf
        # only the last round, whose plan is all measured, must prove its optimum; rounds before only choose what
        # to measure next, and the relaxation's dive chooses as well (Candy's layout program: 11 s a round to
        # prove, 0.2 s to dive)
        left = max(deadline - time.perf_counter(), MIN_SOLVE_S)
        flagged = [not final(c) for c in range(len(bounds))]
        # a proof with no price left to change runs to its end: stopped at its budget it would only start again
        # from scratch (Candy, every kernel measured: 9, 20 and 39 s of branch and cut, the last alone proving)
        open_prices = any(f and math.isfinite(cost) for f, cost in zip(flagged, costs))
        limit = left if quick or not open_prices else min(budget, left)
        # a proving round stops at a better plan that selects unmeasured kernels: measuring them comes first
        # (Candy's layout program: rounds of branch and cut were most of a 10-minute search)
        solution = solver.solve(costs, time_limit=None if math.isinf(limit) else limit, first=first,
                                prove=not quick, stop_for=None if quick else flagged)
        rounds, solve_s, proofs = rounds + 1, solve_s + solution.seconds, proofs + (not quick)
        lower = max(lower, solution.objective * (1 - solution.gap))
        todo = [c for c in solution.order if c not in known]
        unplaced = [c for c in solution.order if not final(c)]
        if not todo and unplaced:  # all measured alone: price them in place, then choose again
            timed = in_place(solution.order) if time.perf_counter() < deadline else {}
            sequences += bool(timed)
            if not timed:  # the sequence did not run, or the time is up: times alone stand from here on
                in_place = None
                if time.perf_counter() < deadline:  # it cannot run: not at the end either
                    sequence = None
            else:
                _place(unplaced, timed, bounds, known, placed)
                cheapest = _cheaper_priced(solution, known, cheapest, lower)
            quick = True
            continue
        if todo and not quick:  # a proof stopped at cheaper plans: measure every one's unmeasured kernels
            planned = set(todo)
            todo += [c for c in solver.flagged_seen if c not in known and c not in planned]
        # the columns the time left holds, at the slowest pace measured
        fit = int(max(deadline - time.perf_counter(), 0.0) / per_column) if per_column and math.isfinite(deadline) \
            else math.inf
        if cheapest is not None and fit < len(todo):  # a measured plan in hand answers once the time is up:
            todo = todo[:max(fit, 1)]                 # measure no more than the time holds, the plan's kernels first
        if todo and measure_ahead and cheapest is not None:  # and columns a plan cheaper than the best measured may select
            planned, room = set(todo), min(measure_ahead, fit - len(todo))
            if room > 0:
                todo += [c for c in solver.could_improve(cheapest.objective) if c not in known and c not in planned
                         ][:room]
        if not todo:
            if solution.optimal:
                return result(_cheaper(solution, cheapest, lower))
            if time.perf_counter() >= deadline:
                plan = _cheaper(solution, cheapest, lower)
                return result(*_best_measured(solver, known, len(bounds), plan, lower))
            # all measured, unproven: the relaxation's unmeasured columns hold its bound down at their floors;
            # measured, they raise it toward the plan, which branch and cut then proves sooner
            todo = [] if quick else [c for c in solver.relaxed if c not in known]
            if not todo:
                if not quick:  # nothing left to measure there: the next proof runs to its end (or to a cheaper
                    budget = math.inf  # plan to measure or price): cut short again, it would only start again
                quick = False  # a dive's plan, all measured but unproven: the next round proves it or measures more
                continue
        quick = True
        if on_round is not None:
            on_round(rounds, len(todo))
        started = time.perf_counter()
        answers = oracle.measure(todo)
        per_column = max(per_column, (time.perf_counter() - started) / len(todo))
        for c in todo:
            if c not in answers:
                raise OracleError(f"the cost oracle returned no latency for candidate {c}")
        for c, latency in answers.items():
            fresh[c] = _checked(c, latency, bounds)
            if c not in placed:  # a twin priced in place keeps that price
                known[c] = fresh[c]
        if time.perf_counter() >= deadline:  # the time is up: times alone stand, so that this plan answers
            in_place = None                    # (a sequence would run past the limit, and its plan's successor)
        if all(final(c) for c in solution.order):
            cheapest = _cheaper_priced(solution, known, cheapest, lower)
        if cheapest is not None and time.perf_counter() >= deadline:
            return result(*_best_measured(solver, known, len(bounds), _cheaper(cheapest, None, lower), lower))


def _priced_in_place_at_the_end(solver: Solver, plan: Solution, sequence: Callable, known: dict[int, float],
                                 placed: dict[int, float], bounds: Sequence[float], lower: float) \
        -> tuple[Solution, int, float]:
    """(the cheapest plan priced in place, sequences run, seconds solving) of a search whose time limit ended its
    pricing in place: ``plan``'s kernels not yet priced in place run in sequence, the optimum over the measured
    kernels at their prices now (in place where they ran) is priced so in turn, ``END_SEQUENCES`` at most, until
    an optimum is priced in place already. Times alone are floors of times in place, so a plan chosen by them
    can run far slower than they say (EfficientViT's: 1195 ms in place, its executable 1033 ms, where an earlier
    search's plan ran in 805); its prediction is its price in place, and its gap grows to match."""
    best, ran, seconds = None, 0, 0.0
    for turn in range(END_SEQUENCES):
        if turn:  # the optimum over the measured kernels at their prices now
            again = _measured_optimum(solver, known, len(bounds))
            if again is None:
                break
            seconds, plan = seconds + again.seconds, again
        unplaced = [c for c in plan.order if c not in placed]
        if unplaced:
            timed = sequence(plan.order)
            if not timed:  # it cannot run: the plans priced so far answer, or this one at its times alone
                break
            ran += 1
            _place(unplaced, timed, bounds, known, placed)
        priced = _priced(plan, known)
        best = priced if best is None or priced.objective < best.objective else best
        if not unplaced:  # the optimum at these prices is priced in place: no plan of measured kernels beats it
            break
    return _cheaper(best or _priced(plan, known), None, lower), ran, seconds


def _best_measured(solver: Solver, known: Mapping[int, float], n: int, cheapest: Solution, lower: float) \
        -> tuple[Solution, float]:
    """(the cheaper of ``cheapest`` and the optimum over the measured candidates alone, seconds solving): at most
    ``MEASURED_ONLY_S``: a search its time limit ends has measured far more kernels than its rounds' plans
    used (EfficientViT's, stopped after 45 minutes: its rounds' best plan summed 1468 ms, its roofline plan's
    kernels, all measured, 1351 ms)."""
    if cheapest.optimal:
        return cheapest, 0.0
    solution = _measured_optimum(solver, known, n)
    if solution is None:
        return cheapest, 0.0
    return _cheaper(_priced(solution, known), cheapest, lower), solution.seconds


def _measured_optimum(solver: Solver, known: Mapping[int, float], n: int) -> Solution | None:
    """The optimum over the measured candidates at their prices in ``known`` (``MEASURED_ONLY_S`` of solving at
    most), or None where they cover no plan."""
    try:
        return solver.solve([known.get(c, math.inf) for c in range(n)], time_limit=MEASURED_ONLY_S)
    except InfeasibleError:
        return None


def _place(unplaced: Sequence[int], timed: Mapping[int, float], bounds: Sequence[float], known: dict[int, float],
           placed: dict[int, float]) -> None:
    """Records the prices in place a sequence ``timed`` for the kernels ``unplaced`` (never below a bound)."""
    for c in unplaced:
        known[c] = placed[c] = max(float(timed[c]), bounds[c])


def _cheaper_priced(solution: Solution, known: Mapping[int, float], cheapest: Solution | None, lower: float) \
        -> Solution | None:
    """The cheaper of ``cheapest`` and ``solution`` at its measured latencies (when they are finite)."""
    priced = _priced(solution, known)
    return _cheaper(priced, cheapest, lower) if math.isfinite(priced.objective) else cheapest


def _priced(solution: Solution, known: Mapping[int, float]) -> Solution:
    """``solution``'s plan at its measured latencies (every kernel of it measured), its optimality unknown."""
    return dataclasses.replace(solution, objective=math.fsum(known[c] for c in solution.order), optimal=False)


def _cheaper(plan: Solution, other: Solution | None, lower: float) -> Solution:
    """The cheaper of two measured plans, its gap against ``lower`` (a proven optimum keeps gap 0)."""
    best = plan if other is None or plan.objective <= other.objective else other
    if best.optimal:
        return best
    gap = 0.0 if best.objective <= lower * (1 + PROVEN_TOLERANCE) else (best.objective - lower) / best.objective
    return dataclasses.replace(best, gap=gap, optimal=gap == 0.0)


def _checked(c: int, latency: float, bounds: Sequence[float]) -> float:
    """The latency, if it can be true: a number, not below the candidate's lower bound."""
    if not 0 <= c < len(bounds):
        raise OracleError(f"the cost oracle returned a latency for candidate {c}, which does not exist")
    latency = float(latency)
    if math.isnan(latency) or latency < 0:
        raise OracleError(f"the cost oracle returned latency {latency} for candidate {c}")
    if latency < bounds[c] * (1 - BOUND_TOLERANCE):
        raise OracleError(
            f"candidate {c} measured {latency:.4g} s, below its lower bound {bounds[c]:.4g} s: the bound "
            "(or the measurement) is wrong for this device, and a plan chosen with it may not be optimal")
    return latency
