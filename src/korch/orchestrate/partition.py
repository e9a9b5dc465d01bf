"""Cutting a whole model into segments small enough to solve, without hand-written cut points.

A *separator* is a position k of the graph's topological node order after
which at most one tensor produced so far (ignoring graph inputs and constants,
which are always available) is still read later: the cut tensor. Cutting there
splits the graph into two parts that exchange only that tensor. When no
candidate kernel has nodes on both sides, the cut is *exact*: every kernel of
an orchestration lies on one side, the earlier part must produce the cut tensor
and the later part reads it, so solving the parts one after the other is as
good as solving the whole.

``partition`` cuts at every exact separator. A part still larger than
``max_segment_nodes`` is split further by a small dynamic program over the
positions inside it: every part within the limit, then the fewest dropped
candidates (those crossing a chosen cut; each counted once, at the first cut
it crosses), then the fewest cuts that are not single-tensor separators, then
the fewest cuts. Dropped candidates belong to no segment.

Multi-scale models (FPNs, SegFormer's decoder reading every stage) keep
several tensors alive across long stretches, where single-tensor separators
are too sparse to respect the limit; there a cut may pass several tensors, all
produced by earlier segments (``segment_outputs`` lists what a segment must
produce). Such a cut is exact too when no candidate crosses it. In practice,
with the default predicate, every position of the zoo models is crossed by
some fusable producer-consumer pair, so cuts drop candidates and segments
after a cut are not exact.

``load_cut_points``/``partition_at`` read the Korch paper's TOML files of cut
points instead (``cut_points = [[[inputs...], [outputs...]], ...]``) and cut
after the producers of each cut point's outputs.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import tomllib
from collections.abc import Sequence

from korch.errors import KorchError
from korch.ir.graph import Graph
from korch.orchestrate.candidates import CandidateSet


@dataclasses.dataclass(frozen=True)
class Segment:
    """A consecutive range of the topological order. ``exact``: no candidate has nodes on both sides
    of the cut before it or of the cut after it (so no candidate was lost at its boundary)."""

    nodes: frozenset[int]
    candidate_ids: tuple[int, ...]   # candidates entirely inside this segment
    exact: bool                      # True when no candidate crosses this segment's boundary
    dropped: int                     # candidates crossing into a later segment that were dropped because of this cut


def separators(graph: Graph) -> list[tuple[int, str | None]]:
    """``(k, tensor)`` for each separator position k < len(nodes) - 1; tensor is None when nothing crosses."""
    nodes = graph.nodes
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for t in node.inputs:
            if t:
                last_use[t] = i
    dying: list[list[str]] = [[] for _ in nodes]
    live: set[str] = set()
    result = []
    for k, node in enumerate(nodes):
        live.difference_update(dying[k])
        for t in node.outputs:
            end = last_use.get(t, -1)
            if end > k:
                live.add(t)
                dying[end].append(t)
        if k < len(nodes) - 1 and len(live) <= 1:
            result.append((k, next(iter(live)) if live else None))
    return result


def _spans(candidates: CandidateSet) -> list[tuple[int, int]]:
    return [(min(c.nodes), max(c.nodes)) for c in candidates.candidates]


def _crossing_counts(spans: list[tuple[int, int]], n: int) -> list[int]:
    """For each position k, how many candidates have nodes at or before k and after k."""
    diff = [0] * (n + 1)
    for lo, hi in spans:
        if hi > lo:
            diff[lo] += 1
            diff[hi] -= 1
    counts, running = [], 0
    for k in range(n):
        running += diff[k]
        counts.append(running)
    return counts


def _segments(graph: Graph, candidates: CandidateSet, cuts: Sequence[int]) -> list[Segment]:
    """Segments between sorted cut positions (a cut at k ends a segment after node k)."""
    n = len(graph.nodes)
    spans = _spans(candidates)
    crossing = _crossing_counts(spans, n)
    bounds = sorted({k for k in cuts if 0 <= k < n - 1}) + [n - 1]
    inside: list[list[int]] = [[] for _ in bounds]
    dropped = [0] * len(bounds)
    for cid, (lo, hi) in enumerate(spans):
        j = bisect.bisect_left(bounds, lo)  # the segment holding lo ends at bounds[j]
        if hi <= bounds[j]:
            inside[j].append(cid)
        else:
            dropped[j] += 1
    segments, start = [], 0
    for j, end in enumerate(bounds):
        exact = (start == 0 or crossing[start - 1] == 0) and crossing[end] == 0
        segments.append(Segment(nodes=frozenset(range(start, end + 1)), candidate_ids=tuple(inside[j]),
                                exact=exact, dropped=dropped[j]))
        start = end + 1
    return segments


def partition(graph: Graph, candidates: CandidateSet, *, max_segment_nodes: int = 400) -> list[Segment]:
    """Segments covering every node: exact cuts everywhere, inexact ones only inside oversized parts."""
    if max_segment_nodes < 1:
        raise KorchError(f"max_segment_nodes must be at least 1, got {max_segment_nodes}")
    n = len(graph.nodes)
    if n == 0:
        return []
    spans = _spans(candidates)
    crossing = _crossing_counts(spans, n)
    seps = {k for k, _ in separators(graph)}
    exact = sorted(k for k in seps if crossing[k] == 0)
    cuts = list(exact)
    start = 0
    for end in exact + [n - 1]:
        if end - start + 1 > max_segment_nodes:
            cuts += _split(start, end, seps, spans, max_segment_nodes)
        start = end + 1
    return _segments(graph, candidates, cuts)


def _split(start: int, end: int, seps: set[int], spans: list[tuple[int, int]], limit: int) -> list[int]:
    """The cuts that split nodes start..end best: parts within ``limit`` (always possible cutting
    anywhere), then fewest dropped candidates, then fewest cuts that are not single-tensor
    separators, then fewest cuts."""
    # crossers[k - start]: the sorted first nodes of the candidates inside the part that cross position k
    crossers: list[list[int]] = [[] for _ in range(start, end)]
    for lo, hi in spans:
        if start <= lo < hi <= end:
            for k in range(lo, hi):
                crossers[k - start].append(lo)
    for row in crossers:
        row.sort()
    # best[j]: the best score of parts covering start..p(j) with a cut after p(j) = start - 1 + j
    best: list[tuple[tuple[int, int, int], int]] = [((0, 0, 0), -1)]
    for j in range(1, end - start + 1):
        k, row = start - 1 + j, crossers[j - 1]
        plain = 0 if k in seps else 1
        choice = None
        for i in range(j - 1, max(-1, j - 1 - limit), -1):
            (drops, others, count), _ = best[i]
            score = (drops + len(row) - bisect.bisect_right(row, start - 1 + i), others + plain, count + 1)
            if choice is None or score < choice[0]:
                choice = (score, i)
        best.append(choice)
    final = min((best[i][0], i) for i in range(max(0, end - start + 1 - limit), end - start + 1))
    cuts, state = [], final[1]
    while state > 0:
        cuts.append(start - 1 + state)
        state = best[state][1]
    return sorted(cuts)


def segment_outputs(graph: Graph, segment: Segment) -> tuple[str, ...]:
    """Tensors a segment must produce: its graph outputs and the tensors later segments read."""
    outputs = set(graph.outputs)
    needed: set[str] = set()
    for i, node in enumerate(graph.nodes):
        if i not in segment.nodes:
            needed.update(t for t in node.inputs if t)
    return tuple(t for i in sorted(segment.nodes) for t in graph.nodes[i].outputs if t in outputs or t in needed)


# -- the paper's cut-point files ----------------------------------------------------------

def load_cut_points(path: str | os.PathLike) -> list[tuple[list[str], list[str]]]:
    """``cut_points = [[[inputs...], [outputs...]], ...]`` from a TOML file."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise KorchError(f"cannot read cut points file {os.fspath(path)}: {e.strerror or e}") from None
    except ValueError as e:  # TOMLDecodeError, or bytes that are not UTF-8
        raise KorchError(f"cut points file {os.fspath(path)} is not valid TOML: {e}") from None
    points = data.get("cut_points")
    shape = "cut_points = [[[input names...], [output names...]], ...]"
    if not isinstance(points, list):
        raise KorchError(f"cut points file {os.fspath(path)} needs {shape}")
    result = []
    for n, point in enumerate(points):
        if not (isinstance(point, list) and len(point) == 2 and all(
                isinstance(side, list) and all(isinstance(t, str) for t in side) for side in point)):
            raise KorchError(f"cut points file {os.fspath(path)}: entry {n} is not [[inputs...], [outputs...]] "
                             f"of tensor names ({shape})")
        result.append((list(point[0]), list(point[1])))
    return result


def partition_at(graph: Graph, candidates: CandidateSet,
                 cut_points: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[Segment]:
    """Segments cut after the last producer of each cut point's outputs (inputs are checked, not used)."""
    producer = {t: i for i, node in enumerate(graph.nodes) for t in node.outputs}
    cuts = []
    for inputs, outputs in cut_points:
        unknown = [t for t in [*inputs, *outputs] if t not in graph.tensors]
        if unknown:
            raise KorchError(f"cut point names unknown tensor(s) {', '.join(map(repr, unknown))} "
                             f"of graph {graph.name!r}")
        made = [producer[t] for t in outputs if t in producer]
        if made:
            cuts.append(max(made))
    if not graph.nodes:
        return []
    return _segments(graph, candidates, cuts)
