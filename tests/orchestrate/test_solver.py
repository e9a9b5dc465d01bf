"""The orchestration program: hand-built optima, brute force on random problems, time limits."""

import math

import highspy
import numpy as np
import pytest

from korch.orchestrate.problem import Problem
from korch.orchestrate.schedule import Index
from korch.orchestrate.solver import InfeasibleError, Solver, solve
from korch.orchestrate import solver as solver_module
from tests.orchestrate.random_problems import (
    executes,
    has_cycle,
    random_problem,
    state_minimum,
    subset_minimum,
)


def problem(costs, needs, produces, required) -> Problem:
    return Problem(tuple(map(float, costs)), tuple(map(tuple, needs)), tuple(map(tuple, produces)), tuple(required))


def check(p: Problem, solution, optimum: float) -> None:
    assert executes(p, solution.order)
    assert solution.objective == pytest.approx(math.fsum(p.costs[c] for c in solution.order), rel=1e-12)
    assert solution.objective == pytest.approx(optimum, rel=1e-9)
    assert solution.optimal and solution.gap == 0.0


def test_fusing_a_chain_wins():
    # node i writes tensor i: 0 -> 1 -> 2; candidates {0} {1} {2} {0,1} {1,2} {0,1,2}
    p = problem([3, 3, 3, 4, 4, 5], needs=[[], [0], [1], [], [0], []],
                produces=[[0], [1], [2], [1], [2], [2]], required=[2])
    solution = solve(p)
    check(p, solution, 5.0)
    assert solution.order == (5,)


def test_redundant_computation_wins_on_a_diamond():
    # a=0 feeds b=1 and c=2, which feed d=3; {a,b} and {a,c} both compute a
    p = problem([5, 5, 5, 1, 2, 2], needs=[[], [0], [0], [1, 2], [], []],
                produces=[[0], [1], [2], [3], [0, 1], [0, 2]], required=[3])
    solution = solve(p)
    check(p, solution, 5.0)
    assert sorted(solution.order) == [3, 4, 5] and solution.order[-1] == 3


# a=0 -> b=1, c=2 -> b, c -> d=3, a -> d; required b and d. K1 = {a, d} reads c and
# writes a and d; K2 = {c, b} reads a and writes c and b: together they satisfy
# every constraint of the paper's program at cost 2, but neither can run first.
CYCLE = problem([1, 1, 2, 2, 2, 2], needs=[[2], [0], [], [0, 2], [], [2, 0]],
                produces=[[0, 3], [2, 1], [0], [1], [2], [3]], required=[1, 3])


@pytest.mark.parametrize("cutsets", [True, False])
def test_two_multi_output_kernels_feeding_each_other_are_not_a_plan(cutsets):
    solution = Solver(CYCLE, cutsets=cutsets).solve()
    check(CYCLE, solution, 4.0)  # one of them recomputes a (or c) from scratch first
    assert set(solution.order) in ({2, 1, 0}, {4, 0, 1})
    if not cutsets:
        assert solution.cycle_cuts > 0


def test_kernels_that_can_only_feed_each_other_are_infeasible():
    p = problem([1, 1], needs=[[2], [0]], produces=[[0, 3], [2, 1]], required=[1, 3])
    with pytest.raises(InfeasibleError, match="can never run"):
        solve(p)


def test_a_required_tensor_nobody_writes_is_infeasible():
    p = problem([1, 1], needs=[[], [0]], produces=[[0], [1]], required=[1, 7])
    with pytest.raises(InfeasibleError, match=r"required tensor 7 is produced by no candidate") as info:
        solve(p)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_infinite_cost_excludes_a_candidate():
    p = problem([1, math.inf, 5], needs=[[], [0], [0]], produces=[[0], [1], [1]], required=[1])
    assert solve(p).order == (0, 2)
    with pytest.raises(InfeasibleError, match="excluded"):
        solve(problem([1, math.inf], needs=[[], [0]], produces=[[0], [1]], required=[1]))


def test_malformed_problems_are_refused():
    with pytest.raises(ValueError, match="costs must be >= 0"):
        problem([float("nan")], needs=[[]], produces=[[0]], required=[0])
    with pytest.raises(ValueError, match="one of each per candidate"):
        Problem((1.0,), ((), ()), ((0,),), (0,))


def test_a_problem_with_nothing_required_selects_nothing():
    solution = solve(problem([1], needs=[[]], produces=[[0]], required=[]))
    assert solution.order == () and solution.objective == 0 and solution.optimal


def test_a_solver_re_solves_with_other_costs():
    solver = Solver(CYCLE)
    assert solver.solve().objective == pytest.approx(4.0)
    solution = solver.solve([1, 1, 2, 2, math.inf, 0.5])  # {a} -> K2 -> {d} is now the best
    assert set(solution.order) == {2, 1, 5} and solution.objective == pytest.approx(3.5)


