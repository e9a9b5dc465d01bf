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
             on_segment: Callable[[int, int], None] | None = None) -> OptimizeResult:
    from korch import config
    from korch.cost import candidate_bounds, get_device
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.orchestrate.partition import load_cut_points, partition, partition_at
    from korch.summary import load_model

    if cost not in COST_MODELS:
        raise KorchError(f"unknown cost model {cost!r}; known: {', '.join(COST_MODELS)}")
    if cost == "measured":
        raise KorchError("--cost measured needs the kernel backends, which are not built yet; use --cost roofline")
    if time_limit is not None and time_limit <= 0:
        raise KorchError(f"time limit must be positive, got {time_limit}")
    device = get_device(target)
    cuts = load_cut_points(cut_points) if cut_points else None
    stage = _Stages(on_stage)

    with stage("import and fission"):
        _, graph, _ = load_model(model, input_shapes)
    with stage("candidate kernels"):
        candidates = enumerate_candidates(graph, max_nodes=max_kernel_nodes or config.max_kernel_nodes)
    with stage("partition"):
        segments = partition_at(graph, candidates, cuts) if cuts else partition(
            graph, candidates, max_segment_nodes=config.max_segment_nodes)
    with stage("lower bounds"):
        bounds = candidate_bounds(graph, candidates.candidates, device)
    with stage("solve"):
        kernels, reports = _solve_segments(graph, candidates, segments, bounds, time_limit, on_segment)
    plan = Plan(model=graph.name, target=device.name, cost_model=cost, kernels=tuple(kernels),
                segments=tuple(reports),
                stats={"primitive_nodes": len(graph.nodes), "candidates": len(candidates.candidates),
                       "stage_seconds": stage.seconds})
    return OptimizeResult(graph=graph, plan=plan, stage_seconds=stage.seconds,
                          candidates=len(candidates.candidates), rejected=dict(candidates.rejected))


def _solve_segments(graph, candidates, segments, bounds, time_limit, on_segment):
    from korch.orchestrate.problem import segment_problem
    from korch.orchestrate.signature import describe
    from korch.orchestrate.solver import solve

    deadline = None if time_limit is None else time.perf_counter() + time_limit
    kernels: list[PlannedKernel] = []
    reports: list[SegmentReport] = []
    for number, segment in enumerate(segments):
        if on_segment:
            on_segment(number, len(segments))
        problem, ids = segment_problem(graph, candidates, segment, bounds)
        remaining = None if deadline is None else max(deadline - time.perf_counter(), 0.5)
        solution = solve(problem, time_limit=remaining)
        for local in solution.order:
            cand = candidates.candidates[ids[local]]
            nodes = sorted(cand.nodes)
            kernels.append(PlannedKernel(
                name=f"k{len(kernels)}", nodes=tuple(graph.nodes[i].name for i in nodes),
                ops=describe(graph, cand.nodes), inputs=cand.inputs, outputs=cand.outputs,
                signature=cand.signature, cost_s=bounds[cand.id], bound_s=bounds[cand.id], measured=False))
        reports.append(SegmentReport(
            nodes=len(segment.nodes), candidates=len(ids), exact=segment.exact, dropped=segment.dropped,
            kernels=len(solution.order), objective_s=solution.objective, seconds=solution.seconds,
            optimal=solution.optimal, gap=solution.gap, cycle_cuts=solution.cycle_cuts))
    return kernels, reports
