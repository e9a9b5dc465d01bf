"""Graph surgery of the frontend: what a node reads, renaming, dead code, order.

Works on a plain list of the main graph's ``NodeProto``. The names a node
reads include the outer-scope names its subgraphs (If/Loop/Scan bodies)
capture, so renaming, liveness and ordering see through subgraphs, which are
otherwise left alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping

from onnx import AttributeProto, GraphProto, NodeProto, helper

from korch.errors import KorchError

DEFAULT_DOMAINS = ("", "ai.onnx")


def is_op(node: NodeProto, *op_types: str) -> bool:
    """Whether ``node`` is one of ``op_types`` of the default ONNX domain."""
    return node.domain in DEFAULT_DOMAINS and node.op_type in op_types


def attributes(node: NodeProto) -> dict:
    """``node``'s attributes by name, as Python values."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def _defined(graph: GraphProto) -> set[str]:
    names = {v.name for v in graph.input}
    names.update(t.name for t in graph.initializer)
    names.update(t.values.name for t in graph.sparse_initializer)
    for node in graph.node:
        names.update(node.output)
    return names


def captured(graph: GraphProto) -> set[str]:
    """Outer-scope names a subgraph (or the subgraphs nested in it) reads."""
    used = {v.name for v in graph.output}
    for node in graph.node:
        used.update(node.input)
        for sub in subgraphs(node):
            used |= captured(sub)
    return used - _defined(graph) - {""}


def reads(node: NodeProto) -> list[str]:
    """Every name ``node`` reads: its inputs, then what its subgraphs capture."""
    names = [n for n in node.input if n]
    for sub in subgraphs(node):
        names.extend(sorted(captured(sub)))
    return names


def producers_and_readers(nodes: Iterable[NodeProto], outputs: Iterable[str]) \
        -> tuple[dict[str, NodeProto], dict[str, int]]:
    """Each value's producing node, and how many times each value is read (a graph output counts once; an If or
    Loop body's captures count)."""
    nodes = list(nodes)
    producer = {out: node for node in nodes for out in node.output if out}
    readers: dict[str, int] = {name: 1 for name in outputs}
    for node in nodes:
        for name in reads(node):
            readers[name] = readers.get(name, 0) + 1
    return producer, readers


def fresh_name(stem: str, names: set[str]) -> str:
    """``stem``, or ``stem_1``, ``stem_2``, ...: the first not in ``names``, which it joins."""
    name, i = stem, 0
    while name in names:
        i += 1
        name = f"{stem}_{i}"
    names.add(name)
    return name


def _rename_captured(graph: GraphProto, mapping: Mapping[str, str]) -> None:
    local = _defined(graph)
    live = {k: v for k, v in mapping.items() if k not in local}
    if not live:
        return
    for node in graph.node:
        rename_inputs(node, live)
    for out in graph.output:
        if out.name in live:
            out.name = live[out.name]


def rename_inputs(node: NodeProto, mapping: Mapping[str, str]) -> None:
    """Rewrite the names ``node`` reads (subgraph captures included) by ``mapping``."""
    for i, name in enumerate(node.input):
        if name in mapping:
            node.input[i] = mapping[name]
    for sub in subgraphs(node):
        _rename_captured(sub, mapping)


def topo_sort(nodes: list[NodeProto]) -> list[NodeProto]:
    """Nodes in a topological order, as close to the given order as possible.

    Names no node produces (graph inputs, constants) count as available.
    """
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    users: list[list[int]] = [[] for _ in nodes]
    pending = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for dep in {producer[n] for n in reads(node) if n in producer}:
            if dep != i:
                users[dep].append(i)
                pending[i] += 1
    ready = [i for i, count in enumerate(pending) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for user in users[i]:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        stuck = next(nodes[i] for i, count in enumerate(pending) if count)
        raise KorchError(
            f"the graph has a cycle through node '{stuck.name or stuck.op_type}' "
            f"(output '{stuck.output[0]}')"
        )
    return [nodes[i] for i in order]


def remove_dead(
    nodes: list[NodeProto], outputs: Iterable[str]
) -> tuple[list[NodeProto], set[str]]:
    """Drop nodes nothing reaching a graph output uses.

    ``nodes`` must be topologically sorted. Returns the kept nodes and every
    name they or the graph outputs read.
    """
    live = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(out in live for out in node.output if out):
            kept.append(node)
            live.update(reads(node))
    kept.reverse()
    return kept, live
