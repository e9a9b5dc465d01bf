"""Solving a model segment by segment into the plan's kernels, priced by bounds or measured lazily.

``solve_segments`` turns each segment of the partition into its ``Problem``,
solves it (``solver.solve`` on lower bounds, or ``lazy.solve_lazily`` with a
measurer that builds and times the candidates an optimum could use) and
returns the chosen candidates as ``PlannedKernel``s in an executable order,
with one ``SegmentReport`` per segment. The measurer is any object with
``known``, ``measure`` and ``record_for`` (``backends.measure.KernelMeasurer``);
an in-place timer (``backends.in_place.InPlaceTimer``) prices the optimum's
kernels as they run in sequence (``time``), and answers with the prices an
earlier search of the model found (``known``). This layer never builds a
kernel itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from korch.ir import Graph
from korch.orchestrate.candidates import CandidateSet
from korch.orchestrate.lazy import solve_lazily
from korch.orchestrate.partition import Segment
from korch.orchestrate.layouts import Conversion, contiguous_columns
from korch.orchestrate.plan import PlannedConversion, PlannedKernel, SegmentReport
from korch.orchestrate.problem import segment_problem
from korch.orchestrate.signature import describe
from korch.orchestrate.solver import solve


def measurement_stats(measurer) -> dict:
    """What the measurer did, for the plan's stats and the report."""
    st = measurer.stats
    signatures = len({c.signature for c in measurer.candidates})
    return {"device": measurer.device_key, "backends": measurer.versions, "candidates": len(measurer.candidates),
            "signatures": signatures, "signatures_asked": st.asked,
            "measured_share": st.asked / signatures if signatures else 0.0,
            "from_database": st.from_db, "kernels_measured": st.measured, "below_bound": st.below_bound,
            "disturbed": st.disturbed, "timed_in_graph": st.graphed,
            "build_s": st.build_s, "timing_s": st.timing_s,
            "failures": [dataclasses.asdict(f) for f in st.failures]}


class _SegmentOracle:
    """A segment's local candidate numbers -> the measurer's global ones. A measured kernel answers for every
    candidate of the segment that is the same kernel (its signature): the lazy search then prices them at once
    instead of at their floors until a plan picks them (Candy: 2566 candidates, 916 signatures)."""

    def __init__(self, measurer, ids: Sequence[int]):
        self.measurer, self.ids = measurer, ids
        self.same: dict[str, list[int]] = defaultdict(list)  # signature -> local ids
        for c, i in enumerate(ids):
            self.same[measurer.candidates[i].signature].append(c)

    def measure(self, local_ids):
        asked = set(local_ids)
        signatures = {self.measurer.candidates[self.ids[c]].signature for c in asked}
        answered = [*local_ids, *(c for s in signatures for c in self.same[s] if c not in asked)]
        got = self.measurer.measure([self.ids[c] for c in answered])  # the twins are looked up, not built
        return {c: got[self.ids[c]] for c in answered}


