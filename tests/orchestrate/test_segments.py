"""The segment oracle: a measured kernel answers for every candidate that is the same kernel; the optimum priced
in place."""

import random
from types import SimpleNamespace

import pytest

from korch.orchestrate.candidates import enumerate_candidates
from korch.orchestrate.partition import partition
from korch.orchestrate.segments import _SegmentOracle, solve_segments
from tests.orchestrate.test_candidates import random_graph


class Measurer:
    """Global candidates with signatures; a latency per signature; what was asked."""

    def __init__(self, signatures):
        self.candidates = [SimpleNamespace(signature=s) for s in signatures]
        self.asked: list[list[int]] = []

    def measure(self, ids):
        self.asked.append(list(ids))
        return {i: {"a": 1.0, "b": 2.0, "c": 3.0}[self.candidates[i].signature] for i in ids}


def test_a_measured_kernel_answers_for_the_segments_candidates_that_are_the_same_kernel():
    measurer = Measurer(["a", "b", "a", "c", "a", "b"])
    oracle = _SegmentOracle(measurer, [0, 2, 3, 5])  # the segment's candidates: a, a, c, b (global 1 and 4 elsewhere)
    assert oracle.measure([0]) == {0: 1.0, 1: 1.0}  # local 1 is global 2, the same kernel "a"
    assert oracle.measure([3, 2]) == {3: 2.0, 2: 3.0}  # no twin in the segment: "b" at global 1 lies outside it
    assert measurer.asked == [[0, 2], [5, 3]]  # asked first, then the twins (which the measurer looks up)


class Priced:
    """A measurer of ``graph``'s candidates: each costs ``alone[c]`` measured alone; ``time`` gives ``in_place[c]``
    for kernels run in sequence, and records the sequences."""

    def __init__(self, candidates, alone, in_place):
        self.candidates, self.alone, self.in_place = candidates, alone, in_place
        self.sequences: list[list[int]] = []

    def known(self, ids):
        return {}

    def measure(self, ids):
        return {i: self.alone[i] for i in ids}

    def record_for(self, c):
        return None

    def time(self, ids):
        self.sequences.append(list(ids))
        return {i: self.in_place[i] for i in ids}


@pytest.mark.parametrize("seed", range(8))
def test_the_optimum_priced_in_place_is_the_optimum_of_the_in_place_latencies(seed):
    graph = random_graph(seed)
    candidates = enumerate_candidates(graph)
    rng = random.Random(seed)
    # twins (one signature) cost the same alone; in place each kernel costs 1-3x its time alone, by its context
    by_signature = {c.signature: rng.uniform(1.0, 10.0) for c in candidates.candidates}
    alone = [by_signature[c.signature] for c in candidates.candidates]
    in_place = [t * rng.uniform(1.0, 3.0) for t in alone]
    segments = partition(graph, candidates)
    priced = Priced(candidates.candidates, alone, in_place)
    kernels, reports, _ = solve_segments(graph, candidates, segments, [t / 2 for t in alone], None,
                                         measurer=priced, in_place=priced)
    best, _, _ = solve_segments(graph, candidates, segments, in_place, None)  # every latency in place known
    assert sum(k.cost_s for k in kernels) == pytest.approx(sum(k.cost_s for k in best), rel=1e-9)
    assert all(r.optimal for r in reports)
    assert sum(r.timed_in_place for r in reports) == len(kernels)  # every planned kernel priced in place
    assert sum(r.in_place_rounds for r in reports) == len(priced.sequences) >= len(segments)
    chosen = {(tuple(graph.nodes[i].name for i in sorted(c.nodes)), c.outputs): c.id for c in candidates.candidates}
    assert all(k.cost_s == pytest.approx(in_place[chosen[k.nodes, k.outputs]]) for k in kernels)


def test_a_sequence_that_does_not_run_leaves_the_plan_priced_by_its_kernels_alone():
    graph = random_graph(3)
    candidates = enumerate_candidates(graph)
    alone = [1.0 + (c.id % 5) for c in candidates.candidates]
    priced = Priced(candidates.candidates, alone, alone)
    priced.time = lambda ids: {}
    segments = partition(graph, candidates)
    kernels, reports, _ = solve_segments(graph, candidates, segments, [0.5] * len(alone), None,
                                         measurer=priced, in_place=priced)
    best, _, _ = solve_segments(graph, candidates, segments, alone, None)
    assert sum(k.cost_s for k in kernels) == pytest.approx(sum(k.cost_s for k in best))
    assert not any(r.in_place_rounds or r.timed_in_place for r in reports)
