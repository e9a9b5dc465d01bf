"""Partitioning: segments cover the graph, candidates land in one segment or are counted as dropped."""

import itertools
import random

import pytest

from korch.errors import KorchError
from korch.ir import Op
from korch.orchestrate.candidates import enumerate_candidates
from korch.orchestrate.partition import (
    load_cut_points,
    partition,
    partition_at,
    segment_outputs,
    separators,
)
from tests.orchestrate.test_candidates import FULL, _graph, random_graph


def crosses(nodes, segment_nodes):
    """Whether a candidate has nodes on both sides of one of the segment's two cuts."""
    first, last = min(segment_nodes), max(segment_nodes)
    return any(min(nodes) <= k < max(nodes) for k in (first - 1, last))


def check_segments(graph, cands, segments, limit=None):
    n = len(graph.nodes)
    start = 0
    for seg in segments:
        assert seg.nodes == frozenset(range(start, start + len(seg.nodes))), "segments are consecutive ranges"
        start += len(seg.nodes)
        if limit is not None:
            assert len(seg.nodes) <= limit
        assert all(cands.candidates[c].nodes <= seg.nodes for c in seg.candidate_ids)
        crossing = [c for c in cands.candidates if crosses(c.nodes, seg.nodes)]
        assert seg.exact == (not crossing)
    assert start == n
    placed = [c for seg in segments for c in seg.candidate_ids]
    assert len(placed) == len(set(placed))
    assert len(cands.candidates) - len(placed) == sum(seg.dropped for seg in segments)
    for c in cands.candidates:
        if c.id not in placed:
            assert any(crosses(c.nodes, seg.nodes) for seg in segments)


def live_after(graph, k):
    produced = {t for node in graph.nodes[:k + 1] for t in node.outputs}
    return {t for node in graph.nodes[k + 1:] for t in node.inputs if t in produced}


def test_separators_pass_at_most_one_tensor():
    for seed in range(100):
        graph = random_graph(seed)
        found = dict(separators(graph))
        for k in range(len(graph.nodes) - 1):
            live = live_after(graph, k)
            assert (k in found) == (len(live) <= 1)
            if k in found:
                assert live == ({found[k]} if found[k] else set())


def test_random_partitions():
    for seed in range(120):
        rng = random.Random(seed)
        graph = random_graph(seed)
        n = len(graph.nodes)
        cands = enumerate_candidates(graph, max_nodes=rng.randint(1, 6))
        limit = rng.randint(1, n + 2)
        segments = partition(graph, cands, max_segment_nodes=limit)
        check_segments(graph, cands, segments, limit)
        # without a limit, cuts are only at exact single-tensor separators
        whole = partition(graph, cands, max_segment_nodes=n)
        check_segments(graph, cands, whole, n)
        assert all(seg.exact for seg in whole)
        for seg in whole[:-1]:
            assert len(live_after(graph, max(seg.nodes))) <= 1


def test_partition_drops_the_fewest_candidates():
    for seed in range(200, 260):
        rng = random.Random(seed)
        graph = random_graph(seed, size=rng.randint(6, 10))
        n = len(graph.nodes)
        cands = enumerate_candidates(graph, max_nodes=rng.randint(2, 5))
        limit = rng.randint(2, n - 1)
        spans = [(min(c.nodes), max(c.nodes)) for c in cands.candidates]
        best = min(
            sum(any(lo <= k < hi for k in cuts) for lo, hi in spans)
            for r in range(n) for cuts in itertools.combinations(range(n - 1), r)
            if all(b - a <= limit for a, b in zip((-1, *cuts), (*cuts, n - 1))))
        segments = partition(graph, cands, max_segment_nodes=limit)
        assert sum(seg.dropped for seg in segments) == best


def test_chain_and_outputs_of_segments():
    g, b = _graph(FULL)
    x = "in0"
    for op in [Op.RELU, Op.EXP, Op.NEG, Op.SIGMOID, Op.TANH, Op.ABS]:
        x = b.emit(op, x)
    g.outputs = [x]
    assert [k for k, _ in separators(g)] == [0, 1, 2, 3, 4]
    cands = enumerate_candidates(g, max_nodes=2)
    segments = partition(g, cands, max_segment_nodes=3)
    check_segments(g, cands, segments, 3)
    assert [len(s.nodes) for s in segments] == [3, 3] and sum(s.dropped for s in segments) == 1
    assert segment_outputs(g, segments[0]) == (g.nodes[2].output,)
    assert segment_outputs(g, segments[1]) == (x,)
    (whole,) = partition(g, cands)
    assert whole.exact and len(whole.candidate_ids) == len(cands.candidates)


def test_cut_point_files(tmp_path):
    g, b = _graph(FULL)
    x = "in0"
    names = []
    for op in [Op.RELU, Op.EXP, Op.NEG, Op.SIGMOID]:
        x = b.emit(op, x)
        names.append(x)
    g.outputs = [x]
    good = tmp_path / "cuts.toml"
    good.write_text(f'cut_points = [[["in0"], ["{names[1]}"]], [["{names[1]}"], ["{names[3]}"]]]\n')
    points = load_cut_points(good)
    assert points == [(["in0"], [names[1]]), ([names[1]], [names[3]])]
    cands = enumerate_candidates(g, max_nodes=3)
    segments = partition_at(g, cands, points)
    assert [sorted(s.nodes) for s in segments] == [[0, 1], [2, 3]]
    check_segments(g, cands, segments)
    with pytest.raises(KorchError, match="unknown tensor"):
        partition_at(g, cands, [(["in0"], ["nope"])])
    bad = tmp_path / "bad.toml"
    bad.write_text("cut_points = [[[\n")
    for path, message in [(bad, "not valid TOML"), (tmp_path / "missing.toml", "cannot read")]:
        with pytest.raises(KorchError, match=message) as info:
            load_cut_points(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    for text in ['cuts = 1', 'cut_points = [["a", "b"]]', 'cut_points = [[["a"], ["b"], ["c"]]]',
                 'cut_points = [[["a"], [1]]]', 'cut_points = "x"']:
        wrong = tmp_path / "wrong.toml"
        wrong.write_text(text)
        with pytest.raises(KorchError, match="wrong.toml"):
            load_cut_points(wrong)


def test_zoo_candy_segments():
    from korch.pipeline import load_model

    _, graph, _ = load_model("zoo:candy")
    cands = enumerate_candidates(graph, max_nodes=8)
    for limit in (400, 100):
        segments = partition(graph, cands, max_segment_nodes=limit)
        check_segments(graph, cands, segments, limit)
        print(f"candy, max_segment_nodes={limit}: {len(segments)} segments, sizes "
              f"{[len(s.nodes) for s in segments]}, exact {[s.exact for s in segments]}, "
              f"dropped {sum(s.dropped for s in segments)} of {len(cands.candidates)} candidates")
    assert len(partition(graph, cands)) == 1  # 202 nodes: no cut needed
