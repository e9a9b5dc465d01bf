"""Kernel orchestration as a binary linear program, solved to a proven optimum with HiGHS.

A pure function of a ``Problem`` (costs, and which tensor ids each candidate
needs and produces): no IR, no device. ``solve`` picks the cheapest set of
candidate kernels that computes every required tensor and can run in some
order, and returns that order. Multi-output candidates can need each other's
outputs in a cycle the program itself allows; such selections are cut off
lazily, one strongly connected stuck set at a time. docs/orchestration.md
states the program, the cuts and why they are valid.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass

import highspy
import numpy as np

from korch.errors import KorchError

# A selection variable counts as chosen above this value (HiGHS returns
# integral values up to its feasibility tolerance).
_CHOSEN = 0.5


class InfeasibleError(KorchError, ValueError):
    """No set of candidates computes every required tensor in an executable order."""


@dataclass(frozen=True)
class Problem:
    """The program's data. Tensor ids are arbitrary ints; given tensors (graph inputs,
    constants) appear in no ``needs``. A cost of ``math.inf`` excludes a candidate."""

    costs: tuple[float, ...]
    needs: tuple[tuple[int, ...], ...]
    produces: tuple[tuple[int, ...], ...]
    required: tuple[int, ...]

    def __post_init__(self):
        n = len(self.costs)
        if len(self.needs) != n or len(self.produces) != n:
            raise ValueError(f"problem has {n} costs, {len(self.needs)} needs and "
                             f"{len(self.produces)} produces: one of each per candidate")
        for c, cost in enumerate(self.costs):
            if not cost >= 0:  # also catches NaN
                raise ValueError(f"candidate {c} has cost {cost}: costs must be >= 0 "
                                 "(math.inf excludes a candidate)")


@dataclass(frozen=True)
class Solution:
    order: tuple[int, ...]      # selected candidate ids in an executable order
    objective: float            # sum of the selected candidates' costs
    optimal: bool               # proven optimal (gap 0)
    gap: float                  # (objective - best lower bound) / objective; 0 when optimal
    seconds: float
    cycle_cuts: int             # lazy cycle-breaking constraints added


def solve(problem: Problem, *, time_limit: float | None = None) -> Solution:
    """The cheapest executable orchestration of ``problem``.

    With ``time_limit`` (seconds of wall time for the whole call), returns the
    best executable plan found by then, ``optimal=False`` and its gap if the
    optimum is not proven. Raises ``InfeasibleError`` when no plan exists.
    """
    start = time.perf_counter()
    solver = Solver(problem)
    if time_limit is not None:
        time_limit = max(0.0, time_limit - (time.perf_counter() - start))
    solution = solver.solve(time_limit=time_limit)
    return dataclasses.replace(solution, seconds=time.perf_counter() - start)


class _Index:
    """The problem with tensor ids made dense and both directions of every edge listed."""

    def __init__(self, problem: Problem):
        ids = sorted({t for ts in (*problem.needs, *problem.produces, problem.required) for t in ts})
        dense = {t: i for i, t in enumerate(ids)}
        self.tensor_ids = ids
        self.n, self.nt = len(problem.costs), len(ids)
        self.needs = [list(dict.fromkeys(dense[t] for t in ts)) for ts in problem.needs]
        self.prods = [list(dict.fromkeys(dense[t] for t in ts)) for ts in problem.produces]
        self.required = list(dict.fromkeys(dense[t] for t in problem.required))
        self.producers: list[list[int]] = [[] for _ in ids]
        self.consumers: list[list[int]] = [[] for _ in ids]
        for c in range(self.n):
            for t in self.prods[c]:
                self.producers[t].append(c)
            for t in self.needs[c]:
                self.consumers[t].append(c)

    def run(self, allowed) -> tuple[list[int], list[int], list[int]]:
        """Greedy execution of the allowed candidates (any whose needs are available runs).

        Returns the order they ran in, each candidate's level (-1: never ran) and
        each tensor's level (-1: never produced). Runs breadth first, so a
        candidate's level is one more than the highest level of its needs, and the
        first producer of a tensor to run has the lowest level among its producers.
        """
        missing = [len(self.needs[c]) if allowed[c] else -1 for c in range(self.n)]
        level = [-1] * self.n
        tlevel = [-1] * self.nt
        queue = deque(c for c in range(self.n) if missing[c] == 0)
        for c in queue:
            level[c] = 0
        order = []
        while queue:
            c = queue.popleft()
            order.append(c)
            for t in self.prods[c]:
                if tlevel[t] >= 0:
                    continue
                tlevel[t] = level[c]
                for d in self.consumers[t]:
                    if missing[d] > 0:
                        missing[d] -= 1
                        if missing[d] == 0:
                            level[d] = level[c] + 1
                            queue.append(d)
        return order, level, tlevel

    def relevant(self, runnable: list[bool]) -> list[bool]:
        """Runnable candidates that (transitively) help produce a required tensor."""
        keep = [False] * self.n
        seen = [False] * self.nt
        stack = list(self.required)
        for t in stack:
            seen[t] = True
        while stack:
            t = stack.pop()
            for c in self.producers[t]:
                if runnable[c] and not keep[c]:
                    keep[c] = True
                    for u in self.needs[c]:
                        if not seen[u]:
                            seen[u] = True
                            stack.append(u)
        return keep

    def prune(self, order: list[int]) -> list[int]:
        """Drop from an executable order every kernel whose outputs nothing uses."""
        first: dict[int, int] = {}
        for i, c in enumerate(order):
            for t in self.prods[c]:
                first.setdefault(t, i)
        keep = set()
        stack = [first[t] for t in self.required]
        while stack:
            i = stack.pop()
            if i not in keep:
                keep.add(i)
                stack.extend(first[u] for u in self.needs[order[i]])
        return [order[i] for i in sorted(keep)]

    def infeasible(self, allowed: list[bool], tlevel: list[int]) -> str | None:
        """Why some required tensor can never be produced, or None if all can."""
        for t in self.required:
            if tlevel[t] >= 0:
                continue
            name = self.tensor_ids[t]
            producers = self.producers[t]
            if not producers:
                return f"no valid orchestration: required tensor {name} is produced by no candidate"
            if not any(allowed[c] for c in producers):
                return (f"no valid orchestration: required tensor {name} is produced only by "
                        f"excluded candidates (infinite cost), e.g. {producers[0]}")
            c = next(c for c in producers if allowed[c])
            stuck = [self.tensor_ids[u] for u in self.needs[c] if tlevel[u] < 0]
            return (f"no valid orchestration: required tensor {name} is produced only by candidates "
                    f"that can never run (candidate {c} needs tensor {stuck[0]}, which nothing "
                    "computable produces)")
        return None


class Solver:
    """One HiGHS model of a problem, re-solvable with other costs.

    Cycle cuts do not depend on costs, so they are kept across ``solve`` calls
    (the lazy measurement loop re-solves many times with refined costs).
    """

    def __init__(self, problem: Problem):
        self.problem = problem
        self.ix = ix = _Index(problem)
        self.cycle_cuts = 0
        order, _, tlevel = ix.run([True] * ix.n)
        reason = ix.infeasible([True] * ix.n, tlevel)
        if reason:
            raise InfeasibleError(reason)
        # candidates that can run with everything selected: the rest are fixed to 0 forever
        self.structural = ix.relevant(_mask(ix.n, order))
        self.h, self.upper = _build_model(ix, self.structural)

    def solve(self, costs=None, *, time_limit: float | None = None) -> Solution:
        start = time.perf_counter()
        deadline = math.inf if time_limit is None else start + time_limit
        costs = list(self.problem.costs if costs is None else costs)
        if len(costs) != self.ix.n or any(not c >= 0 for c in costs):
            raise ValueError("costs must be one value >= 0 per candidate")
        ix, h = self.ix, self.h
        allowed = [s and math.isfinite(c) for s, c in zip(self.structural, costs)]
        order, level, tlevel = ix.run(allowed)
        reason = ix.infeasible(allowed, tlevel)
        if reason:
            raise InfeasibleError(reason)
        alive = ix.relevant(_mask(ix.n, order))
        scale = _scale(costs, alive)
        cols = np.arange(ix.n, dtype=np.int32)
        h.changeColsBounds(ix.n, cols, np.zeros(ix.n), np.array(alive, dtype=float))
        h.changeColsCost(ix.n, cols, np.array([c * scale if a else 0.0 for c, a in zip(costs, alive)]))

        def value(o):
            return math.fsum(costs[c] for c in o)

        best = self._complete([], level, costs, set())
        lower, proven = 0.0, False
        while not proven:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            h.setOptionValue("time_limit", remaining if math.isfinite(remaining) else math.inf)
            _hint(h, ix, self.upper, best)
            h.run()
            status, info = h.getModelStatus(), h.getInfo()
            if status not in _STOPPED and status != highspy.HighsModelStatus.kOptimal:
                raise RuntimeError(f"HiGHS failed on an orchestration problem: {h.modelStatusToString(status)}")
            if math.isfinite(info.mip_dual_bound):
                lower = max(lower, info.mip_dual_bound / scale)
            if info.primal_solution_status != 2:  # no feasible point
                break
            x = h.getSolution().col_value
            chosen = [c for c in range(ix.n) if alive[c] and x[c] > _CHOSEN]
            ran, _, avail = ix.run(_mask(ix.n, chosen))
            if all(avail[t] >= 0 for t in ix.required):
                plan = ix.prune(ran)
                if value(plan) < value(best):
                    best = plan
                proven = status == highspy.HighsModelStatus.kOptimal
            else:
                stuck = sorted(set(chosen) - set(ran))
                self._cut(stuck, avail)
                plan = self._complete(ran, level, costs, set(stuck))
                if value(plan) < value(best):
                    best = plan
            if status != highspy.HighsModelStatus.kOptimal:
                break
        objective = value(best)
        if objective <= 0 or proven:
            gap = 0.0
            proven = True
        else:
            gap = max(0.0, (objective - lower) / objective)
        return Solution(tuple(best), objective, proven, gap, time.perf_counter() - start, self.cycle_cuts)

    def _complete(self, base: list[int], level: list[int], costs, prefer: set[int]) -> list[int]:
        """An executable plan containing the executable order ``base``, pruned.

        Missing tensors get producers of strictly decreasing level (the level of
        ``ix.run`` over all allowed candidates), so the additions cannot form a cycle.
        """
        ix = self.ix
        have = ix.run(_mask(ix.n, base))[2]
        chosen = set(base)
        lowest: dict[int, int] = {}  # tensor -> lowest level of an added producer
        stack = [(t, math.inf) for t in ix.required]
        while stack:
            t, bound = stack.pop()
            if have[t] >= 0 or lowest.get(t, math.inf) < bound:
                continue
            p = min((c for c in ix.producers[t] if 0 <= level[c] < bound),
                     key=lambda c: (0.0 if c in chosen or c in prefer else costs[c], level[c]))
            chosen.add(p)
            for u in ix.prods[p]:
                lowest[u] = min(lowest.get(u, math.inf), level[p])
            stack.extend((u, level[p]) for u in ix.needs[p])
        order, _, avail = ix.run(_mask(ix.n, chosen))
        assert all(avail[t] >= 0 for t in ix.required), "completion must be executable"
        return ix.prune(order)

    def _cut(self, stuck: list[int], avail: list[int]) -> None:
        """Cut off the selection whose kernels ``stuck`` cannot run (see docs/orchestration.md).

        One inequality per bottom strongly connected component of "needs a missing
        tensor that only these stuck kernels write": sum over the component of x_c
        <= size - 1 + sum of x over every other producer of the tensors it misses.
        """
        ix = self.ix
        inside = set(stuck)
        missing = {c: [t for t in ix.needs[c] if avail[t] < 0] for c in stuck}
        edges = {c: sorted({p for t in missing[c] for p in ix.producers[t] if p in inside})
                 for c in stuck}
        rows = []
        for comp in _bottom_components(stuck, edges):
            members = set(comp)
            tensors = {t for c in comp for t in missing[c]}
            others = sorted({p for t in tensors for p in ix.producers[t]
                             if p not in members and self.structural[p]})
            rows.append((sorted(members), others))
        starts, index, values = [], [], []
        for members, others in rows:
            starts.append(len(index))
            index += members + others
            values += [1.0] * len(members) + [-1.0] * len(others)
        self.h.addRows(len(rows), np.full(len(rows), -math.inf),
                       np.array([len(m) - 1.0 for m, _ in rows]), len(index),
                       np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32),
                       np.array(values))
        self.cycle_cuts += len(rows)


_STOPPED = {getattr(highspy.HighsModelStatus, s) for s in (
    "kTimeLimit", "kInterrupt", "kIterationLimit", "kSolutionLimit", "kObjectiveBound",
    "kObjectiveTarget", "kMemoryLimit")}


def _mask(n: int, chosen) -> list[bool]:
    mask = [False] * n
    for c in chosen:
        mask[c] = True
    return mask


def _scale(costs, alive) -> float:
    """A factor bringing the mean live cost to 1: HiGHS's tolerances are absolute."""
    live = [c for c, a in zip(costs, alive) if a and c > 0]
    return len(live) / math.fsum(live) if live else 1.0


