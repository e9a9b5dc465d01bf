"""Columns no optimal plan needs: a candidate that two others, together, replace at no greater cost.

Candidate ``k`` is *dominated* by a pair ``(a, b)`` when ``a`` then ``b`` can run wherever ``k`` can (``a`` needs
only what ``k`` needs; ``b`` only that and what ``a`` writes), they write everything ``k`` writes, and
``k`` costs at least as much as both: ``low[k] >= true[a] + true[b]``. Any executable plan with ``k`` then
stays executable with ``a`` and ``b`` in its place, and costs no more, so leaving ``k`` out of the program
keeps its optimum. ``low`` may be a lower bound (lazy measurement's floors for unmeasured kernels) but the
pair's costs must be true ones (measured): a floor under the pair proves nothing.

Both parts compute fewer primitives than ``k`` (each candidate produces one pseudo-tensor per primitive it
computes, ``problem.py``), so the replacements cannot go round in a circle: a part left out in turn is
replaced by smaller ones, down to columns that stay. Layout conversions (no primitives) are never left out.

Replacements compose (``Replacements.dominated``), so a kernel split in three or more parts is found through pairs
whenever the intermediate unions are candidates. On a CPU fusing often does not pay: Candy's measured program
(2972 columns, every kernel measured) leaves 1374 out, each a fractional alternative that branch and cut would
otherwise have to rule out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from korch.orchestrate.problem import Problem


class Replacements:
    """Which pairs of columns could replace which column: worked out once per problem (it depends on what the
    columns read and write, not on their costs), then asked each round with that round's costs. A problem
    without ``computed`` pseudo-tensors has none: nothing then says which part is smaller."""

    def __init__(self, problem: Problem):
        computed = frozenset(problem.computed)
        primitives = [frozenset(t for t in made if t in computed) for made in problem.produces]
        needs = [frozenset(n) for n in problem.needs]
        made = [frozenset(p) for p in problem.produces]
        by_primitives: dict[frozenset[int], list[int]] = defaultdict(list)
        by_least: dict[int, list[int]] = defaultdict(list)  # columns by their least primitive
        for c, prims in enumerate(primitives):
            if prims:
                by_primitives[prims].append(c)
                by_least[min(prims)].append(c)
        # smallest columns first, so that a part's own replacements are known before it is used as one
        self.order = sorted((c for c, prims in enumerate(primitives) if prims), key=lambda c: len(primitives[c]))
        self.pairs: dict[int, list[tuple[int, int]]] = {}
        for k in self.order:
            prims = primitives[k]
            # one part computes k's least primitive (look only there); the other part is then determined
            self.pairs[k] = [(a, b) for a in by_least[min(prims)] if primitives[a] < prims
                             for b in by_primitives.get(prims - primitives[a], ()) if _replaces(k, a, b, needs, made)]

    def dominated(self, low: Sequence[float], true: Mapping[int, float]) -> set[int]:
        """The columns that measured columns replace at no greater cost.

        ``low[c]``: a lower bound on column ``c``'s cost (``math.inf``: excluded already); ``true``: the true
        costs known (measured). Replacements compose: a part may itself be replaced by two smaller parts, so
        ``upper[c]``, the least true cost of computing what ``c`` computes with ``c`` or parts that replace it,
        is found smallest columns first, over pairs.
        """
        upper = [true.get(c, math.inf) for c in range(len(low))]
        out: set[int] = set()
        for k in self.order:
            split = min((upper[a] + upper[b] for a, b in self.pairs[k]), default=math.inf)
            if split <= low[k]:
                out.add(k)
            upper[k] = min(upper[k], split)
        return out


def _replaces(k: int, a: int, b: int, needs: Sequence[frozenset[int]], made: Sequence[frozenset[int]]) -> bool:
    """Whether ``a`` and ``b``, run in one order or the other, write all ``k`` writes from what ``k`` reads."""
    if not made[k] <= made[a] | made[b]:
        return False
    return any(needs[first] <= needs[k] and needs[then] <= needs[k] | made[first]
               for first, then in ((a, b), (b, a)))
