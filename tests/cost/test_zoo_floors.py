"""No measured kernel of the zoo beats its floor: the promise the measured search's proof of optimality rests on.

``tests/data/zoo_cpu_latencies.json`` holds every candidate kernel of three zoo
models measured on one host (the fastest backend's latency less its calling
cost, as the search sees it) with that host's probe record, written by
``benchmarks/floor_share.py --export``. The floors are computed here from the
same record, so a floor model that claims more than that host did fails.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from korch import config
from korch.backends.registry import BackendPredicate, backends_for
from korch.cost import candidate_bounds
from korch.cost.devices import cpu_device_from
from korch.orchestrate.candidates import enumerate_candidates
from korch.pipeline import load_model

DATA = json.loads((Path(__file__).parents[1] / "data" / "zoo_cpu_latencies.json").read_text())


@pytest.mark.parametrize("model", sorted(DATA["latency_s"]))
def test_no_measured_kernel_beats_its_floor(model):
    measured = DATA["latency_s"][model]
    device = cpu_device_from(DATA["probe"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(model)
    candidates = enumerate_candidates(graph, max_nodes=config.max_kernel_nodes,
                                      predicate=BackendPredicate(backends_for("cpu"))).candidates
    found, below = 0, []
    for candidate, floor in zip(candidates, candidate_bounds(graph, candidates, device)):
        latency = measured.get(candidate.signature)
        if latency is None:
            continue
        found += 1
        if latency < floor * (1 - 1e-9):
            below.append((candidate.signature, latency, floor))
    # fission or signatures changed since the export: measure again (benchmarks/floor_share.py --export)
    assert found >= 0.9 * len(candidates), f"{found} of {len(candidates)} candidates in the exported measurements"
    assert not below, f"kernels faster than their floor (signature, measured s, floor s): {below[:5]}"