def random_problems(count: int, seed: int, nodes: tuple[int, int], max_candidates: int, **dag) -> list[Problem]:
    rng = np.random.default_rng(seed)
    problems = []
    while len(problems) < count:
        p = random_problem(rng, int(rng.integers(*nodes)), int(rng.integers(2, 6)), **dag)
        if len(p.costs) <= max_candidates:
            problems.append(p)
    return problems


def test_small_random_problems_match_brute_force_over_every_subset():
    cyclic = lazily_cut = 0
    for p in random_problems(300, seed=0, nodes=(5, 10), max_candidates=18):
        optimum = subset_minimum(p)
        assert state_minimum(p) == pytest.approx(optimum, rel=1e-12)  # two references agree
        check(p, solve(p), optimum)
        lazy = Solver(p, cutsets=False).solve()
        check(p, lazy, optimum)
        cyclic += has_cycle(p)
        lazily_cut += lazy.cycle_cuts > 0
    print(f"300 problems, {cyclic} with candidates that need each other in a cycle, "
          f"{lazily_cut} cut lazily without cut-set rows")
    assert cyclic > 0 and lazily_cut > 0


def test_columns_out_of_reach_are_in_no_cheaper_plan():
    """``could_improve``: a column it leaves out is in no plan cheaper than the given cost (brute force over the
    subsets that hold it), and it does leave columns out."""
    out_of_reach = 0
    rng = np.random.default_rng(7)
    for p in random_problems(120, seed=2, nodes=(5, 10), max_candidates=16):
        solver = Solver(p)
        optimum = solver.solve().objective
        upper = optimum * float(rng.uniform(1.0, 1.5))
        reach = solver.could_improve(upper)
        assert len(reach) == len(set(reach))
        for c in set(range(len(p.costs))) - set(reach):
            assert subset_minimum(p, containing=c) > upper * (1 - 1e-9)
            out_of_reach += 1
    print(f"{out_of_reach} columns out of reach")
    assert out_of_reach > 0


def test_larger_random_problems_match_a_search_over_available_tensors():
    cyclic = lazily_cut = 0
    for p in random_problems(300, seed=1, nodes=(5, 13), max_candidates=150, max_preds=3):
        optimum = state_minimum(p)
        check(p, solve(p), optimum)
        lazy = Solver(p, cutsets=False).solve()
        check(p, lazy, optimum)
        cyclic += has_cycle(p)
        lazily_cut += lazy.cycle_cuts > 0
    print(f"300 problems, {cyclic} with cycles, {lazily_cut} cut lazily without cut-set rows")
    assert cyclic > 0 and lazily_cut > 0


class SolverClock:
    """Stands in for the solver's ``time`` module and watches HiGHS: the clock reads 0 s until it strikes, then
    1e9 s, so a time limit (1000 s in these tests) runs out at a point of the solve the test picks (after
    ``reads`` reads of the clock, or after ``runs`` runs of HiGHS), never at one the machine's speed picks."""

    def __init__(self, reads=math.inf, runs=math.inf):
        self.reads, self.runs = reads, runs
        self.count = 0
        self.struck = False
        self.limits = []  # per HiGHS run: (the time limit HiGHS was given, whether the clock had struck)

    def perf_counter(self):
        self.count += 1
        self.struck = self.struck or self.count > self.reads
        return 1e9 if self.struck else 0.0

    def ran(self, time_limit):
        self.limits.append((time_limit, self.struck))
        self.struck = self.struck or len(self.limits) >= self.runs


@pytest.fixture
def use_clock(monkeypatch):
    """``use_clock(clock)``: the solver reads ``clock``, and every HiGHS run is reported to it."""
    current = []
    real_run = highspy.Highs.run

    def run(h):
        limit = h.getOptionValue("time_limit")
        outcome = real_run(h)
        if current:  # solves before the first use_clock run on the real clock
            current[-1].ran(limit[1] if isinstance(limit, tuple) else limit)
        return outcome

    monkeypatch.setattr(highspy.Highs, "run", run)

    def use(clock):
        current.append(clock)
        monkeypatch.setattr(solver_module, "time", clock)
        return clock
    return use


def removable(p: Problem, order) -> list[int]:
    """The kernels of ``order`` whose removal leaves a plan that still runs in some order."""
    ix = Index(p)
    return [c for c in order if executes(p, ix.run(ix.mask([d for d in order if d != c]))[0])]


def check_limited(p: Problem, solution, optimum: float) -> None:
    """An executable plan, its true cost, and an honest gap: the bound it implies is below the optimum; no kernel
    of it is redundant."""
    assert executes(p, solution.order)
    assert not [c for c in removable(p, solution.order) if p.costs[c] > 0]
    assert solution.objective == pytest.approx(math.fsum(p.costs[c] for c in solution.order), rel=1e-12)
    assert solution.objective >= optimum * (1 - 1e-9)
    assert 0.0 <= solution.gap <= 1.0
    assert solution.objective * (1 - solution.gap) <= optimum * (1 + 1e-7)  # the bound is a bound
    assert solution.gap == 0.0 if solution.optimal else solution.gap > 0.0


