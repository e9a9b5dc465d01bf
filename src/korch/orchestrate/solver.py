"""Kernel orchestration as a binary linear program, solved to a proven optimum with HiGHS.

A pure function of a ``Problem`` (costs, and which tensor ids each candidate
needs and produces): no IR, no device. ``solve`` picks the cheapest set of
candidate kernels that computes every required tensor and can run in some
order, and returns that order. The paper's program is strengthened with
cut-set rows (its LP relaxation is otherwise far from integral), and
multi-output candidates that would feed each other in a cycle are cut off
lazily. Each solve first dives on the LP relaxation and runs branch and cut
only when the dive does not reach the relaxation's bound.
docs/orchestration.md states the program and why every cut is valid.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np

from korch.errors import KorchError
from korch.orchestrate.problem import Problem
from korch.orchestrate.schedule import Index, Row, cutset_rows, stuck_rows

# Seconds branch and cut goes on after the first cheaper plan with a flagged column (``stop_for``): the plans
# it meets meanwhile name more columns to measure in the same round
STOP_AFTER_S = 1.0
# A selection variable counts as chosen above this value (HiGHS returns
# integral values up to its feasibility tolerance).
_CHOSEN = 0.5
# An LP value this close to 0 or 1 counts as integral.
_INTEGRAL = 1e-6
# Relative tolerance of "the plan's cost equals the lower bound": HiGHS's LP
# bounds are exact up to its feasibility tolerances (about 1e-9 relative here).
_TOLERANCE = 1e-7


class InfeasibleError(KorchError, ValueError):
    """No set of candidates computes every required tensor in an executable order."""


@dataclass(frozen=True)
class Solution:
    order: tuple[int, ...]      # selected candidate ids in an executable order
    objective: float            # sum of the selected candidates' costs
    optimal: bool               # proven optimal (gap 0)
    gap: float                  # (objective - best lower bound) / objective; 0 when optimal
    seconds: float
    cycle_cuts: int             # lazy cycle-breaking constraints added


def solve(problem: Problem, *, time_limit: float | None = None, first: Sequence[bool] | None = None) -> Solution:
    """The cheapest executable orchestration of ``problem``.

    With ``time_limit`` (seconds of wall time for the whole call), returns the
    best executable plan found by then, ``optimal=False`` and its gap if the
    optimum is not proven. Raises ``InfeasibleError`` when no plan exists.
    ``first``: see ``Solver.solve``.
    """
    start = time.perf_counter()
    solver = Solver(problem)
    if time_limit is not None:
        time_limit = max(0.0, time_limit - (time.perf_counter() - start))
    solution = solver.solve(time_limit=time_limit, first=first)
    return dataclasses.replace(solution, seconds=time.perf_counter() - start)


class Solver:
    """One HiGHS model of a problem, re-solvable with other costs.

    Cuts do not depend on costs, so they are kept across ``solve`` calls (the lazy
    measurement loop re-solves many times with refined costs). ``cutsets=False``
    leaves the cut-set rows out of the model, so that only the lazy cuts keep plans
    executable (slower; for tests of the lazy loop).
    """

    def __init__(self, problem: Problem, *, cutsets: bool = True):
        self.problem = problem
        self.ix = ix = Index(problem)
        self.cycle_cuts = 0
        self.last: list[int] = []  # the plan of the previous solve
        self.relaxed: tuple[int, ...] = ()  # the columns the last root relaxation set above 0
        self.root_bound = 0.0  # the last root relaxation's objective (at the costs solved with)
        self.reduced: np.ndarray | None = None  # and its columns' reduced costs (at those costs), None when dead
        self.flagged_seen: list[int] = []  # the flagged columns of the cheaper plans the last stopped proof met
        order, _, tlevel = ix.run([True] * ix.n)
        reason = ix.infeasible([True] * ix.n, tlevel)
        if reason:
            raise InfeasibleError(reason)
        # candidates that can run with everything selected: the rest are fixed to 0 forever
        self.structural = ix.relevant(ix.mask(order))
        self.h, self.upper = _build_model(ix, self.structural, cutsets)

    def solve(self, costs=None, *, time_limit: float | None = None, first: Sequence[bool] | None = None,
              prove: bool = True, stop_for: Sequence[bool] | None = None) -> Solution:
        """The cheapest executable plan under ``costs`` (default: the problem's). ``prove=False``: the plan of the
        relaxation's dive, without branch and cut to prove it (optimal only if the dive reached the bound).
        ``stop_for``: columns whose costs are stand-ins (lazy measurement's floors); branch and cut stops
        ``STOP_AFTER_S`` after the first better executable plan that selects one of them, unproven, so that it
        is measured before any proof is tried; ``flagged_seen`` then lists those columns of every better plan
        it met.
        ``first``: the columns of a
        smaller program solved before, when this solver has no plan yet, whose optimum starts the search (a
        program with layout columns starts from its contiguous kernels: their optimum is often the whole
        program's, and proving it then takes one relaxation)."""
        start = time.perf_counter()
        deadline = math.inf if time_limit is None else start + time_limit
        self.flagged_seen = []
        costs = list(self.problem.costs if costs is None else costs)
        if len(costs) != self.ix.n or any(not c >= 0 for c in costs):
            raise ValueError("costs must be one value >= 0 per candidate")
        if first is not None and not self.last:
            # the smaller program is proven only when this solve proves: a quick solve's start needs no proof
            self.solve([c if keep else math.inf for c, keep in zip(costs, first)], time_limit=time_limit, prove=prove)
        ix, h = self.ix, self.h
        allowed = [s and math.isfinite(c) for s, c in zip(self.structural, costs)]
        order, level, tlevel = ix.run(allowed)
        reason = ix.infeasible(allowed, tlevel)
        if reason:
            raise InfeasibleError(reason)
        alive = ix.relevant(ix.mask(order))
        self.scale = _scale(costs, alive)
        cols = np.arange(ix.n, dtype=np.int32)
        h.changeColsBounds(ix.n, cols, np.zeros(ix.n), np.array(alive, dtype=float))
        h.changeColsCost(ix.n, cols, np.array([c * self.scale if a else 0.0 for c, a in zip(costs, alive)]))

        def value(plan):
            return math.fsum(costs[c] for c in plan)

        best = ix.complete([], level, costs, set())
        if self.last and all(allowed[c] for c in self.last):  # the previous plan still runs
            best = min(best, self.last, key=value)
        lower, proven = 0.0, False
        while not proven and time.perf_counter() < deadline:
            x, bound, exact = self._dive(alive, deadline, value(best))
            lower = max(lower, bound)
            if value(best) <= lower * (1 + _TOLERANCE):  # the plan in hand costs the relaxation's bound
                proven = True
                break
            if not exact:
                if x is not None:  # a good start for branch and cut
                    chosen = [c for c in range(ix.n) if alive[c] and x[c] > _CHOSEN]
                    best = min(best, ix.repair(chosen, allowed, level, costs), key=value)
                if not prove:
                    break
                watch = _StopFor(ix, stop_for, costs, value(best)) if stop_for is not None and any(stop_for) \
                    else None
                x, bound, exact = self._mip(best, deadline, watch)
                self.flagged_seen = sorted(watch.seen) if watch is not None else []
                lower = max(lower, bound)
            if x is None:
                break
            chosen = [c for c in range(ix.n) if alive[c] and x[c] > _CHOSEN]
            ran, _, avail = ix.run(ix.mask(chosen))
            if all(avail[t] >= 0 for t in ix.required):  # stuck kernels, if any, are not needed
                best = min(best, ix.prune(ran), key=value)
                proven = exact or value(best) <= lower * (1 + _TOLERANCE)
            else:
                self._cut(sorted(set(chosen) - set(ran)), avail)
                best = min(best, ix.repair(chosen, allowed, level, costs), key=value)
            if not exact:
                break  # HiGHS stopped at the time limit
        best = ix.drop_redundant(best, costs)  # an unproven plan may compute a value twice
        self.last = best
        objective = value(best)
        proven = proven or objective <= lower * (1 + _TOLERANCE)
        gap = 0.0 if proven else (objective - lower) / objective
        return Solution(tuple(best), objective, proven, gap, time.perf_counter() - start, self.cycle_cuts)

    def _dive(self, alive: list[bool], deadline: float, incumbent: float = math.inf) \
            -> tuple[np.ndarray | None, float, bool]:
        """Solve the LP relaxation, then fix its largest fractional x to 1 and re-solve until
        the solution is integral (the relaxation often has many optimal vertices, most of
        them fractional, and branch and cut can take long to pick an integral one). One x at
        a time also once the objective rises above the relaxation's: each re-solve starts from
        the last basis (about 10 ms), and a coarser dive hands branch and cut a poor plan to
        start from (``zoo:hf_phi`` for an H100: fixing a quarter of the fractional x at a time
        ended 59% above the optimum and branch and cut took 110 s; one at a time, 3% above
        and 16 s). No dive when a plan costing ``incumbent`` meets the relaxation's
        bound already.

        Returns (x or None, the relaxation's bound, whether x costs no more than that bound).
        """
        h, n = self.h, self.ix.n
        cols = np.arange(n, dtype=np.int32)
        h.changeColsIntegrality(n, cols, np.zeros(n, dtype=np.uint8))
        root, x = None, None
        try:
            while time.perf_counter() < deadline:
                h.setOptionValue("time_limit", max(0.0, deadline - time.perf_counter()))
                h.run()
                if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                    x = None
                    break
                objective = h.getInfo().objective_function_value
                x = np.array(h.getSolution().col_value[:n])
                if root is None:
                    self.relaxed = tuple(int(c) for c in np.flatnonzero(x > _INTEGRAL))
                    reduced = np.array(h.getSolution().col_dual[:n]) / self.scale
                    self.root_bound, self.reduced = objective / self.scale, np.where(alive, reduced, np.nan)
                    if incumbent * self.scale <= objective * (1 + _TOLERANCE):
                        return None, objective / self.scale, False
                root = objective if root is None else root
                exact = objective <= root + _TOLERANCE * abs(root)
                frac = np.flatnonzero((x > _INTEGRAL) & (x < 1 - _INTEGRAL))
                if not len(frac):
                    break
                h.changeColBounds(int(frac[np.argmax(x[frac])]), 1.0, 1.0)
            else:
                x = None
            bound = 0.0 if root is None else root / self.scale
            return x, bound, x is not None and exact
        finally:
            h.changeColsBounds(n, cols, np.zeros(n), np.array(alive, dtype=float))
            h.changeColsIntegrality(n, cols, np.ones(n, dtype=np.uint8))

    def could_improve(self, upper: float) -> list[int]:
        """The columns some plan cheaper than ``upper`` may select by the last root relaxation, least reduced
        cost first: a plan that selects column j costs at least the relaxation's bound plus j's reduced cost
        (reduced-cost fixing), so no such plan selects the others."""
        if self.reduced is None:
            return []
        room = (upper - self.root_bound) * (1 + _TOLERANCE)
        inside = np.flatnonzero(self.reduced <= room)
        return [int(c) for c in inside[np.argsort(self.reduced[inside], kind="stable")]]

    def _mip(self, best: list[int], deadline: float, watch: "_StopFor | None" = None) \
            -> tuple[list[float] | None, float, bool]:
        """Branch and cut from the executable plan ``best``: (x or None, lower bound, proven optimal); ``watch``
        may stop it early."""
        h = self.h
        h.setOptionValue("time_limit", max(0.0, deadline - time.perf_counter()))
        _hint(h, self.ix, self.upper, best)
        # highspy's callback events are recent (1.15 has them); without them branch and cut runs to its end
        watch = watch if hasattr(h, "cbMipImprovingSolution") else None
        if watch is not None:
            h.cbMipImprovingSolution.subscribe(watch.on_improving)
            h.cbMipInterrupt.subscribe(watch.on_interrupt)
        try:
            h.run()
        finally:
            if watch is not None:
                h.cbMipImprovingSolution.unsubscribe(watch.on_improving)
                h.cbMipInterrupt.unsubscribe(watch.on_interrupt)
        status, info = h.getModelStatus(), h.getInfo()
        if status != highspy.HighsModelStatus.kOptimal and status not in _STOPPED:
            raise RuntimeError(f"HiGHS failed on an orchestration problem: {h.modelStatusToString(status)}")
        bound = info.mip_dual_bound / self.scale if math.isfinite(info.mip_dual_bound) else 0.0
        x = h.getSolution().col_value if info.primal_solution_status == 2 else None
        return x, bound, status == highspy.HighsModelStatus.kOptimal

    def _cut(self, stuck: list[int], avail: list[int]) -> None:
        """Cut off a selection whose kernels ``stuck`` wait on each other (``stuck_rows``)."""
        rows = stuck_rows(self.ix, self.structural, stuck, avail)
        _add_rows(self.h, rows)
        self.cycle_cuts += len(rows)


class _StopFor:
    """HiGHS callbacks that stop branch and cut once it holds an executable plan cheaper than ``incumbent`` that
    selects a flagged column: ``solve`` returns that plan, so each stop leads to a new measurement (HiGHS
    honours a stop only in its interrupt callback, so the improving-solution callback raises a flag)."""

    def __init__(self, ix: Index, flagged: Sequence[bool], costs: Sequence[float], incumbent: float):
        self.ix, self.flagged, self.costs, self.incumbent = ix, np.asarray(flagged, dtype=bool), costs, incumbent
        self.found_at: float | None = None  # when the first cheaper plan with a flagged column came
        self.seen: set[int] = set()         # the flagged columns of every such plan

    def on_improving(self, event) -> None:
        x = np.asarray(event.data_out.mip_solution[:self.ix.n])
        chosen = np.flatnonzero(x > _CHOSEN)
        if not self.flagged[chosen].any():
            return
        ran, _, avail = self.ix.run(self.ix.mask(chosen.tolist()))
        if not all(avail[t] >= 0 for t in self.ix.required):
            return  # its kernels wait on each other: solve would repair it, perhaps without the flagged columns
        plan = self.ix.prune(ran)
        cheaper = math.fsum(self.costs[c] for c in plan) < self.incumbent * (1 - _TOLERANCE)
        if cheaper and self.flagged[plan].any():
            self.seen.update(c for c in plan if self.flagged[c])
            if self.found_at is None:
                self.found_at = time.perf_counter()

    def on_interrupt(self, event) -> None:
        # explicitly either way: HiGHS keeps the flag of its last run's stop
        event.interrupt(self.found_at is not None and time.perf_counter() - self.found_at >= STOP_AFTER_S)


_STOPPED = {getattr(highspy.HighsModelStatus, s) for s in (
    "kTimeLimit", "kInterrupt", "kIterationLimit", "kSolutionLimit", "kObjectiveBound",
    "kObjectiveTarget", "kMemoryLimit")}


def _scale(costs, alive) -> float:
    """A factor bringing the mean live cost to 1: HiGHS's tolerances are absolute."""
    live = [c for c, a in zip(costs, alive) if a and c > 0]
    return len(live) / math.fsum(live) if live else 1.0


def _add_rows(h: highspy.Highs, rows: list[Row]) -> None:
    """Add rows given as (columns, coefficients, lower, upper), in one call."""
    lengths = np.array([len(r[0]) for r in rows], dtype=np.int64)
    nnz = int(lengths.sum())
    starts = (np.cumsum(lengths) - lengths).astype(np.int32)
    index = np.fromiter((i for r in rows for i in r[0]), dtype=np.int32, count=nnz)
    values = np.fromiter((v for r in rows for v in r[1]), dtype=np.float64, count=nnz)
    h.addRows(len(rows), np.array([r[2] for r in rows], dtype=np.float64),
              np.array([r[3] for r in rows], dtype=np.float64), nnz, starts, index, values)


def _build_model(ix: Index, live: list[bool], cutsets: bool) -> tuple[highspy.Highs, np.ndarray]:
    """The program of docs/orchestration.md; returns the model and its columns' upper bounds.

    Columns: x_c per candidate (binary), then y_t per tensor (in [0, 1]: "a selected
    kernel writes t"). Rows: x_c <= y_t for t in needs[c]; y_t <= the sum of x over
    t's producers; y_t = 1 for required t; then the cut-set rows of ``cutset_rows``.
    """
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    # HiGHS's presolve made branch and cut 3x slower on Candy's measured layout program (2972 columns: the proof
    # of its optimum took 150 s and more with presolve, 49-60 s without, in four runs; Segformer-B0's first
    # program 6.7 s either way; the zoo's roofline programs as fast)
    h.setOptionValue("presolve", "off")
    n, nt = ix.n, ix.nt
    used = np.zeros(nt, dtype=bool)
    used[ix.required] = True
    rows = []
    for c in range(n):
        for t in ix.needs[c] if live[c] else ():
            used[t] = True
            if t in ix.prods[c]:  # c writes a tensor it reads: the other producers must supply it
                others = [p for p in ix.producers[t] if live[p] and p != c]
                rows.append(([c, *others], [1.0] + [-1.0] * len(others), -math.inf, 0.0))
            else:
                rows.append(([c, n + t], [1.0, -1.0], -math.inf, 0.0))
    for t in np.flatnonzero(used):
        producers = [p for p in ix.producers[t] if live[p]]
        rows.append(([n + t, *producers], [1.0] + [-1.0] * len(producers), -math.inf, 0.0))
    rows += cutset_rows(ix, live) if cutsets else []
    upper = np.concatenate([np.array(live, dtype=float), used.astype(float)])
    lower = np.zeros(n + nt)
    lower[[n + t for t in ix.required]] = 1.0
    h.addCols(n + nt, np.zeros(n + nt), lower, upper, 0, np.zeros(0, np.int32),
              np.zeros(0, np.int32), np.zeros(0))
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.ones(n, dtype=np.uint8))
    _add_rows(h, rows)
    return h, upper


def _hint(h: highspy.Highs, ix: Index, upper: np.ndarray, plan: list[int]) -> None:
    """Give HiGHS an executable plan as its starting incumbent (it satisfies every row and cut)."""
    x = np.zeros(ix.n + ix.nt)
    x[plan] = 1.0
    for c in plan:
        x[[ix.n + t for t in ix.prods[c]]] = 1.0
    sol = highspy.HighsSolution()
    sol.col_value = list(np.minimum(x, upper))
    sol.value_valid = True
    h.setSolution(sol)


