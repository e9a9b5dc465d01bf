"""What calling a kernel costs the timer beyond the kernel's work (``measure.py``'s module docstring says why it
is subtracted): each backend's build of a kernel that does nothing, timed as kernels are (``timing.time_measured``);
on a GPU less what that kernel costs chained in a replayed graph (a negative cost: the graph's time per node).
The same empty kernel, called just before a timed call, brings the calling path back into the cache after the
timer's cold start (``empty_call``; ``timing.ColdStart`` says why)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from korch.backends.base import Backend
from korch.backends.check import random_inputs
from korch.backends.timing import chained_in_graph_s, time_measured
from korch.ir.graph import Graph, Node, Tensor
from korch.ir.ops import Op

# The database signature under which a backend's calling cost is kept (no candidate has it: theirs are hashes).
CALLING_COST = "calling-cost"
# Timings of the empty kernel, the fastest kept: a search's first one (2026-11-29, Zen 5) read MLAS's 9.3 us and
# Inductor's 7.1 against 5.0-5.4 us in a quiet process, and took 2-4 us off each of a plan's 84 kernels
TIMINGS = 3
_EMPTY_CALLS: dict[tuple[str, str, str], Callable[[], object] | None] = {}


def empty_kernel() -> Graph:
    """A kernel that does nothing measurable: one negation of one float."""
    graph = Graph(name="empty")
    graph.add_tensor(Tensor(name="x", shape=(1,), dtype="float32"))
    graph.add_tensor(Tensor(name="y", shape=(1,), dtype="float32"))
    graph.nodes.append(Node(op=Op.NEG, inputs=("x",), outputs=("y",), name="y"))
    graph.inputs, graph.outputs = ["x"], ["y"]
    return graph


def empty_call(backend: Backend, device: str) -> Callable[[], object] | None:
    """A call of ``backend``'s build of ``empty_kernel`` on ``device``, built once per process (None if the
    backend builds or runs no such kernel)."""
    key = (backend.name, backend.version, device)
    if key not in _EMPTY_CALLS:
        kernel = empty_kernel()
        try:
            built = backend.build(kernel, device)
            x = [t.to(device) for t in random_inputs(kernel)]
            built(*x)
            _EMPTY_CALLS[key] = lambda: built(*x)
        except Exception:  # a backend that builds or runs no such kernel
            _EMPTY_CALLS[key] = None
    return _EMPTY_CALLS[key]


@dataclasses.dataclass(frozen=True)
class EmptyKernelTimes:
    """A backend's empty kernel timed as kernels are (``stamped_s``, its fastest) and, on a GPU, chained in a
    replayed graph with nothing between (``chained_s``; None on a CPU, or where it cannot be captured)."""

    stamped_s: float
    chained_s: float | None = None

    @property
    def cost_s(self) -> float:
        """The calling cost: the stamped time, less the chained one where there is one."""
        return self.stamped_s - (self.chained_s or 0.0)


def empty_kernel_times(backend: Backend, device: str, timings: int = TIMINGS) -> EmptyKernelTimes | None:
    """``backend``'s empty kernel timed over ``timings`` timings, and chained on a GPU; None if it builds none
    or its timing fails."""
    call = empty_call(backend, device)
    if call is None:
        return None
    try:
        stamped = min(time_measured(lambda i: call(), [[]], device, warm_path=call, settle_within=None).min_s
                      for _ in range(timings))
    except Exception:
        return None
    if torch.device(device).type != "cuda":
        return EmptyKernelTimes(stamped)
    try:
        return EmptyKernelTimes(stamped, chained_in_graph_s(call, device))
    except Exception:  # an empty kernel that cannot be captured: the stamps' cost alone comes off
        return EmptyKernelTimes(stamped)


def calling_cost_s(backend: Backend, device: str, timings: int = TIMINGS) -> float:
    """The fastest time of ``backend``'s build of ``empty_kernel``, timed as kernels are, over ``timings``
    timings (0 if it cannot build one: nothing is subtracted). The fastest, not the median: what is subtracted
    from every kernel must not carry the noise of one timing (Candy's searches measured Inductor's median at
    5.2 and 8.1 us, and the 8.1 put 63 small kernels below their floors).

    On a GPU, less what the empty kernel costs chained in a graph (``timing.chained_in_graph_s``): a kernel is
    timed between two events inside a graph, but in the executable's graph, with nothing between, each kernel
    costs the graph's time per node besides (an empty one 1.09 us on an H200, against 0.24-0.45 us for the
    smallest kernels between events), and the plans' predictions fell short by 1.0 us a kernel (YOLOX-Nano,
    2026-11-30). The cost is then negative: what comes off every latency puts the node's time on."""
    times = empty_kernel_times(backend, device, timings)
    return 0.0 if times is None else times.cost_s
