"""What a measurement is stored under and what a search's measuring reports: the profile database's device key
and backend versions (``device_key``, ``keyed_versions``), and the counts and failures of ``MeasureStats``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from korch import precision
from korch.backends.base import Backend
from korch.backends.timing import CPU_PROTOCOL
from korch.cost.devices import get_device


@dataclasses.dataclass(frozen=True)
class Failure:
    signature: str
    ops: str
    backend: str
    status: str
    message: str


@dataclasses.dataclass
class MeasureStats:
    asked: int = 0            # distinct signatures the loop asked about
    from_db: int = 0          # of those, answered from the database alone
    measured: int = 0         # kernels built, checked and timed here (signature x backend)
    below_bound: int = 0      # measurements under the lower bound (by more than BELOW_FLOOR_S), raised to it
    disturbed: int = 0        # kernels timed while other processes held the cores in every try
    build_s: float = 0.0      # wall seconds building and checking kernels (workers in parallel), and their
                              # timing where the workers time
    timing_s: float = 0.0     # seconds timing them, one at a time (in this process; on a GPU in the workers)
    graphed: int = 0          # kernels timed inside a replayed CUDA graph; a GPU's others could not be captured
    failures: list[Failure] = dataclasses.field(default_factory=list)


def device_key(target: str) -> str:
    """The device part of a database key: the GPU kind with the precision policy its products follow, or the
    CPU model with its core count (a CPU's float32 products are exact under every policy)."""
    from korch.cost.probe import cpu_model

    name = get_device(target).name
    return f"{name}:{precision.current().name}" if name != "cpu" else f"cpu:{cpu_model()}:{os.cpu_count()}"


def keyed_versions(backends: Sequence[Backend], device: str) -> dict[str, str]:
    """Each backend's version as the profile database keys its measurements on ``device``: with the CPU timer's
    protocol there, so that kernels timed another way are measured again."""
    suffix = f"+{CPU_PROTOCOL}" if device == "cpu" else ""
    return {b.name: b.version + suffix for b in backends}