def _build_model(ix: _Index, structural: list[bool]) -> tuple[highspy.Highs, np.ndarray]:
    """Columns: x_c per candidate (binary), then y_t per tensor (in [0, 1]: 'some
    selected kernel writes t'). Rows: x_c <= y_t for t in needs[c]; y_t <= the sum
    of x over the producers of t; required tensors have y_t = 1. Returns the model
    and the columns' upper bounds."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    n, nt = ix.n, ix.nt
    used = np.zeros(nt, dtype=bool)
    used[ix.required] = True
    pairs: list[tuple[int, int]] = []
    self_rows: list[tuple[int, int]] = []
    for c in range(n):
        if structural[c]:
            for t in ix.needs[c]:
                used[t] = True
                # c writes a tensor it reads: only the other producers can supply it
                (self_rows if t in ix.prods[c] else pairs).append((c, t))
    upper = np.concatenate([np.array(structural, dtype=float), used.astype(float)])
    lower = np.zeros(n + nt)
    lower[[n + t for t in ix.required]] = 1.0
    h.addCols(n + nt, np.zeros(n + nt), lower, upper, 0, np.zeros(0, np.int32),
              np.zeros(0, np.int32), np.zeros(0))
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.ones(n, dtype=np.uint8))
    # x_c - y_t <= 0, two entries per row, built as arrays
    pair = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    index = [np.stack([pair[:, 0], pair[:, 1] + n], axis=1).ravel()]
    values = [np.tile([1.0, -1.0], len(pair))]
    lengths = [np.full(len(pair), 2)]
    # y_t - sum of its producers' x <= 0; then x_c - sum of the other producers' x <= 0
    rows = [[n + t] + [p for p in ix.producers[t] if structural[p]] for t in np.flatnonzero(used)]
    rows += [[c] + [p for p in ix.producers[t] if structural[p] and p != c] for c, t in self_rows]
    for row in rows:
        index.append(np.array(row))
        values.append(np.array([1.0] + [-1.0] * (len(row) - 1)))
    lengths.append(np.array([len(row) for row in rows], dtype=np.int64))
    lengths = np.concatenate(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    count = len(lengths)
    h.addRows(count, np.full(count, -math.inf), np.zeros(count), int(lengths.sum()),
              starts, np.concatenate(index).astype(np.int32), np.concatenate(values))
    return h, upper


def _hint(h: highspy.Highs, ix: _Index, upper: np.ndarray, plan: list[int]) -> None:
    """Give HiGHS an executable plan as its starting incumbent (it satisfies every row and cut)."""
    x = np.zeros(ix.n + ix.nt)
    x[plan] = 1.0
    for c in plan:
        x[[ix.n + t for t in ix.prods[c]]] = 1.0
    sol = highspy.HighsSolution()
    sol.col_value = list(np.minimum(x, upper))
    sol.value_valid = True
    h.setSolution(sol)


def _bottom_components(nodes: list[int], edges: dict[int, list[int]]) -> list[list[int]]:
    """Strongly connected components with no edge leaving them (Tarjan, iterative)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    comps: list[list[int]] = []
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(edges[root]))]
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    comps.append(comp)
    where = {c: i for i, comp in enumerate(comps) for c in comp}
    return [comp for i, comp in enumerate(comps)
            if all(where[w] == i for c in comp for w in edges[c])]
