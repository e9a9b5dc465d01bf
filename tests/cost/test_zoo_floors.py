"""No measured kernel of the zoo beats its floor: the promise the measured search's proof of optimality rests on.

``tests/data/zoo_cpu_latencies*.json`` hold measured candidate kernels of zoo
models on one host each (the fastest backend's latency less its calling cost,
as the search sees it) with that host's probe record, written by
``benchmarks/floor_share.py --export``: every candidate of three models on an
Intel Xeon (2026-11-25), and what the seven models' searches measured on a
Zen 4 EPYC (2026-11-30, ``--known-only``: a part of the convolution networks'
candidates; Segformer-B0's from a search that measured 99% of them,
2026-12-01), and what the searches of 2026-12-07 measured on an AVX-512 Xeon at
the backend versions of the fix that calls a fresh kernel as a loaded one
(Inductor's 13, MLAS's 6; ``_xeon``: every candidate of the BERT layer and the
ViT block, a quarter of Segformer-B0's, 197 of YOLOX-Nano's, whose floors from
parts timed alone from cold caches had been 1.35x too high). The floors are
computed here from the same record, so a floor model that claims more than
that host did fails.

The floors with products and convolutions timed alone (``cost/parts.py``)
are checked against the later exports only: on the first Xeon's, measured before a
product alone had a packed path (MLAS, oneDNN's packed weights), two of the
ViT block's kernels fused a LayerNorm's tail into a product and ran it in 0.72
ms against 1.58 ms for the product alone (MKL), 0.46 of it. A search bounds
its kernels with the backends of its day, and ``korch db check`` finds such a
kernel in any database.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from korch.cost import candidate_bounds, measured_parts
from korch.cost.devices import cpu_device_from
from korch.cost.roofline import BELOW_FLOOR_S
from korch.pipeline import candidate_kernels, load_model

DATA_DIR = Path(__file__).parents[1] / "data"
EXPORTS = {name: json.loads((DATA_DIR / f"{name}.json").read_text())
           for name in ("zoo_cpu_latencies", "zoo_cpu_latencies_zen4", "zoo_cpu_latencies_xeon")}
# the first export predates products timed alone in packed paths (above): its floors are the roofline's only
CASES = [(export, model, with_parts) for export, data in EXPORTS.items() for model in sorted(data["latency_s"])
         for with_parts in ((False,) if export == "zoo_cpu_latencies" else (False, True))]


@pytest.mark.parametrize(("export", "model", "with_parts"), CASES,
                         ids=[f"{e}-{m}-{'parts' if p else 'roofline'}" for e, m, p in CASES])
def test_no_measured_kernel_beats_its_floor(export, model, with_parts):
    """Neither the roofline floor nor, with ``with_parts``, the one a measured search bounds its candidates with
    once their products and convolutions were timed alone."""
    data = EXPORTS[export]
    measured = data["latency_s"][model]
    device = cpu_device_from(data["probe"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(model)
    candidates = candidate_kernels(graph, "cpu", "measured").candidates  # with the layout columns, as searched
    parts = None
    if with_parts:
        parts = measured_parts(graph, candidates, lambda ids: {
            c: measured[candidates[c].signature] for c in ids if measured.get(candidates[c].signature) is not None})
        assert parts, "no product or convolution measured alone in every column"
    found, below = set(), []
    for candidate, floor in zip(candidates, candidate_bounds(graph, candidates, device, parts=parts)):
        latency = measured.get(candidate.signature)
        if latency is None:
            continue
        found.add(candidate.signature)
        if latency < floor - BELOW_FLOOR_S:
            below.append((candidate.signature, latency, floor))
    # fission or signatures changed since the export: measure again (benchmarks/floor_share.py --export). A change
    # of fission or of the signatures moves nearly every signature of a model; a host moves a part of them: a
    # constant of at most 64 values enters a signature by value, and the zoo's BatchNorm statistics, calibrated by
    # a forward pass (``zoo.common.randomize``), differ in their last bits from one instruction set's convolutions
    # to another's, and so do the biases folded from them (on a Zen 3 EPYC with AVX2, 2026-12-02, 35% of the AVX-512
    # Zen 4's YOLOX-Nano kernels were candidates, 69% of YOLOv4's, 88% of EfficientViT's; all on an AVX-512 Xeon)
    assert len(found) >= 0.25 * len(measured), f"{len(found)} of {len(measured)} exported kernels are candidates"
    assert not below, f"kernels faster than their floor (signature, measured s, floor s): {below[:5]}"
