"""The primitives after a convolution that a library's call computes inside it (its epilogue): a per-channel
bias, a residual sum, then an activation, each where the planned kernel holds it right after the convolution.

Fission writes a convolution's bias as an ADD of a constant and SiLU as ``x * sigmoid(x)``; ONNX Runtime's blocked
convolutions (``nchwc.py``) take the bias, a residual sum and a ReLU or clip, korch's direct convolution
(``direct_conv.py``) the bias and a ReLU or SiLU. ``Epilogue`` finds them; its ``nodes`` are the primitives the
call computes, ``output`` the last one's value.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from korch.backends.activations import Chain
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op


class Epilogue:
    """After ``conv`` in its ``kernel`` (primitive names): a per-channel bias, a residual sum (with ``residual``:
    a value of the output's shape computed before the convolution, ``earlier``), then an activation of
    ``activations`` ("relu", "clip", "silu"): ``activation`` is () or ("relu",), ("clip", low, high), ("silu",)."""

    def __init__(self, graph: Graph, conv: Node, kernel: Collection[str], consumers: Mapping[str, list[Node]],
                 earlier: Callable[[str], bool] = lambda value: False, residual: bool = True,
                 activations: Collection[str] = ("relu", "clip"), chains: Mapping[str, Chain] | None = None):
        """``chains``: the graph's activation chains by their source (``activations.activation_chains``), where
        ``activations`` holds "silu"."""
        self.nodes: list[Node] = []
        self.bias: str | None = None
        self.residual: str | None = None
        self.activation: tuple = ()
        self._graph, self._kernel, self._consumers, self._chains = graph, kernel, consumers, chains or {}
        channels = graph.constants[conv.inputs[1]].shape[0]
        node = self._next(conv)
        other = self._other_input(node, conv.output)
        value = graph.constants.get(other)
        if value is not None and value.dtype == np.float32 and value.size == channels and \
                per_channel_shape(value.shape, channels):
            self.nodes.append(node)
            self.bias = other
            node = self._next(node)
        other = self._other_input(node, self.output or conv.output)
        if residual and other and other not in graph.constants and earlier(other) and \
                graph.tensor(other).shape == graph.tensor(conv.output).shape and graph.tensor(other).dtype == "float32":
            self.nodes.append(node)
            self.residual = other
            node = self._next(node)
        self._activation(self.output or conv.output, node, activations)

    def _activation(self, value: str, node: Node | None, activations: Collection[str]) -> None:
        if "relu" in activations and node is not None and node.op is Op.RELU:
            self.nodes.append(node)
            self.activation = ("relu",)
            return
        if "silu" in activations and self._silu(value):
            return
        low = self._scalar_operand(node, Op.MAX)
        after = self._next(node) if low is not None else None
        high = self._scalar_operand(after, Op.MIN)
        if "clip" in activations and low is not None and high is not None:
            self.nodes += [node, after]
            self.activation = ("clip", low, high)

    def _silu(self, value: str) -> bool:
        """Whether the kernel computes SiLU of ``value`` next (an activation chain, ``activations.py``), nothing
        outside the chain reading ``value`` or what the chain computes before its output."""
        chain = self._chains.get(value)
        if chain is None or chain.activation != "silu" or not set(chain.nodes) <= set(self._kernel):
            return False
        nodes = [node for node in self._graph.nodes if node.name in chain.nodes]
        inner = [value, *(node.output for node in nodes if node.output != chain.output)]
        if any(t in self._graph.outputs or any(n.name not in chain.nodes for n in self._consumers.get(t, ()))
               for t in inner):
            return False
        self.nodes += nodes
        self.activation = ("silu",)
        return True

    @staticmethod
    def _other_input(node: Node | None, value: str) -> str | None:
        """The input of a two-input ADD ``node`` besides ``value``, else None."""
        if node is None or node.op is not Op.ADD or len(node.inputs) != 2 or node.inputs.count(value) != 1:
            return None
        return next(t for t in node.inputs if t != value)

    def _next(self, node: Node | None) -> Node | None:
        """The one reader of ``node``'s output, in the same kernel, where nothing else reads it."""
        if node is None or node.output in self._graph.outputs:
            return None
        readers = self._consumers.get(node.output, ())
        return readers[0] if len(readers) == 1 and readers[0].name in self._kernel else None

    def _scalar_operand(self, node: Node | None, op: Op) -> float | None:
        if node is None or node.op is not op or len(node.inputs) != 2:
            return None
        value = next((self._graph.constants.get(t) for t in node.inputs if t in self._graph.constants), None)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    @property
    def output(self) -> str | None:
        return self.nodes[-1].output if self.nodes else None


def per_channel_shape(shape: Sequence[int], channels: int, batch: int = 1) -> bool:
    """Whether a value of ``shape`` broadcasts over a (batch, channels, H, W) one channel by channel or as one
    (and, given the ``batch``, image by image: a squeeze-and-excitation scale)."""
    shape = (1,) * (4 - len(shape)) + tuple(shape)
    return len(shape) == 4 and shape[0] in (1, batch) and shape[1] in (1, channels) and shape[2:] == (1, 1)
