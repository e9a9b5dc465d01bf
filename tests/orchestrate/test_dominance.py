"""Columns that measured columns replace at no greater cost: left out, the optimum stays."""

import dataclasses
import math

import numpy as np
import pytest

from korch.orchestrate.dominance import Replacements
from korch.orchestrate.lazy import solve_lazily
from korch.orchestrate.problem import Problem
from korch.orchestrate.solver import solve
from tests.orchestrate.random_problems import random_problem, subset_minimum
from tests.orchestrate.test_lazy import Oracle

# a chain x -> y -> z (tensors 0, 1, 2; z required), primitives as pseudo-tensors 10, 11, 12
X, Y, Z, XY, YZ, XYZ = range(6)
CHAIN = Problem(costs=(1.0, 1.0, 1.0, 1.5, 3.0, 2.5),
                needs=((), (0,), (1,), (), (0,), ()),
                produces=((0, 10), (1, 11), (2, 12), (1, 10, 11), (2, 11, 12), (2, 10, 11, 12)),
                required=(2, 10, 11, 12), computed=(10, 11, 12))


def test_a_kernel_dearer_than_measured_parts_is_left_out_and_replacements_compose():
    true = dict(enumerate(CHAIN.costs))
    # y+z (3.0) costs more than y then z (2.0); x+y+z (2.5) no more than x+y then z: the fused x+y stays
    assert Replacements(CHAIN).dominated(CHAIN.costs, true) == {YZ, XYZ}
    # x+y+z at 3.5 is replaced by x, y, z (3.0) through x+y's own replacement, although x+y (1.5) costs more
    # than no part of it: parts are found smallest first
    costs = (1.0, 1.0, 1.0, 2.5, 3.0, 3.5)
    assert Replacements(CHAIN).dominated(costs, dict(enumerate(costs))) == {XY, YZ, XYZ}


def test_only_measured_parts_replace_a_kernel_and_a_floor_is_compared_with_them():
    # z unmeasured: nothing that needs z as a part is replaced; y+z's floor of 2.0 meets y's and z's... z is a floor
    true = {X: 1.0, Y: 1.0, XY: 1.5, YZ: 3.0}
    assert Replacements(CHAIN).dominated(CHAIN.costs, true) == set()
    # the unmeasured x+y+z with a floor of 2.5 >= x+y (1.5) then z (1.0): left out without a measurement
    true = {X: 1.0, Y: 1.0, Z: 1.0, XY: 1.5}
    low = (1.0, 1.0, 1.0, 1.5, 0.5, 2.5)
    assert Replacements(CHAIN).dominated(low, true) == {XYZ}
    assert Replacements(CHAIN).dominated((1.0, 1.0, 1.0, 1.5, 0.5, 2.4), true) == set()


def test_parts_that_need_each_others_outputs_replace_nothing():
    # k computes primitives 10 and 11 from nothing; a and b each compute one but need what the other writes
    p = Problem(costs=(1.0, 1.0, 5.0), needs=((1,), (0,), ()), produces=((0, 10), (1, 11), (0, 1, 10, 11)),
                required=(0, 1, 10, 11), computed=(10, 11))
    assert Replacements(p).dominated(p.costs, dict(enumerate(p.costs))) == set()
    # parts that write less than k replace nothing either
    p = dataclasses.replace(p, needs=((), (), ()), produces=((10,), (1, 11), (0, 1, 10, 11)))
    assert Replacements(p).dominated(p.costs, dict(enumerate(p.costs))) == set()


def test_without_primitive_pseudo_tensors_nothing_is_left_out():
    p = dataclasses.replace(CHAIN, computed=())
    assert Replacements(p).dominated(p.costs, dict(enumerate(p.costs))) == set()


def _without(p: Problem, out: set[int]) -> Problem:
    return dataclasses.replace(p, costs=tuple(math.inf if c in out else x for c, x in enumerate(p.costs)))


def test_small_random_problems_keep_their_optimum_over_every_subset():
    rng = np.random.default_rng(0)
    left_out = checked = 0
    while checked < 60:
        p = random_problem(rng, int(rng.integers(4, 8)), 3, computed=True, max_preds=2)
        if len(p.costs) > 16:
            continue
        out = Replacements(p).dominated(p.costs, dict(enumerate(p.costs)))
        assert subset_minimum(_without(p, out)) == pytest.approx(subset_minimum(p), rel=1e-12)
        left_out, checked = left_out + len(out), checked + 1
    assert left_out > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_larger_random_problems_keep_their_optimum_with_fewer_columns(seed):
    p = random_problem(np.random.default_rng(seed), 60, 4, computed=True, max_preds=2, window=5)
    out = Replacements(p).dominated(p.costs, dict(enumerate(p.costs)))
    assert len(out) > len(p.costs) / 10
    assert solve(_without(p, out)).objective == pytest.approx(solve(p).objective, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_lazy_search_leaves_dominated_columns_out_and_finds_the_optimum_of_measuring_everything(seed):
    p = random_problem(np.random.default_rng(seed), 60, 4, computed=True, max_preds=2, window=5)
    bounds = tuple(c / 3 for c in p.costs)  # floors a third of the truth or less: the oracle's factor is 1-3x
    oracle = Oracle(p.costs, seed)
    result = solve_lazily(p, bounds, oracle)
    everything = solve(dataclasses.replace(p, costs=tuple(oracle.latency)))
    assert result.solution.optimal
    assert result.solution.objective == pytest.approx(everything.objective, rel=1e-9)
