"""The segment oracle: a measured kernel answers for every candidate that is the same kernel."""

from types import SimpleNamespace

from korch.orchestrate.segments import _SegmentOracle


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
