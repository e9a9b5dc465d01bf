"""An unproven measured plan challenged by the plan the floors alone choose.

A measured search that stops at its time limit has measured some of the candidates and takes the rest at their
floors, which are far below what they run in (issue 14): its plan can run slower than the plan ``--cost roofline``
makes in seconds. YOLOX-Nano's search of 9,632 signatures stops after measuring a tenth of them; its plan ran
9.4-9.7 ms where the floors' plan ran 8.2 (``BENCHMARKS.md``). So where a measured plan is not proven and a
compiled unit is built, ``floors_plan`` solves the floors' program too, its unit is compiled as the measured
plan's unit chose (``runtime.unit.challenge_plan``), the two take turns, and ``challenged`` keeps the faster
plan, the search's statistics and the challenge recorded in its stats ("plan challenge").
``config.plan_challenge`` (``KORCH_PLAN_CHALLENGE=0``) turns it off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from korch import config
from korch.errors import one_line
from korch.orchestrate.plan import Plan, SegmentReport
from korch.orchestrate.segments import solve_segments

# Seconds the floors' plan that challenges an unproven measured plan may take to solve
FLOORS_PLAN_LIMIT_S = 60.0


def wanted(cost: str, target: str, reports: Sequence[SegmentReport]) -> bool:
    """Whether a search's plan is challenged (where a compiled unit is built): measured, unproven, on a CPU."""
    return config.plan_challenge and cost == "measured" and target == "cpu" and not all(r.optimal for r in reports)


def floors_plan(graph, target: str, device, max_kernel_nodes: int | None, cuts) -> Plan:
    """The plan the floors alone choose (``--cost roofline``'s), to challenge an unproven measured plan."""
    from korch.cost import candidate_bounds
    from korch.orchestrate.partition import partition, partition_at
    from korch.pipeline import candidate_kernels

    candidates = candidate_kernels(graph, target, "roofline", max_kernel_nodes)
    segments = partition_at(graph, candidates, cuts) if cuts else partition(
        graph, candidates, max_segment_nodes=config.max_segment_nodes)
    bounds = candidate_bounds(graph, candidates.candidates, device)
    kernels, reports, conversions = solve_segments(graph, candidates, segments, bounds, FLOORS_PLAN_LIMIT_S)
    return Plan(model=graph.name, target=device.name, cost_model="roofline", kernels=tuple(kernels),
                segments=tuple(reports), stats={"candidates": len(candidates.candidates)},
                conversions=tuple(conversions))


def challenged(result, choice: dict, data: bytes, device: str) -> tuple[bytes, Plan]:
    """The unit of ``result.plan`` or of its challenger, the floors' plan, whichever runs faster
    (``unit.challenge_plan``), and that plan, which ``result.plan`` becomes: its stats the search's with the
    challenge recorded."""
    from korch.runtime import unit

    plan, challenger = result.plan, result.challenger
    if [k.nodes for k in challenger.kernels] == [k.nodes for k in plan.kernels]:
        return data, plan
    try:
        theirs, measured = unit.challenge_plan(result.graph, data, choice, challenger, device)
    except Exception as exc:  # Inductor's failures are many: the measured plan's unit stands
        result.plan = dataclasses.replace(plan, stats={**plan.stats, "plan challenge": {
            "kept": "measured", "failed": one_line(exc, 200)}})
        return data, result.plan
    record = {"measured plan ms": measured["plan"], "floors' plan ms": measured["challenger"],
              "kept": "floors'" if theirs is not None else "measured"}
    kept = challenger if theirs is not None else plan
    result.plan = dataclasses.replace(kept, stats={**plan.stats, "plan challenge": record})
    return (theirs if theirs is not None else data), result.plan
