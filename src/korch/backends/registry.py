"""Which backends build kernels for a target, and the candidate predicate they define together.

A candidate kernel exists exactly when some backend of the target claims it:
``BackendPredicate`` keeps the orchestrator's structural rules (``KernelRules``:
one fused loop nest, at most one linear or window primitive, one reduction
group; they also prune the enumeration) and then asks each backend's
``claims`` on the candidate's kernel graph.

GPU targets use korch's Triton generator, Inductor (Triton) and the torch
libraries; CPU targets use Inductor (C++), Inductor with the library's 1x1
convolutions (``inductor.LibraryConvBackend``), the torch libraries and MLAS
(products and softmaxes through ONNX Runtime's kernels, ``mlas.py``). The Triton
interpreter is a test vehicle, never a CPU backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from korch.backends.base import Backend
from korch.backends.inductor import InductorBackend, LibraryConvBackend
from korch.backends.library import LibraryBackend
from korch.backends.mlas import MlasBackend
from korch.cost.devices import get_device
from korch.ir.graph import Graph
from korch.ir.subgraph import extract
from korch.orchestrate.candidates import KernelRules


def device_for(target: str) -> str:
    """The torch device kernels for ``target`` run on."""
    return "cpu" if get_device(target).name == "cpu" else "cuda"


def backends_for(target: str) -> list[Backend]:
    backends: list[Backend] = []
    if device_for(target) == "cuda":
        from korch.backends.triton.backend import TritonBackend

        backends.append(TritonBackend())
    backends += [InductorBackend(), LibraryBackend()]
    if device_for(target) == "cpu":
        backends += [LibraryConvBackend(), MlasBackend()]
    return backends


def first_claim(backends: Sequence[Backend], kernel: Graph) -> str | None:
    """None when some backend claims ``kernel``, else the first backend's reason."""
    reasons = []
    for backend in backends:
        reason = backend.claims(kernel)
        if reason is None:
            return None
        reasons.append(reason)
    return reasons[0] if reasons else "no backend"


class _Bound:
    def __init__(self, graph: Graph, backends: Sequence[Backend]):
        self.graph, self.backends = graph, backends
        self.rules = KernelRules(graph)
        self.grow = self.rules.grow

    def __call__(self, nodes: frozenset[int]) -> str | None:
        reason = self.rules(nodes)
        if reason is not None:
            return reason
        index = self.rules.index
        mask = sum(1 << i for i in nodes)
        kernel = extract(self.graph, nodes, index.inputs(mask), index.outputs(mask))
        return first_claim(self.backends, kernel)


class BackendPredicate:
    """The candidate predicate of a set of backends (see the module docstring)."""

    def __init__(self, backends: Sequence[Backend]):
        self.backends = list(backends)

    def bind(self, graph: Graph) -> _Bound:
        return _Bound(graph, self.backends)

    def __call__(self, graph: Graph, nodes: frozenset[int]) -> str | None:
        return self.bind(graph)(frozenset(nodes))
