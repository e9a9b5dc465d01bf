"""When a set of candidate kernels can run: greedy scheduling, repairs, and the valid inequalities.

Pure combinatorics on the solver's ``Problem`` with tensor ids made dense
(``Index``): no HiGHS here. A selection is *executable* when the greedy
schedule (run any kernel whose needed tensors exist) runs every kernel needed
for the required tensors. ``cutset_rows`` and ``stuck_rows`` list the
inequalities the solver adds so that its optimum is executable;
docs/orchestration.md proves them valid.
"""

from __future__ import annotations

import math
from collections import deque

# A cut is (columns, coefficients, lower, upper): lower <= sum coef * x <= upper.
Row = tuple[list[int], list[float], float, float]

# The repair of a stuck selection adds at most this many kernels one at a time
# before it falls back to the level-ordered completion.
REPAIR_STEPS = 64


class Index:
    """A problem with tensor ids made dense and both directions of every edge listed."""

    def __init__(self, problem):
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
        self._anc: list[int] | None = None

    def mask(self, chosen) -> list[bool]:
        mask = [False] * self.n
        for c in chosen:
            mask[c] = True
        return mask

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
            for c in self.producers[stack.pop()]:
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

    def drop_redundant(self, order: list[int], costs) -> list[int]:
        """The executable ``order`` less the kernels the others make redundant, most expensive first: a kernel
        goes when every tensor it writes that is required or read by another kept kernel has another writer
        kept, and the rest still run. A plan that stops short of the optimum (a time limit) can compute a value
        twice: YOLOv4's 600-second plan had 29 such kernels, 24 of its 186 predicted ms, which its compiled
        unit never ran (a value's second computation is dead code there)."""
        kept = list(order)
        writers, read = self._counts(kept)
        required = set(self.required)
        for c in sorted(order, key=lambda c: (-costs[c], c)):
            if c not in kept or any(len(writers[t]) == 1 and (t in required or t in read) for t in self.prods[c]):
                continue  # pruned already, or the only writer of a tensor the plan needs
            ran, _, avail = self.run(self.mask(k for k in kept if k != c))
            if all(avail[t] >= 0 for t in required):
                kept = self.prune(ran)
                writers, read = self._counts(kept)
        return kept

    def _counts(self, kept: list[int]) -> tuple[dict[int, set[int]], set[int]]:
        """Each tensor's writers among ``kept``, and the tensors they read."""
        writers: dict[int, set[int]] = {}
        for k in kept:
            for t in self.prods[k]:
                writers.setdefault(t, set()).add(k)
        return writers, {t for k in kept for t in self.needs[k]}

    def infeasible(self, allowed: list[bool], tlevel: list[int]) -> str | None:
        """Why some required tensor can never be produced (one line), or None if all can."""
        for t in self.required:
            if tlevel[t] >= 0:
                continue
            name, producers = self.tensor_ids[t], self.producers[t]
            if not producers:
                return f"no valid orchestration: required tensor {name} is produced by no candidate"
            if not any(allowed[c] for c in producers):
                return (f"no valid orchestration: required tensor {name} is produced only by excluded "
                        f"candidates (infinite cost), e.g. candidate {producers[0]}")
            c = next(c for c in producers if allowed[c])
            stuck = next(self.tensor_ids[u] for u in self.needs[c] if tlevel[u] < 0)
            return (f"no valid orchestration: required tensor {name} is produced only by candidates that "
                    f"can never run (candidate {c} needs tensor {stuck}, which no runnable candidate writes)")
        return None

    def complete(self, base: list[int], level: list[int], costs, prefer: set[int]) -> list[int]:
        """An executable, pruned plan containing the executable order ``base``.

        Each missing tensor gets a producer of strictly lower ``level`` (the levels
        of ``run`` over every allowed candidate) than the kernel that needs it, so
        the additions cannot form a cycle. ``prefer``: kernels taken as free.
        """
        have = self.run(self.mask(base))[2]
        chosen = set(base)
        lowest: dict[int, int] = {}  # tensor -> lowest level of an added producer
        stack = [(t, math.inf) for t in self.required]
        while stack:
            t, bound = stack.pop()
            if have[t] >= 0 or lowest.get(t, math.inf) < bound:
                continue
            p = min((c for c in self.producers[t] if 0 <= level[c] < bound),
                    key=lambda c: (0.0 if c in chosen or c in prefer else costs[c], level[c]))
            chosen.add(p)
            for u in self.prods[p]:
                lowest[u] = min(lowest.get(u, math.inf), level[p])
            stack.extend((u, level[p]) for u in self.needs[p])
        order, _, avail = self.run(self.mask(chosen))
        assert all(avail[t] >= 0 for t in self.required), "a completion is executable"
        return self.prune(order)

    def repair(self, chosen: list[int], allowed: list[bool], level: list[int], costs) -> list[int]:
        """An executable plan close to the stuck selection ``chosen``: add, one at a time, the
        cheapest kernel that can run now and writes a tensor a stuck kernel misses."""
        selected = set(chosen)
        for _ in range(REPAIR_STEPS):
            ran, _, avail = self.run(self.mask(selected))
            if all(avail[t] >= 0 for t in self.required):
                return self.prune(ran)
            stuck = selected.difference(ran)
            options = {p for c in stuck for t in self.needs[c] if avail[t] < 0 for p in self.producers[t]
                       if allowed[p] and p not in selected and all(avail[u] >= 0 for u in self.needs[p])}
            if not options:
                break
            selected.add(min(options, key=lambda p: (costs[p], p)))
        ran, _, avail = self.run(self.mask(selected))
        return self.complete(ran, level, costs, selected.difference(ran))

    def ancestors(self) -> list[int]:
        """Bit t of ``ancestors()[u]``: u depends on t (or is t).

        "u depends on t" is the transitive closure of "a producer of u writing the
        fewest tensors reads t" (for a one-primitive kernel, its inputs).
        """
        if self._anc is None:
            preds: list[list[int]] = [[] for _ in range(self.nt)]
            for u in range(self.nt):
                if self.producers[u]:
                    fewest = min(len(self.prods[c]) for c in self.producers[u])
                    preds[u] = sorted({t for c in self.producers[u] if len(self.prods[c]) == fewest
                                       for t in self.needs[c]})
            anc = [0] * self.nt
            for comp in components(range(self.nt), preds):
                bits = sum(1 << u for u in comp)
                for u in comp:
                    for t in preds[u]:
                        bits |= anc[t]
                for u in comp:
                    anc[u] = bits
            self._anc = anc
        return self._anc


