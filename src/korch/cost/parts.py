"""Floors from parts measured alone: a kernel that computes a product or a convolution takes nearly as long as
the fastest kernel of that node alone, at least.

The roofline floor (``roofline.py``) divides a convolution's FLOPs by the
device's peak, which small convolutions are far from: on a 2-core Zen 4 EPYC
the floors of YOLOX-Nano's measured convolution kernels were a fifth of their
times (median), so a measured search had to time most candidates before it
could prove anything (issue 14). Once each product and convolution has been
timed alone, in every layout column it has, the least of those times is a
far tighter floor for every candidate that holds the node: whatever else a
kernel fuses around it, the node's arithmetic still runs, in a library call
on a CPU.

What a fused kernel can save against the node alone is the traffic of the
operands it keeps in registers or caches, and timing noise moves both
numbers; ``PART_SHARE`` leaves room for both. Over the seven zoo models'
profile databases of the Zen 4 EPYC (7,800 measured kernels holding a
product or convolution whose node was timed alone in every column) the
least ratio of a kernel's time to its node's was 0.899, the 1st percentile
0.93-1.01 by model; then Segformer-B0's search that measured 99% of its
kernels (2026-12-01) found its attention's product of the probabilities by V
and the heads' transpose after it at 0.840 of that product alone (one MLAS
call in both, the product alone timed at the search's start): the share is
what two timings of one call can differ by. A kernel that computes only
part of the node's output (a slice of it) is bounded by that share of the
node's time.

Only where every column of the node was measured and built: a column that
failed alone may build fused, in a layout whose time alone is unknown. And
only for products and convolutions that are not grouped (``is_part``): a
depthwise convolution's time is mostly its traffic, which fusion changes.
A kernel with several such nodes takes the largest one's floor (the sum
would not be safe: MLAS multiplies sibling products as one). ``korch db
check`` compares every measured kernel with these floors too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

# What share of its node's least time alone a kernel holding the node takes at least (see the docstring)
PART_SHARE = 0.8
# Timings of each part alone, of which its time alone is the fastest: one timing read slow on a host whose speed
# dips for a moment sets a floor above what the node's kernels run in (a 2-core Zen 3 EPYC, 2026-12-02: Candy's
# stride-2 convolutions timed alone at 8.3-8.9 ms in a search, 3.6-5.6 ms again, and 28 kernels holding them
# measured under their floors, down to 0.63 of them)
PART_ROUNDS = 3


def part_floor_s(alone_s: float) -> float:
    """The floor a kernel holding a node gets from the node's least time alone."""
    return PART_SHARE * alone_s


def is_part(node: Node) -> bool:
    """Whether a node's time alone bounds the kernels that hold it: a product, or a convolution that is not
    grouped. A grouped (depthwise) convolution does little arithmetic per byte, so what a kernel fusing it
    saves in traffic shows in its time: EfficientViT's depthwise 3x3 convolution of 64 channels at 512x512 ran
    in 9.5 ms beside an Add and took 13.3 ms alone, channels-last (0.71)."""
    return node.op is Op.MATMUL or (node.op in (Op.CONV, Op.CONV_TRANSPOSE) and node.attrs.get("group", 1) == 1)


def part_columns(graph: Graph, candidates: Iterable) -> dict[int, list[int]]:
    """Each part's (``is_part``) candidates that are the node alone (one per layout column), by node index;
    ``candidates``: anything with ``.nodes``, in the order their ids count."""
    columns: dict[int, list[int]] = {}
    for c, candidate in enumerate(candidates):
        if len(candidate.nodes) == 1:
            (node,) = candidate.nodes
            if is_part(graph.nodes[node]):
                columns.setdefault(node, []).append(c)
    return columns


def part_times(columns: Mapping[int, list[int]], latency: Mapping[int, float]) -> dict[int, float]:
    """Each node's least time alone over its ``columns``, where every column has a finite ``latency``."""
    times = {}
    for node, ids in columns.items():
        seen = [latency.get(c, math.inf) for c in ids]
        if ids and all(math.isfinite(t) for t in seen):
            times[node] = min(seen)
    return times


def measured_parts(graph: Graph, candidates: Sequence, latency: Callable[[list[int]], Mapping[int, float]]) \
        -> dict[int, float]:
    """Each part's least time alone (``part_times``), its columns priced by ``latency(candidate ids)``: a
    measurer's (timing each part ``PART_ROUNDS`` times), or what a database or an export holds (ids it cannot
    price are left out of the answer)."""
    columns = part_columns(graph, candidates)
    ids = [c for column in columns.values() for c in column]
    return part_times(columns, latency(ids) if ids else {})
