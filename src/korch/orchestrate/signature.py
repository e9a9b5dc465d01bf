"""Canonical signatures of candidate kernels: equal exactly when two kernels are the same computation.

A kernel's cost depends on what it computes, not on where it sits in the model,
so korch measures each distinct kernel once: the 12 identical encoder layers of
a transformer share their candidates' measurements. ``signature(graph, nodes)``
is a hash of the candidate's structure, independent of tensor names and node
indices:

* each node's op, attributes, output shapes and dtypes, and which of its
  outputs leave the kernel (read outside it, or a graph output);
* each input port: the producing node and output inside the kernel, or an
  external tensor, numbered so that ports reading the same tensor share a number;
* each external tensor's shape, dtype, whether it is a constant, and a small
  constant's value (<= ``SMALL_CONSTANT`` elements: scalars, gather indices),
  which a kernel bakes in.

Canonical form: nodes are placed one at a time in a topological order (Kahn's
algorithm) that always takes the ready node with the smallest key, where a key
says everything known about the node so far (its description, its downstream
tree of consumers, and its input ports in terms of already-placed nodes and
already-numbered tensors). Keys depend only on the structure, so isomorphic
candidates are placed alike; when several ready nodes share the smallest key,
every choice is tried and the smallest serialization wins, which keeps the form
exact (not a heuristic) in the rare symmetric cases. The serialization lists
every node and port, so different structures give different serializations.

Digests of node and tensor descriptions use blake2b (not Python's ``hash``,
which changes between processes), so a signature is stable across runs and can
key a cache of measurements on disk.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable

from korch.ir.graph import Graph
from korch.ir.ops import Op

# Constants with at most this many elements enter the signature by value
# (kernels bake them in); larger ones by shape and dtype only.
SMALL_CONSTANT = 64

_Ref = tuple  # a port reference while placing nodes: see Signer._key


def _digest(value: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "big")


def _attr_items(graph: Graph, index: int) -> tuple:
    node = graph.nodes[index]
    items = []
    for key, value in node.attrs.items():
        if node.op is Op.OPAQUE and key == "node":
            value = _anonymous_node_proto(value)
        items.append((key, value))
    return tuple(items)


def _anonymous_node_proto(encoded: object) -> object:
    """An opaque node's NodeProto (base64, as ``ir.to_onnx.encode_opaque`` writes it) without its names."""
    import onnx
    from google.protobuf.message import DecodeError

    if not isinstance(encoded, (str, bytes)):
        return encoded
    try:
        proto = onnx.NodeProto.FromString(base64.b64decode(encoded, validate=True))
    except (ValueError, DecodeError):  # not an encoded NodeProto: keep it as it is
        return encoded
    proto.ClearField("name")
    proto.ClearField("input")
    proto.ClearField("output")
    return base64.b64encode(proto.SerializeToString(deterministic=True)).decode()


