"""A plan: the kernels the orchestrator chose, in execution order, as plain JSON-able data.

Each kernel names the primitive nodes it computes (by node name), the tensors
it reads and writes, its canonical signature, and its cost, with whether that
cost was measured or is the lower bound. Plans are written atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from korch.errors import KorchError
from korch.ir.graph import CONTIGUOUS
from korch.fsutil import atomic_write_bytes

FORMAT = "korch-plan"
VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannedKernel:
    name: str                     # k0, k1, ... in execution order
    nodes: tuple[str, ...]        # primitive node names, topological order
    ops: str                      # readable form, e.g. "Conv+Add+Relu"
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    signature: str
    cost_s: float                 # latency used by the solver
    bound_s: float                # the lower bound of the cost model
    measured: bool                # cost_s was measured (else it is the bound)
    backend: str = ""             # the backend whose kernel was fastest (measured plans)
    launches: int = 1             # device kernels that backend launches for it
    variant: dict | None = None   # the launch variant measured fastest (Triton), if any
    layout: str = CONTIGUOUS      # how its inputs and outputs with layouts are stored (orchestrate/layouts.py)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannedConversion:
    tensor: str                   # the value copied into layout ``to`` from the other one
    to: str
    cost_s: float
    before: str                   # the kernel it runs before (the plan's kernels are in execution order)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SegmentReport:
    nodes: int
    candidates: int
    exact: bool
    dropped: int
    kernels: int
    objective_s: float
    seconds: float
    optimal: bool
    gap: float
    cycle_cuts: int
    solves: int = 1             # the program solved this often (a measured search: once per lazy round)
    proofs: int = 0             # of them, rounds of branch and cut
    solve_s: float = 0.0        # seconds in the solves (the rest of a measured search is measuring)
    dominated: int = 0          # columns the last solve left out: measured kernels replace them at no more cost
    in_place_rounds: int = 0    # the optimum's kernels run in sequence this often to price them in place
    timed_in_place: int = 0     # of the plan's kernels, those priced in place (the rest at their times alone)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    model: str
    target: str
    cost_model: str
    kernels: tuple[PlannedKernel, ...]
    segments: tuple[SegmentReport, ...] = ()
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    conversions: tuple[PlannedConversion, ...] = ()

    @property
    def predicted_latency_s(self) -> float:
        return sum(k.cost_s for k in self.kernels) + sum(c.cost_s for c in self.conversions)

    def stored_layouts(self) -> dict[str, str]:
        """Each value a kernel writes in a layout other than contiguous: its layout."""
        return {t: k.layout for k in self.kernels if k.layout != CONTIGUOUS for t in k.outputs}

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "model": self.model, "target": self.target,
            "cost_model": self.cost_model, "predicted_latency_s": self.predicted_latency_s,
            "stats": self.stats,
            "segments": [dataclasses.asdict(s) for s in self.segments],
            "kernels": [dataclasses.asdict(k) for k in self.kernels],
            "conversions": [dataclasses.asdict(c) for c in self.conversions],
        }

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise KorchError(f"not a {FORMAT} v{VERSION} document")
        kernels = tuple(PlannedKernel(**{**k, "nodes": tuple(k["nodes"]), "inputs": tuple(k["inputs"]),
                                          "outputs": tuple(k["outputs"])}) for k in data["kernels"])
        return cls(model=data["model"], target=data["target"], cost_model=data["cost_model"], kernels=kernels,
                   segments=tuple(SegmentReport(**s) for s in data["segments"]), stats=data.get("stats", {}),
                   conversions=tuple(PlannedConversion(**c) for c in data.get("conversions", ())))

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Plan":
        return cls.from_json(json.loads(data))

    def save(self, path: str | os.PathLike) -> Path:
        return atomic_write_bytes(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        try:
            data = Path(path).read_bytes()
            return cls.from_bytes(data)
        except (OSError, ValueError) as exc:
            raise KorchError(f"cannot read plan {path}: {exc}") from None
