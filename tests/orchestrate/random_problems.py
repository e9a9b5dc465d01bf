"""Random orchestration problems built the way korch builds real ones, and exact references.

A random DAG of primitive nodes, each writing one tensor (its id is the node's
index); a candidate per connected convex node set; outputs are the tensors read
outside the set or required, needs are the tensors the set reads from other
nodes (graph inputs are given and never listed).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from korch.orchestrate.problem import Problem


def random_dag(rng: np.random.Generator, n: int, max_preds: int = 2, window: int | None = None):
    """Predecessor lists of a random DAG in topological order."""
    preds = []
    for i in range(n):
        lo = 0 if window is None else max(0, i - window)
        k = int(rng.integers(0, min(i - lo, max_preds) + 1))
        preds.append(sorted(int(p) for p in rng.choice(np.arange(lo, i), size=k, replace=False)) if k else [])
    return preds


def convex_sets(preds, max_size: int) -> list[frozenset[int]]:
    """Every connected (ignoring direction) convex node set of at most max_size nodes."""
    n = len(preds)
    succs = [[] for _ in range(n)]
    for v, ps in enumerate(preds):
        for p in ps:
            succs[p].append(v)
    anc = [0] * n
    for v in range(n):
        for p in preds[v]:
            anc[v] |= anc[p] | (1 << p)
    desc = [0] * n
    for v in reversed(range(n)):
        for s in succs[v]:
            desc[v] |= desc[s] | (1 << s)
    neighbours = [set(preds[v]) | set(succs[v]) for v in range(n)]
    found: set[frozenset[int]] = set()
    frontier = {frozenset([v]) for v in range(n)}
    while frontier:
        found |= frontier
        grown = set()
        for s in frontier:
            if len(s) < max_size:
                for v in set().union(*(neighbours[u] for u in s)) - s:
                    grown.add(s | {v})
        frontier = grown - found

    def convex(s):
        mask = sum(1 << v for v in s)
        below = above = 0
        for v in s:
            below |= desc[v]
            above |= anc[v]
        return not (below & above & ~mask)

    return sorted((s for s in found if convex(s)), key=lambda s: (len(s), sorted(s)))


def random_problem(rng: np.random.Generator, n: int, max_size: int, computed: bool = False, **dag) -> Problem:
    """``computed``: each candidate also produces a pseudo-tensor per node it computes, all of them required
    (ids ``n + node``), as korch's segments do (``problem.py``)."""
    preds = random_dag(rng, n, **dag)
    readers = [set() for _ in range(n)]
    for v, ps in enumerate(preds):
        for p in ps:
            readers[p].add(v)
    required = {v for v in range(n) if not readers[v] or rng.random() < 0.1}
    costs, needs, produces = [], [], []
    for s in convex_sets(preds, max_size):
        produces.append(tuple(v for v in sorted(s) if v in required or readers[v] - s)
                        + (tuple(n + v for v in sorted(s)) if computed else ()))
        needs.append(tuple(sorted({p for v in s for p in preds[v]} - s)))
        costs.append(float(rng.uniform(1, 10) * len(s) ** 0.7))
    pseudo = tuple(n + v for v in range(n)) if computed else ()
    return Problem(tuple(costs), tuple(needs), tuple(produces), tuple(sorted(required)) + pseudo, computed=pseudo)


def executes(problem: Problem, order) -> bool:
    """Whether the kernels run in this order, each after its inputs exist, and write every required tensor."""
    have: set[int] = set()
    for c in order:
        if not set(problem.needs[c]) <= have:
            return False
        have |= set(problem.produces[c])
    return set(problem.required) <= have


def has_cycle(problem: Problem) -> bool:
    """Whether some candidates need each other's outputs in a cycle."""
    writers: dict[int, list[int]] = {}
    for c, ts in enumerate(problem.produces):
        for t in ts:
            writers.setdefault(t, []).append(c)
    edges = [{d for t in problem.needs[c] for d in writers.get(t, ()) if d != c}
             for c in range(len(problem.costs))]
    state = [0] * len(edges)  # 0 new, 1 on the path, 2 done

    def visit(c):
        state[c] = 1
        for d in edges[c]:
            if state[d] == 1 or (state[d] == 0 and visit(d)):
                return True
        state[c] = 2
        return False

    return any(state[c] == 0 and visit(c) for c in range(len(edges)))


def _bits(ts) -> int:
    return sum(1 << t for t in ts)


def subset_minimum(problem: Problem, containing: int | None = None) -> float:
    """Cheapest executable subset, by trying every subset of candidates (vectorised); ``containing``: of the
    subsets that hold this candidate."""
    k = len(problem.costs)
    masks = np.arange(1 << k, dtype=np.int64)
    avail = np.zeros_like(masks)
    ran = np.zeros_like(masks)
    need = [_bits(ts) for ts in problem.needs]
    prod = [_bits(ts) for ts in problem.produces]
    changed = True
    while changed:
        changed = False
        for c in range(k):
            ok = (((masks & ~ran) >> c) & 1).astype(bool) & ((avail & need[c]) == need[c])
            if ok.any():
                avail[ok] |= prod[c]
                ran[ok] |= 1 << c
                changed = True
    req = _bits(problem.required)
    good = (ran == masks) & ((avail & req) == req)
    if containing is not None:
        good &= ((masks >> containing) & 1).astype(bool)
    cost = np.zeros(len(masks))
    for c in range(k):
        cost += np.where((masks >> c) & 1, problem.costs[c], 0.0)  # an excluded (inf) candidate, where chosen
    return float(cost[good].min()) if good.any() else math.inf


def state_minimum(problem: Problem) -> float:
    """Cheapest executable selection, by Dijkstra over sets of available tensors."""
    need = [_bits(ts) for ts in problem.needs]
    prod = [_bits(ts) for ts in problem.produces]
    req = _bits(problem.required)
    best = {0: 0.0}
    heap = [(0.0, 0)]
    while heap:
        d, state = heapq.heappop(heap)
        if d > best[state]:
            continue
        if state & req == req:
            return d
        for c, cost in enumerate(problem.costs):
            if need[c] & state == need[c] and prod[c] & ~state:
                nxt = state | prod[c]
                if d + cost < best.get(nxt, math.inf):
                    best[nxt] = d + cost
                    heapq.heappush(heap, (d + cost, nxt))
    return math.inf
