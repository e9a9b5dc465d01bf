"""``korch db check``: every measured kernel of a model against its floor, the lower bound the search trusts.

The lazy search (``orchestrate/lazy.py``) proves a plan optimal only if no
unmeasured candidate can beat what it picked, which holds when every floor is
a true lower bound. A measured kernel faster than its floor disproves that
floor: the search raises such a measurement to the floor (``below_bound`` in
the report) and goes on, but the floor model is wrong for the device. This
check finds them: the model's candidates are enumerated as ``korch optimize``
does, each is bounded by the roofline model (with the products and convolutions the database holds timed
alone in every column, as the search bounds them: ``cost/parts.py``), and every record the profile
database holds for it (at the backends' current versions, less the backend's
calling cost, as the search sees it) is compared with that bound.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class BelowFloor:
    signature: str
    ops: str
    backend: str
    measured_s: float   # as the search sees it: measured, less the backend's calling cost
    floor_s: float


@dataclasses.dataclass(frozen=True)
class FloorCheck:
    device: str
    candidates: int
    signatures: int           # distinct candidate kernels
    records: int              # ok records of those compared with their floors
    below: tuple[BelowFloor, ...]


def check_floors(model, *, target: str, db=None, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 max_kernel_nodes: int | None = None) -> FloorCheck:
    """Compare every measured kernel of ``model``'s candidates on ``target`` with its floor (see the docstring)."""
    from korch.backends.db import ProfileDB
    from korch.backends.calling import CALLING_COST
    from korch.backends.measure_records import device_key, keyed_versions
    from korch.backends.registry import backends_for, device_for
    from korch.cost import candidate_bounds, measured_parts
    from korch.cost.roofline import BELOW_FLOOR_S
    from korch.pipeline import candidate_kernels, floor_device, load_model

    device = floor_device(target)  # the floors the search used
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(model, input_shapes)
    backends = backends_for(target)
    # with the channels-last columns a measured search measured too
    candidates = candidate_kernels(graph, target, "measured", max_kernel_nodes).candidates
    key = device_key(target)
    versions = keyed_versions(backends, device_for(target))
    profile = ProfileDB(str(db) if db else None)
    calling = {r.backend: r.latency_s for r in profile.lookup([CALLING_COST], key, versions)[CALLING_COST] if r.ok}
    found = profile.lookup({c.signature for c in candidates}, key, versions)

    def seen(record) -> float:  # as the search sees it
        return max(record.latency_s - calling.get(record.backend, 0.0), 0.0)

    best = {s: min(seen(r) for r in records if r.ok) for s, records in found.items() if any(r.ok for r in records)}
    # the floors a search that measured these products and convolutions alone used (``cost/parts.py``)
    parts = measured_parts(graph, candidates, lambda ids: {c: best[candidates[c].signature] for c in ids
                                                          if candidates[c].signature in best})
    bounds = candidate_bounds(graph, candidates, device, parts=parts)
    floor: dict[str, tuple[float, str]] = {}
    for candidate, bound in zip(candidates, bounds):
        ops = "+".join(graph.nodes[i].op.value for i in sorted(candidate.nodes))
        if candidate.signature not in floor or bound > floor[candidate.signature][0]:
            floor[candidate.signature] = (bound, ops)
    below, compared = [], 0
    for signature, records in found.items():
        bound, ops = floor[signature]
        for record in (r for r in records if r.ok):
            compared += 1
            latency = seen(record)
            if latency < bound - BELOW_FLOOR_S:
                below.append(BelowFloor(signature, ops, record.backend, latency, bound))
    below.sort(key=lambda b: b.measured_s / b.floor_s)
    return FloorCheck(key, len(candidates), len(floor), compared, tuple(below))