class Signer:
    """Signatures of many candidates of one graph (caches per-node and per-tensor digests)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producer: dict[str, tuple[int, int]] = {}
        self.readers: dict[str, set[int]] = {}
        for i, node in enumerate(graph.nodes):
            for port, name in enumerate(node.outputs):
                self.producer[name] = (i, port)
            for name in node.inputs:
                if name:
                    self.readers.setdefault(name, set()).add(i)
        self.graph_outputs = frozenset(graph.outputs)
        self._node_digests: dict[int, int] = {}
        self._tensor_digests: dict[str, int] = {}

    def node_digest(self, index: int) -> int:
        d = self._node_digests.get(index)
        if d is None:
            node, tensors = self.graph.nodes[index], self.graph.tensors
            outs = tuple((tensors[t].shape, tensors[t].dtype) for t in node.outputs)
            d = self._node_digests[index] = _digest((node.op.value, _attr_items(self.graph, index), outs))
        return d

    def tensor_digest(self, name: str) -> int:
        d = self._tensor_digests.get(name)
        if d is None:
            t = self.graph.tensors[name]
            value = self.graph.constants.get(name)
            if value is None:
                desc = ("tensor", t.shape, t.dtype)
            elif value.size <= SMALL_CONSTANT:
                desc = ("constant", t.shape, t.dtype, value.tobytes().hex())
            else:
                desc = ("constant", t.shape, t.dtype)
            d = self._tensor_digests[name] = _digest(desc)
        return d

    def outputs(self, nodes: Iterable[int]) -> set[str]:
        inside = set(nodes)
        return {t for i in inside for t in self.graph.nodes[i].outputs
                if t in self.graph_outputs or not self.readers.get(t, set()) <= inside}

    def __call__(self, nodes: Iterable[int], outputs: Iterable[str] | None = None) -> str:
        """The signature of the kernel made of ``nodes``; ``outputs`` when already known (saves work)."""
        order = sorted(nodes)
        outs = set(outputs) if outputs is not None else self.outputs(order)
        local = {g: k for k, g in enumerate(order)}
        graph_nodes = self.graph.nodes
        ports: list[list] = []  # per node: None (absent), (producer, output port) inside, or a tensor name
        consumers: list[list[tuple]] = [[] for _ in order]
        base = []
        for k, g in enumerate(order):
            node = graph_nodes[g]
            refs = []
            for port, name in enumerate(node.inputs):
                src = self.producer.get(name) if name else None
                if not name:
                    refs.append(None)
                elif src is not None and src[0] in local:
                    j = local[src[0]]
                    refs.append((j, src[1]))
                    consumers[j].append((k, port, src[1]))
                else:
                    refs.append(name)
            ports.append(refs)
            base.append((self.node_digest(g), tuple(t in outs for t in node.outputs)))
        down: list = [None] * len(order)
        for k in range(len(order) - 1, -1, -1):  # indices are topological: consumers come later
            down[k] = (base[k], tuple(sorted((down[c], port, out) for c, port, out in consumers[k])))
        pending = [sum(1 for r in refs if isinstance(r, tuple)) for refs in ports]
        ready = [k for k in range(len(order)) if pending[k] == 0]
        best = _place(ports, consumers, down, base, pending, ready, {}, {}, [], self.tensor_digest)
        return hashlib.sha256(repr(best).encode()).hexdigest()[:16]


def _place(ports, consumers, down, base, pending, ready, pos, numbers, entries, tensor_digest):
    """Kahn's placement from a partial state; returns the smallest complete serialization."""
    while ready:
        keys = {}
        for k in ready:
            refs = []
            for r in ports[k]:
                if r is None:
                    refs.append((0,))
                elif isinstance(r, tuple):
                    refs.append((1, pos[r[0]], r[1]))
                elif r in numbers:
                    refs.append((2, numbers[r]))
                else:
                    refs.append((3, tensor_digest(r)))
            keys[k] = (down[k], tuple(refs))
        smallest = min(keys.values())
        tied = [k for k in ready if keys[k] == smallest]
        if len(tied) > 1:
            results = []
            for k in tied:
                p, n, e, pend, rdy = dict(pos), dict(numbers), list(entries), list(pending), list(ready)
                _put(k, ports, consumers, base, p, n, e, pend, rdy)
                results.append(_place(ports, consumers, down, base, pend, rdy, p, n, e, tensor_digest))
            return min(results)
        _put(tied[0], ports, consumers, base, pos, numbers, entries, pending, ready)
    inputs = sorted(numbers, key=numbers.get)
    return tuple(entries), tuple(tensor_digest(t) for t in inputs)


def _put(k, ports, consumers, base, pos, numbers, entries, pending, ready):
    ready.remove(k)
    pos[k] = len(pos)
    refs = []
    for r in ports[k]:
        if r is None:
            refs.append(None)
        elif isinstance(r, tuple):
            refs.append((pos[r[0]], r[1]))
        else:
            if r not in numbers:
                numbers[r] = len(numbers)
            refs.append(numbers[r])
    entries.append((base[k], tuple(refs)))
    for c, _, _ in consumers[k]:
        pending[c] -= 1
        if pending[c] == 0:
            ready.append(c)


def signature(graph: Graph, nodes: Iterable[int]) -> str:
    """The canonical structural hash of the kernel made of ``nodes`` (16 hex digits)."""
    return Signer(graph)(nodes)


def describe(graph: Graph, nodes: Iterable[int]) -> str:
    """A short human-readable form of a kernel: its ops in topological order, e.g. ``Conv+Add+Relu``."""
    names = []
    for i in sorted(nodes):
        node = graph.nodes[i]
        names.append(str(node.attrs.get("op_type", "Opaque")) if node.op is Op.OPAQUE else node.op.value)
    return "+".join(names)