def _solve_segment(problem, ids, bounds, measurer, time_limit, first, in_place=None, measure_ahead=0):
    """The segment's solution, with measured latencies when a measurer is given: (solution, latency by local id,
    what the solves took: ``SegmentReport``'s solves, proofs, solve_s, dominated and in-place fields). Local ids
    past ``ids`` are layout conversions, priced in ``problem.costs`` already; ``first``, the columns whose optimum
    starts the search (``Solver.solve``); ``in_place``, a timer of kernels in sequence (``InPlaceTimer``);
    ``measure_ahead``, columns a round may measure beside its plan's (``solve_lazily``)."""
    if measurer is None:
        solution = solve(problem, time_limit=time_limit, first=first)
        return solution, {}, {"solves": 1, "proofs": 1, "solve_s": solution.seconds}
    moves = range(len(ids), len(problem.costs))
    local_bounds = [bounds[i] for i in ids] + [problem.costs[c] for c in moves]
    known = measurer.known(ids)
    measured = {c: known[i] for c, i in enumerate(ids) if i in known} | {c: problem.costs[c] for c in moves}

    def in_sequence(order):  # the plan's kernels timed in its order; its conversions keep their prices
        timed = in_place.time([ids[c] for c in order if c < len(ids)])
        return timed and {c: timed[ids[c]] if c < len(ids) else problem.costs[c] for c in order}

    earlier = in_place.known([i for c, i in enumerate(ids) if c in measured]) if in_place else {}
    result = solve_lazily(problem, local_bounds, _SegmentOracle(measurer, ids), measured=measured,
                          time_limit=time_limit, first=first, in_place=in_sequence if in_place else None,
                          placed={c: earlier[i] for c, i in enumerate(ids) if i in earlier},
                          measure_ahead=measure_ahead)
    solving = {"solves": result.rounds, "proofs": result.proofs, "solve_s": result.solve_s,
               "dominated": result.dominated, "in_place_rounds": result.sequences,
               "timed_in_place": sum(c in result.placed for c in result.solution.order if c < len(ids))}
    return result.solution, {**measured, **result.measured, **result.placed}, solving


def solve_segments(graph: Graph, candidates: CandidateSet, segments: Sequence[Segment], bounds: Sequence[float],
                   time_limit: float | None, on_segment: Callable[[int, int], None] | None = None,
                   measurer=None, conversion_cost: Callable[[Conversion], float] | None = None, in_place=None,
                   measure_ahead: int = 0) \
        -> tuple[list[PlannedKernel], list[SegmentReport], list[PlannedConversion]]:
    """The plan's kernels in execution order, a report per segment (``time_limit``: seconds for all), and the
    layout conversions chosen (``conversion_cost`` prices them, when candidates have layout columns). ``in_place``
    (with a measurer): ``time(candidate_ids)`` times kernels in that order, in sequence, and the optimum is priced
    in place (``_solve_segment``); ``measure_ahead``, columns each round may measure beside its plan's."""
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    kernels: list[PlannedKernel] = []
    reports: list[SegmentReport] = []
    moves: list[PlannedConversion] = []
    for number, segment in enumerate(segments):
        if on_segment:
            on_segment(number, len(segments))
        problem, ids, conversions = segment_problem(graph, candidates, segment, bounds, conversion_cost)
        remaining = None if deadline is None else max(deadline - time.perf_counter(), 0.5)
        solution, latencies, solving = _solve_segment(problem, ids, bounds, measurer, remaining,
                                                      contiguous_columns(candidates, ids, conversions), in_place,
                                                      measure_ahead)
        for local in solution.order:
            if local >= len(ids):
                move = conversions[local - len(ids)]
                moves.append(PlannedConversion(tensor=move.tensor, to=move.to, cost_s=problem.costs[local],
                                               before=f"k{len(kernels)}"))
                continue
            cand = candidates.candidates[ids[local]]
            nodes = sorted(cand.nodes)
            record = measurer.record_for(cand.id) if measurer else None
            kernels.append(PlannedKernel(
                name=f"k{len(kernels)}", nodes=tuple(graph.nodes[i].name for i in nodes),
                ops=describe(graph, cand.nodes), inputs=cand.inputs, outputs=cand.outputs,
                signature=cand.signature, cost_s=latencies.get(local, bounds[cand.id]), bound_s=bounds[cand.id],
                measured=local in latencies, backend=record.backend if record else "",
                launches=record.launches if record else 1, variant=record.variant if record else None,
                layout=cand.layout))
        reports.append(SegmentReport(
            nodes=len(segment.nodes), candidates=len(ids), exact=segment.exact, dropped=segment.dropped,
            kernels=len(solution.order), objective_s=solution.objective, seconds=solution.seconds,
            optimal=solution.optimal, gap=solution.gap, cycle_cuts=solution.cycle_cuts, **solving))
    return kernels, reports, moves