def test_a_zero_time_limit_returns_the_greedy_plan_without_solving(monkeypatch):
    p = random_problem(np.random.default_rng(0), 100, 5, max_preds=2, window=6)
    optimum = solve(p).objective

    def no_time_left(*args, **kwargs):
        raise AssertionError("no LP may be solved with no time left")

    monkeypatch.setattr(Solver, "_dive", no_time_left)
    monkeypatch.setattr(Solver, "_mip", no_time_left)
    solution = solve(p, time_limit=0.0)
    check_limited(p, solution, optimum)
    assert not solution.optimal and solution.gap == 1.0  # no lower bound known yet
    assert solution.objective > optimum * (1 + 1e-6)  # the greedy plan is not this problem's optimum


def test_a_time_limit_returns_an_executable_plan_and_an_honest_gap(use_clock):
    p = random_problem(np.random.default_rng(0), 100, 5, max_preds=2, window=6)
    optimum = solve(p).objective
    greedy = solve(p, time_limit=0.0).objective
    unlimited = use_clock(SolverClock())
    assert Solver(p).solve(time_limit=1000).objective == pytest.approx(optimum, rel=1e-9)
    outcomes = set()
    for reads in range(1, unlimited.count + 1):  # the limit strikes after the start is read, after 1, 2, ... reads
        clock = use_clock(SolverClock(reads=reads))
        solution = Solver(p).solve(time_limit=1000)
        check_limited(p, solution, optimum)
        # HiGHS is never given more time than is left: all of it before the limit strikes, none after
        assert all(limit == 0.0 if struck else 0.0 < limit <= 1000 for limit, struck in clock.limits)
        if solution.gap == 1.0:
            assert solution.objective == greedy
        outcomes.add("optimal" if solution.optimal else "bounded" if solution.gap < 1.0 else "greedy")
    assert solution.optimal and solution.objective == pytest.approx(optimum, rel=1e-9)  # all reads: no limit hit
    assert outcomes == {"optimal", "bounded", "greedy"}  # the limit struck before, during and after the search


def test_a_big_problem_whose_time_runs_out_after_the_first_lp(use_clock):
    p = random_problem(np.random.default_rng(0), 2000, 5, max_preds=2, window=6)
    assert len(p.costs) > 15_000
    clock = use_clock(SolverClock(runs=1))
    solution = solve(p, time_limit=1000)
    assert executes(p, solution.order)
    assert solution.objective == pytest.approx(math.fsum(p.costs[c] for c in solution.order), rel=1e-12)
    assert not solution.optimal and 0.0 < solution.gap < 1.0  # the LP relaxation's bound, an unproven plan
    (first, _), *after = clock.limits
    assert first == 1000 and all(limit == 0.0 and struck for limit, struck in after)
    print(f"{len(p.costs)} candidates: gap={solution.gap:.2e} after one LP")


def test_a_value_computed_twice_keeps_the_cheaper_writer():
    # kernel 0 writes x; kernel 1 writes x and y; kernel 2 reads x: the first writer of x is redundant
    p = problem([5, 3, 1], [(), (), (0,)], [(0,), (0, 1), (2,)], [1, 2])
    ix = Index(p)
    assert ix.prune([0, 1, 2]) == [0, 1, 2]  # every kernel is some tensor's first writer
    assert ix.drop_redundant([0, 1, 2], p.costs) == [1, 2]
    # the only writer of a tensor the plan reads stays, however dear
    q = problem([50, 3, 1], [(), (), (0,)], [(0,), (1,), (2,)], [1, 2])
    assert Index(q).drop_redundant([0, 1, 2], q.costs) == [0, 1, 2]


def test_dropping_redundant_kernels_leaves_a_cheaper_executable_plan_with_none_left():
    rng = np.random.default_rng(7)
    dropped = 0
    for trial in range(40):
        p = random_problem(rng, 14, 4, computed=bool(trial % 2), max_preds=2, window=5)
        ix = Index(p)
        # a plan and then random extra kernels that can run: plenty of values written twice
        base = list(solve(p).order)
        extra = [int(c) for c in rng.choice(len(p.costs), size=min(len(p.costs), 12), replace=False)]
        order = ix.run(ix.mask(base + extra))[0]
        assert executes(p, order)
        kept = ix.drop_redundant(order, p.costs)
        assert executes(p, kept) and set(kept) <= set(order)
        assert math.fsum(p.costs[c] for c in kept) <= math.fsum(p.costs[c] for c in order)
        assert removable(p, kept) == []
        dropped += len(order) - len(kept)
    assert dropped > 40  # the extra kernels were mostly redundant, and went
