"""The korch pipeline in one function: model -> primitives -> candidates -> costs -> optimal plan.

``optimize`` reads as the list of its stages; each stage is timed under its name
for the report. Stages talk through plain data: the primitive ``Graph``, the
``CandidateSet``, per-segment ``Problem``s and the ``Plan``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from korch.errors import KorchError
from korch.ir import Graph
from korch.orchestrate.plan import Plan, PlannedKernel, SegmentReport

COST_MODELS = ("roofline", "measured")


@dataclasses.dataclass
class OptimizeResult:
    graph: Graph
    plan: Plan
    stage_seconds: dict[str, float]
    candidates: int
    rejected: dict[str, int]


class _Stages:
    """Times each named stage of the pipeline."""

    def __init__(self, on_stage: Callable[[str], None] | None):
        self.seconds: dict[str, float] = {}
        self.on_stage = on_stage

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.on_stage:
            self.on_stage(name)
        start = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - start


def optimize(model, *, target: str = "cpu", cost: str = "roofline", time_limit: float | None = None,
             cut_points: str | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
             max_kernel_nodes: int | None = None, on_stage: Callable[[str], None] | None = None,
             on_segment: Callable[[int, int], None] | None = None, db: str | None = None,
             jobs: int | None = None, on_kernel: Callable[[str], None] | None = None) -> OptimizeResult:
    """The optimal plan of ``model`` for ``target``.

    ``cost="roofline"`` prices every candidate at its lower bound; ``"measured"``
    builds, checks and times the candidates an optimal plan could use (lazily),
    remembering them in the profile database ``db`` (default: the cache directory).
    """
    from korch import config
    from korch.backends.registry import BackendPredicate, backends_for
    from korch.cost import candidate_bounds, get_device
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.orchestrate.partition import load_cut_points, partition, partition_at
    from korch.summary import load_model

    if cost not in COST_MODELS:
        raise KorchError(f"unknown cost model {cost!r}; known: {', '.join(COST_MODELS)}")
    if time_limit is not None and time_limit <= 0:
        raise KorchError(f"time limit must be positive, got {time_limit}")
    device = get_device(target)
    cuts = load_cut_points(cut_points) if cut_points else None
    stage = _Stages(on_stage)

    with stage("import and fission"):
        _, graph, _ = load_model(model, input_shapes)
    with stage("candidate kernels"):
        candidates = enumerate_candidates(graph, max_nodes=max_kernel_nodes or config.max_kernel_nodes,
                                          predicate=BackendPredicate(backends_for(target)))
    with stage("partition"):
        segments = partition_at(graph, candidates, cuts) if cuts else partition(
            graph, candidates, max_segment_nodes=config.max_segment_nodes)
    with stage("lower bounds"):
        bounds = candidate_bounds(graph, candidates.candidates, device)
    measurer = None
    if cost == "measured":
        from korch.backends.db import ProfileDB
        from korch.backends.measure import KernelMeasurer

        measurer = KernelMeasurer(graph, candidates.candidates, bounds, target=target, db=ProfileDB(db),
                                  jobs=jobs, on_kernel=on_kernel)
    try:
        with stage("measure and solve" if measurer else "solve"):
            kernels, reports = _solve_segments(graph, candidates, segments, bounds, time_limit, on_segment, measurer)
    finally:
        if measurer is not None:
            measurer.close()
    stats = {"primitive_nodes": len(graph.nodes), "candidates": len(candidates.candidates),
             "stage_seconds": stage.seconds}
    if measurer is not None:
        stats["measurement"] = _measurement_stats(measurer)
    plan = Plan(model=graph.name, target=device.name, cost_model=cost, kernels=tuple(kernels),
                segments=tuple(reports), stats=stats)
    return OptimizeResult(graph=graph, plan=plan, stage_seconds=stage.seconds,
                          candidates=len(candidates.candidates), rejected=dict(candidates.rejected))


def _measurement_stats(measurer) -> dict:
    st = measurer.stats
    return {"device": measurer.device_key, "backends": measurer.versions, "candidates": len(measurer.candidates),
            "signatures_asked": st.asked,
            "from_database": st.from_db, "kernels_measured": st.measured, "below_bound": st.below_bound,
            "failures": [dataclasses.asdict(f) for f in st.failures]}


class _SegmentOracle:
    """A segment's local candidate numbers -> the measurer's global ones."""

    def __init__(self, measurer, ids: Sequence[int]):
        self.measurer, self.ids = measurer, ids

    def measure(self, local_ids):
        got = self.measurer.measure([self.ids[c] for c in local_ids])
        return {c: got[self.ids[c]] for c in local_ids}


def _solve_segment(problem, ids, bounds, measurer, time_limit):
    """The segment's solution, with measured latencies when a measurer is given: (solution, latency by local id)."""
    from korch.orchestrate.lazy import solve_lazily
    from korch.orchestrate.solver import solve

    if measurer is None:
        return solve(problem, time_limit=time_limit), {}
    local_bounds = [bounds[i] for i in ids]
    known = measurer.known(ids)
    measured = {c: known[i] for c, i in enumerate(ids) if i in known}
    result = solve_lazily(problem, local_bounds, _SegmentOracle(measurer, ids), measured=measured,
                          time_limit=time_limit)
    return result.solution, {**measured, **result.measured}


def _solve_segments(graph, candidates, segments, bounds, time_limit, on_segment, measurer=None):
    from korch.orchestrate.problem import segment_problem
    from korch.orchestrate.signature import describe

    deadline = None if time_limit is None else time.perf_counter() + time_limit
    kernels: list[PlannedKernel] = []
    reports: list[SegmentReport] = []
    for number, segment in enumerate(segments):
        if on_segment:
            on_segment(number, len(segments))
        problem, ids = segment_problem(graph, candidates, segment, bounds)
        remaining = None if deadline is None else max(deadline - time.perf_counter(), 0.5)
        solution, latencies = _solve_segment(problem, ids, bounds, measurer, remaining)
        for local in solution.order:
            cand = candidates.candidates[ids[local]]
            nodes = sorted(cand.nodes)
            record = measurer.record_for(cand.id) if measurer else None
            kernels.append(PlannedKernel(
                name=f"k{len(kernels)}", nodes=tuple(graph.nodes[i].name for i in nodes),
                ops=describe(graph, cand.nodes), inputs=cand.inputs, outputs=cand.outputs,
                signature=cand.signature, cost_s=latencies.get(local, bounds[cand.id]), bound_s=bounds[cand.id],
                measured=local in latencies, backend=record.backend if record else "",
                launches=record.launches if record else 1, variant=record.variant if record else None))
        reports.append(SegmentReport(
            nodes=len(segment.nodes), candidates=len(ids), exact=segment.exact, dropped=segment.dropped,
            kernels=len(solution.order), objective_s=solution.objective, seconds=solution.seconds,
            optimal=solution.optimal, gap=solution.gap, cycle_cuts=solution.cycle_cuts))
    return kernels, reports
