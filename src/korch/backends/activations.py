"""Activation functions that fission wrote as several primitives, recognized so that each runs as torch's one op.

ONNX exporters write SiLU as ``x * sigmoid(x)``, GELU as ``0.5 x (1 + erf(x / sqrt 2))`` and HardSwish as a
chain of multiplications, additions and clamps, in whatever order and association the exporter chose; fission
keeps them as elementwise primitives. As torch's own op (``F.silu``, ``F.gelu``, ``F.hardswish``) an activation
is what Inductor's freezing passes look for after a convolution or a product with a constant weight: they join
the two into one oneDNN call with the activation as a post-op, so the activation costs no pass of its own over
memory.

``activation_chains`` finds, in a graph, each elementwise chain from one tensor ``x`` through scalar constants
to a tensor ``y`` that computes a known activation of ``x``. The test is numerical: the chain and the activation
are both run in float64 (the chain's float32 constants widened) on probe values spanning both saturated tails and
must agree to the rounding of those constants, so any formulation of the same function is found and a look-alike
(a HardSigmoid with ONNX's slope 0.2 rather than torch's 1/6, GELU's tanh approximation rather than its erf) is
not. Neither side is run in float32 because torch's float32 functions are not exact enough to decide: ``F.gelu``
is oneDNN's approximation where oneDNN has one, and torch 2.13's ``erf`` (and ``tanh``), called for the first time
in a process on a few thousand values, returned 1.0 for erf(2.595) in 2 to 5 runs of 6 here (off by 2.4e-4), so
the same chain was GELU in one run and not in the next (CI failed on it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from korch.ir import interpret
from korch.ir.graph import Graph, Node
from korch.ir.ops import BINARY, COMPARISON, LOGICAL, UNARY, Op

# torch's ops an elementwise chain may be recognized as (gelu: the erf form, ONNX's Gelu without approximation)
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "gelu": F.gelu, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
}
# The longest chain looked at: GELU's erf form is five primitives, HardSwish's ONNX decomposition six
_MAX_CHAIN = 8
_CHAIN_OPS = (UNARY | BINARY | {Op.CAST}) - COMPARISON - LOGICAL - {Op.MOD}
# Both tails and the bends between: HardSwish's corners at -3 and 3, SiLU's and GELU's saturation past +-10
_PROBE = np.concatenate([np.linspace(-12.0, 12.0, 4801), [-1e4, -100.0, -30.0, 30.0, 100.0, 1e4]]).astype(np.float32)
# A match differs by the float32 rounding of the chain's constants: GELU's erf form with sqrt(2) rounded, the
# worst, is within 0.75 of 1e-9 + 1e-7|y|; GELU's tanh approximation is 4.7e-4 away
_ATOL, _RTOL = 1e-7, 1e-6


class Chain(NamedTuple):
    """``output`` is ``activation(source)``, computed by ``nodes`` (in graph order) from ``source`` and scalars."""

    activation: str
    source: str
    output: str
    nodes: tuple[str, ...]


def activation_chains(graph: Graph, kernel_of: Mapping[str, int] | None = None) -> list[Chain]:
    """Every float32 chain in ``graph`` that computes one of ``ACTIVATIONS``; with ``kernel_of`` (a primitive's
    kernel), only chains whose primitives share one kernel. A chain found is not looked into again (a chain
    inside a longer one is not reported)."""
    producer = {t: node for node in graph.nodes for t in node.outputs}
    position = {node.name: i for i, node in enumerate(graph.nodes)}
    chains, covered = [], set()
    for node in reversed(graph.nodes):
        if node.name in covered or node.op not in _CHAIN_OPS or graph.tensors[node.outputs[0]].dtype != "float32":
            continue
        chain = _chain_to(graph, node, producer, position, kernel_of)
        if chain is not None:
            chains.append(chain)
            covered.update(chain.nodes)
    return chains[::-1]


def _chain_to(graph: Graph, last: Node, producer: Mapping[str, Node], position: Mapping[str, int],
              kernel_of: Mapping[str, int] | None) -> Chain | None:
    """The activation ``last`` computes from one tensor, walking back from it: a chain grows by the producer of
    its latest non-scalar input until one input is left (then it is tested), at most ``_MAX_CHAIN`` primitives."""
    nodes = {last.name: last}
    shape = graph.tensors[last.outputs[0]].shape
    while len(nodes) <= _MAX_CHAIN:
        inputs = {t for node in nodes.values() for t in node.inputs
                  if t and not _is_scalar(graph, t) and (t not in producer or producer[t].name not in nodes)}
        if len(inputs) == 1:
            (source,) = inputs
            if graph.tensors[source].shape == shape and graph.tensors[source].dtype == "float32" and len(nodes) > 1:
                ordered = sorted(nodes.values(), key=lambda n: position[n.name])
                activation = _which(graph, ordered, source, last.outputs[0])
                if activation is not None:
                    return Chain(activation, source, last.outputs[0], tuple(n.name for n in ordered))
        latest = max((producer[t] for t in inputs if t in producer), key=lambda n: position[n.name], default=None)
        if latest is None or latest.op not in _CHAIN_OPS or len(latest.outputs) != 1 or \
                graph.tensors[latest.outputs[0]].shape != shape or \
                (kernel_of is not None and kernel_of.get(latest.name) != kernel_of.get(last.name)):
            return None
        nodes[latest.name] = latest
    return None


def _is_scalar(graph: Graph, name: str) -> bool:
    value = graph.constants.get(name)
    return value is not None and np.size(value) == 1


def _which(graph: Graph, nodes: Sequence[Node], source: str, output: str) -> str | None:
    """The activation ``nodes`` (in graph order) compute from ``source`` and scalars (probed), or None."""
    probe = torch.from_numpy(_PROBE).double()
    env = {t: _widened(interpret.as_torch(graph.constants[t]))
           for node in nodes for t in node.inputs if t in graph.constants}
    env[source] = probe
    with torch.no_grad():
        for node in nodes:
            env.update(zip(node.outputs, interpret.run_node(node, [env[t] if t else None for t in node.inputs])))
        got = env[output].reshape(-1)
        if got.shape != probe.shape or not got.is_floating_point():
            return None
        for name, fn in ACTIVATIONS.items():
            if torch.allclose(got.double(), fn(probe), atol=_ATOL, rtol=_RTOL, equal_nan=True):
                return name
    return None


def _widened(value: torch.Tensor) -> torch.Tensor:
    return value.double() if value.dtype == torch.float32 else value