def cutset_rows(ix: Index, live: list[bool]) -> list[Row]:
    """Rows "sum of x over Q(D) >= 1", Q(D) being the live kernels that read only tensors of
    D and write one outside D, for: D = {}; D = the tensors that depend on no tensor of T,
    for T = {t} with t any tensor a required tensor depends on (then Q(D) is about the
    kernels computing t), and for T = {a, b} when one kernel reads a and writes a tensor
    independent of a that b depends on, and another the reverse (the two could feed
    each other in a cycle)."""
    anc = ix.ancestors()
    relevant = 0
    for r in ix.required:
        relevant |= anc[r]
    computes: list[list[int]] = [[] for _ in range(ix.nt)]  # computes[t]: Q(D) for T = {t}
    cross: set[tuple[int, int]] = set()
    for c in range(ix.n):
        if not live[c]:
            continue
        below = inside = 0
        for t in ix.needs[c]:
            below |= anc[t]
        for u in ix.prods[c]:
            inside |= anc[u]
            cross.update((t, u) for t in ix.needs[c] if not anc[u] >> t & 1)
        inside &= ~below
        while inside:
            low = inside & -inside
            computes[low.bit_length() - 1].append(c)
            inside ^= low
    rows = [computes[t] for t in range(ix.nt) if relevant >> t & 1]
    for a, b in sorted(cross):
        if a < b and (b, a) in cross and (relevant >> a | relevant >> b) & 1:
            bits = 1 << a | 1 << b
            rows.append(sorted({c for t in (a, b) for c in computes[t]
                                if not any(anc[u] & bits for u in ix.needs[c])}))
    if ix.required:
        rows.append([c for c in range(ix.n) if live[c] and not ix.needs[c]])
    unique = dict.fromkeys(tuple(q) for q in rows if q)
    return [(list(q), [1.0] * len(q), 1.0, math.inf) for q in unique]


def stuck_rows(ix: Index, live: list[bool], stuck: list[int], avail: list[int]) -> list[Row]:
    """Rows cutting off a selection whose kernels ``stuck`` wait on each other forever.

    ``avail[t] >= 0`` marks the tensors the rest of the selection wrote (A); some
    required tensor is not in A. For each bottom strongly connected component R
    of "c misses a tensor that stuck kernel c' writes", with T_R the tensors R
    misses: (1) sum of x over R <= |R| - 1 + sum of x over the other writers of
    T_R, and (2) the cut-set row for D = the tensors that depend on no tensor of
    T_R; then (3) the cut-set row for D = A.
    """
    inside = set(stuck)
    missing = {c: [t for t in ix.needs[c] if avail[t] < 0] for c in stuck}
    edges = {c: sorted({p for t in missing[c] for p in ix.producers[t] if p in inside}) for c in stuck}
    comps = components(stuck, edges)
    where = {c: i for i, comp in enumerate(comps) for c in comp}
    anc = ix.ancestors()
    rows: list[Row] = []
    for i, comp in enumerate(comps):
        if any(where[w] != i for c in comp for w in edges[c]):
            continue  # not a bottom component: it waits on another stuck component
        tensors = {t for c in comp for t in missing[c]}
        others = sorted({p for t in tensors for p in ix.producers[t] if live[p] and p not in comp})
        rows.append((sorted(comp) + others, [1.0] * len(comp) + [-1.0] * len(others), -math.inf, len(comp) - 1.0))
        bits = sum(1 << t for t in tensors)
        late = [bool(anc[u] & bits) for u in range(ix.nt)]
        if any(late[r] for r in ix.required):
            rows.append(_cutset(ix, live, late))
    rows.append(_cutset(ix, live, [a < 0 for a in avail]))
    return rows


def _cutset(ix: Index, live: list[bool], outside: list[bool]) -> Row:
    """The row "sum of x over Q(D) >= 1" for D = the tensors not marked ``outside``."""
    q = [c for c in range(ix.n) if live[c] and any(outside[u] for u in ix.prods[c])
         and not any(outside[t] for t in ix.needs[c])]
    return (q, [1.0] * len(q), 1.0, math.inf)


def components(nodes, edges) -> list[list[int]]:
    """Strongly connected components (Tarjan, iterative), each after every component it has an edge to."""
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
                    while not comp or comp[-1] != v:
                        comp.append(stack.pop())
                        on_stack.discard(comp[-1])
                    comps.append(comp)
    return comps
