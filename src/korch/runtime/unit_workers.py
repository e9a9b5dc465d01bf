"""A plan's compiled units compiling in worker processes, one variant each.

``choose_unit`` compiles the unit in each of its own variants; one after the other, Candy's measured plan on the
2-core Xeon spent 25.5 s on each of two units, on one core. ``start`` submits every own variant's
``compile_unit`` to spawned workers (``korch.workers``: they die with this process); ``Started.compiled`` hands
``choose_unit`` each package as its worker finishes it. Only a plan of ``MIN_KERNELS`` or more starts workers: a
worker's start (torch's and Inductor's imports, 3-5 s of a core) is most of a small plan's compile. A worker
compiles as this process would: its configuration, precision policy and torch thread count (Inductor writes the
thread count into a CPU kernel's loops), so a variant's package is the one compiled here.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
from collections.abc import Callable

import torch

from korch import config, precision, workers
from korch.backends import ort_gemm
from korch.errors import KorchError, one_line
from korch.ir.graph import Graph
from korch.orchestrate.plan import Plan

MIN_KERNELS = 16


@dataclasses.dataclass
class Started:
    """Own variants of a unit compiling in ``pool``, by name."""

    pool: concurrent.futures.ProcessPoolExecutor
    futures: dict[str, concurrent.futures.Future]
    variants: dict[str, object]  # unit.Variant, by name

    def compiled(self) -> dict[str, Callable[[], bytes]]:
        """For ``choose_unit``: each variant's package once compiled, or the error its compile raised."""
        return {name: functools.partial(_result, future, self.variants[name].ort_kernels)
                for name, future in self.futures.items()}

    def close(self) -> None:
        """Stop the workers, cancelling what has not started (a compile under way runs out in its worker)."""
        self.pool.shutdown(wait=False, cancel_futures=True)


def start(graph: Graph, plan: Plan, device: str, jobs: int | None = None,
          min_kernels: int = MIN_KERNELS) -> Started | None:
    """Every own variant of ``plan``'s unit (one ``unit.supports``) compiling in a worker of its own (at most
    ``jobs``, default the cores), or None where there is only one variant or fewer than ``min_kernels`` kernels
    (it compiles here)."""
    from korch.runtime import unit

    if len(plan.kernels) < min_kernels:
        return None
    variants = unit.own_variants(graph, plan)
    if len(variants) < 2:
        return None
    settings = _settings()
    pool = workers.pool(min(len(variants), jobs or os.cpu_count() or 1))
    futures = {name: pool.submit(_compile, settings, graph, plan, device, variant)
               for name, variant in variants.items()}
    return Started(pool, futures, variants)


def _settings() -> dict:
    """This process's korch configuration (its plain values) and torch thread count, for a worker."""
    values = {name: value for name, value in vars(config).items()
              if not name.startswith("_") and isinstance(value, (bool, int, float, str, os.PathLike))}
    return {"config": values, "threads": torch.get_num_threads()}


def _compile(settings: dict, graph: Graph, plan: Plan, device: str, variant) -> bytes | str:
    """In a worker: the variant's package, or its compile's error as one line (Inductor's exceptions need not
    pickle)."""
    from korch.runtime.unit import compile_unit

    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # the workers are the parallelism
    torch.set_num_threads(settings["threads"])
    try:
        with config.patch(**settings["config"]), precision.use(settings["config"]["precision"]):
            return compile_unit(graph, plan, device, variant)
    except Exception as exc:  # Inductor's failures are many: the other variants may compile
        return one_line(exc)


def _result(future: concurrent.futures.Future, calls_ort: bool = False) -> bytes:
    """The package ``future`` compiled; ``calls_ort``: it calls korch_ort's operators, which this process opens
    (they are registered where the unit compiles)."""
    if calls_ort:
        ort_gemm.open_library()
    try:
        result = future.result()
    except concurrent.futures.process.BrokenProcessPool as exc:  # killed (out of memory, say)
        raise KorchError(f"the unit's compile worker died: {exc}") from exc
    if isinstance(result, str):
        raise KorchError(result)
    return result
