"""A lower bound on the time of a candidate kernel: the work it cannot avoid over the device's peak rates.

``kernel_work`` counts what any implementation of a kernel must do: the bytes
of its inputs it must read, the bytes of its outputs it must write, and the
arithmetic it must perform. ``lower_bound`` divides that by the ceilings of a
``Device`` (``cost/devices.py``)::

    t >= launch_overhead + max(memory time, vector FLOPs / vector peak, matrix FLOPs / matrix peak)

    memory time = max(bytes moved / cache bandwidth,
                      (max(0, read - cache) + max(0, written - cache)) / memory bandwidth)

Why each piece is a floor (docs/cost.md has the long form):

* **Demand.** Work is counted backwards from the kernel's outputs, which must
  be written whole. Each node's output is needed only as far as its consumers
  inside the kernel need it, and each op says how few input elements a given
  number of its outputs can depend on: a Slice of k elements reads k, a Gather
  reads its distinct indices, a strided 1x1 conv skips pixels, an elementwise
  op whose result is only sliced is computed only where sliced. A tensor read
  by several nodes counts the largest need (the union is at least that).
  Inputs are read once, outputs written once: no re-reads are charged.
* **FLOPs** are ``korch.ir.analysis.node_flops`` scaled by the needed share of
  the node's output, lowered where a kernel can legally do less: Neg and Abs
  are free operand modifiers on GPUs and CPUs; a reduction of n values to m
  needs n - m operations; on a device whose libraries run convolutions with a
  fast algorithm (a GPU's cuDNN: Winograd, FFT; ``Device.fast_convolution``) a
  convolution needs at least one multiply-add per output, input channel and
  stride phase, elsewhere one per kernel tap as well. LINEAR nodes count as
  matrix FLOPs, every other node as vector FLOPs.
* **Overlap.** Memory traffic, vector units and matrix units work at the same
  time on real devices, so the terms combine by ``max``, never by sum. One
  exception: on a CPU a matrix product runs as a library call (MLAS, oneDNN,
  MKL) and the kernel's other loops before or after it, so a kernel with a
  MATMUL and other work is at least the product's compute time plus the floor
  of those loops (``KernelWork.loop_bytes``: the bytes they must touch). A
  convolution is such a call too, but oneDNN applies what follows it (bias,
  activation, a sum) inside the call: only loops before it (a prologue) add.
* **Parts.** With ``parts`` (``cost/parts.py``), a product or convolution timed alone in every layout column
  bounds each kernel holding it by most of its least time there (``part_floor_s``), in place of its FLOPs at the
  matrix peak when that is more: measured, not derived, and checked against every measured kernel.
* **Cache.** A kernel's inputs may already sit in the last-level cache (its
  producer just wrote them; a profiler repeats the same kernel) and its outputs
  may stay there dirty, so only bytes beyond the cache's capacity must cross
  device memory; every byte still passes the cache, at most at its bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from korch.cost.devices import HALF_DTYPES, Device
from korch.cost.parts import part_floor_s
from korch.ir import ops
from korch.ir.analysis import node_flops
from korch.ir.dtypes import itemsize
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

# Free operand modifiers: a GPU's FADD/FMUL/FFMA and a CPU's FNMADD fold these in.
_FREE = frozenset({Op.NEG, Op.ABS})
# A kernel timed less than this below its floor is not below it: the calling cost taken off every timing is itself
# measured no finer (Segformer-B0's reciprocals of 256 values read 0 s less the library's 3.4 us calling cost,
# under floors of 6 and 98 ns)
BELOW_FLOOR_S = 1e-7


@dataclasses.dataclass(frozen=True)
class KernelWork:
    """What a kernel must do at the least: bytes through memory and FLOPs on each kind of unit."""

    bytes_read: int
    bytes_written: int
    vector_flops: int
    matrix_flops: int
    # on CPUs, where products are library calls: the bytes the loops around a MATMUL must read or write (the
    # kernel's tensors they touch, and each tensor passed between them and a product, once); 0 without loops
    loop_bytes: int = 0
    # seconds its products and convolutions take at least, from their measured times alone (``part_floor_s``);
    # 0 where none was measured
    part_s: float = 0.0

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b > 0 else 0


def _prod(values: Iterable[int]) -> int:
    return math.prod(int(v) for v in values)


# -- how few input elements a demanded number of output elements depends on ----------


def _window_axis(size_in: int, size_out: int, k: int, stride: int, dil: int, pad: int) -> tuple[int, int]:
    """On one axis of a conv or pool: (input positions some window tap reads, taps that read one)."""
    positions: set[int] = set()
    taps = 0
    for j in range(k):
        off = j * dil - pad  # output o reads input o * stride + off
        lo = max(0, _ceil_div(-off, stride))
        hi = min(size_out - 1, (size_in - 1 - off) // stride)
        if lo <= hi:
            taps += 1
            positions.update(range(lo * stride + off, hi * stride + off + 1, stride))
    return len(positions), taps


def _transpose_axis(size_in: int, size_out: int, k: int, stride: int, dil: int, pad: int) -> tuple[int, int]:
    """On one axis of a ConvTranspose: (input positions that reach the output, taps that do)."""
    positions: set[int] = set()
    taps = 0
    for j in range(k):
        off = j * dil - pad  # input p writes output p * stride + off
        lo = max(0, _ceil_div(-off, stride))
        hi = min(size_in - 1, (size_out - 1 - off) // stride)
        if lo <= hi:
            taps += 1
            positions.update(range(lo, hi + 1))
    return len(positions), taps


def _spatial(node: Node, x_shape, w_shape, out_shape, transpose: bool) -> tuple[int, int, int]:
    """(input positions read, kernel taps used, outputs one input element feeds at most), over all spatial axes."""
    a = node.attrs
    kernel = w_shape[2:] if w_shape is not None else a["kernel"]
    rank = len(kernel)
    strides, pads, dils = a["strides"], a["pads"], a["dilations"]
    read, used, fanout = 1, 1, 1
    for i in range(rank):
        k, s, d, p = int(kernel[i]), int(strides[i]), int(dils[i]), int(pads[i])
        axis = _transpose_axis if transpose else _window_axis
        r, u = axis(int(x_shape[2 + i]), int(out_shape[2 + i]), k, s, d, p)
        read, used = read * r, used * u
        fanout *= k if transpose else min(k, d * (k - 1) // s + 1)
    return read, used, fanout


def _conv_needs(graph: Graph, node: Node, demand: int) -> list[int]:
    t = graph.tensors
    x, w, out = t[node.inputs[0]], t[node.inputs[1]], t[node.output]
    transpose = node.op is Op.CONV_TRANSPOSE
    group = int(node.attrs["group"])
    read, used, fanout = _spatial(node, x.shape, w.shape, out.shape, transpose)
    out_per_group = out.shape[1] // group
    if demand >= out.numel:
        return [x.shape[0] * x.shape[1] * read, w.shape[0] * w.shape[1] * used]
    x_fanout = out_per_group * fanout
    w_fanout = x.shape[0] * _prod((x if transpose else out).shape[2:])
    return [_ceil_div(demand, x_fanout), _ceil_div(demand, w_fanout)]


def _window_needs(graph: Graph, node: Node, demand: int) -> list[int]:
    x, out = graph.tensors[node.inputs[0]], graph.tensors[node.output]
    read, _, fanout = _spatial(node, x.shape, None, out.shape, transpose=False)
    if demand >= out.numel:
        return [x.shape[0] * x.shape[1] * read]
    return [_ceil_div(demand, fanout)]


def _gather_needs(graph: Graph, node: Node, demand: int) -> list[int]:
    t = graph.tensors
    x, idx, out = t[node.inputs[0]], t[node.inputs[1]], t[node.output]
    axis = int(node.attrs["axis"])
    outer_inner = _prod(x.shape[:axis]) * _prod(x.shape[axis + 1:])
    values = graph.constants.get(node.inputs[1])
    if values is not None and values.size:
        _, counts = np.unique(np.asarray(values), return_counts=True)
        distinct, repeat = len(counts), int(counts.max())
    else:  # unknown indices: all could be one value
        distinct, repeat = min(1, idx.numel), max(1, idx.numel)
    # each output element copies one x element; x element (.., v, ..) is copied `repeat` times at most
    need_x = max(_ceil_div(demand, repeat), outer_inner * distinct - (out.numel - demand))
    return [min(x.numel, need_x), _ceil_div(demand * idx.numel, out.numel)]


def input_needs(graph: Graph, node: Node, demand: int) -> list[int]:
    """For each input of ``node``: the fewest of its elements that ``demand`` output elements depend on."""
    if node.op is Op.OPAQUE or demand <= 0:
        return [0] * len(node.inputs)  # korch does not know what an opaque node reads
    t = graph.tensors
    out = t[node.output].numel
    demand = min(demand, out)
    sizes = [t[name].numel if name else 0 for name in node.inputs]
    if node.op is Op.SLICE:
        return [demand]  # distinct input elements, one per output element
    if node.op is Op.CONCAT:
        return [max(0, demand - (out - n)) for n in sizes]
    if node.op is Op.PAD:  # the pad value (a scalar, if any) is charged nothing
        return [max(0, demand - (out - sizes[0]))] + [0] * (len(sizes) - 1)
    if node.op is Op.GATHER:
        return _gather_needs(graph, node, demand)
    if node.op in ops.WINDOW:
        return _window_needs(graph, node, demand)
    if node.op in (Op.CONV, Op.CONV_TRANSPOSE):
        return _conv_needs(graph, node, demand)
    # elementwise (broadcast included), reduce, Broadcast, Transpose, Reshape, MatMul: every input
    # element feeds the same number out/n of outputs, so `demand` outputs need demand * n / out of them
    return [_ceil_div(demand * n, out) for n in sizes]


# -- the arithmetic a node must do -------------------------------------------------------


def floor_flops(graph: Graph, node: Node, fast_convolution: bool = True) -> int:
    """FLOPs any implementation of ``node`` performs for its whole output (``node_flops`` where it is tight);
    ``fast_convolution``: a convolution may run a fast algorithm (see ``Device.fast_convolution``)."""
    if node.op in _FREE or node.op is Op.OPAQUE or node.op in ops.LAYOUT:
        return 0
    if node.op in ops.REDUCE:
        return max(0, graph.tensors[node.inputs[0]].numel - graph.tensors[node.output].numel)
    flops = node_flops(graph, node)
    if fast_convolution and node.op in (Op.CONV, Op.CONV_TRANSPOSE):
        a, kernel = node.attrs, graph.tensors[node.inputs[1]].shape[2:]
        phases = _prod(min(k, s // math.gcd(d, s)) for k, s, d in zip(kernel, a["strides"], a["dilations"]))
        flops = flops // max(1, _prod(kernel)) * phases
    return flops


# -- a kernel's work and its bound ---------------------------------------------------------


def kernel_work(graph: Graph, nodes: Iterable[int], inputs: Sequence[str], outputs: Sequence[str], *,
                fast_convolution: bool = True, parts: Mapping[int, float] | None = None) -> KernelWork:
    """The least work of the kernel computing ``outputs`` from ``inputs`` with ``nodes`` (indices into graph.nodes);
    ``fast_convolution`` as in ``floor_flops`` (True: the smaller count, a floor on every device); ``parts``, the
    seconds some LINEAR nodes took alone (``part_floor_s``).

    A kernel of views alone (``_may_be_a_view``) may return a view of its input (the library backend and the
    compiled unit do): it need move nothing."""
    t = graph.tensors
    nodes = list(nodes)
    if nodes and all(_may_be_a_view(graph.nodes[i]) for i in nodes):
        return KernelWork(bytes_read=0, bytes_written=0, vector_flops=0, matrix_flops=0)
    need: dict[str, int] = {name: t[name].numel for name in outputs}
    vector = matrix = 0
    part = 0.0
    for index in sorted(nodes, reverse=True):  # graph.nodes is topological: consumers first
        node = graph.nodes[index]
        if node.op is Op.OPAQUE:
            continue
        demand = need.get(node.output, 0)
        size = t[node.output].numel
        if demand <= 0 or size == 0:
            continue
        flops = floor_flops(graph, node, fast_convolution) * demand // size
        if node.op in ops.LINEAR:
            matrix += flops
            if parts and index in parts:
                part = max(part, part_floor_s(parts[index]) * demand / size)
        else:
            vector += flops
        for name, n in zip(node.inputs, input_needs(graph, node, demand)):
            if name:
                need[name] = max(need.get(name, 0), n)
    read = sum(min(need.get(name, 0), t[name].numel) * itemsize(t[name].dtype) for name in dict.fromkeys(inputs))
    written = sum(t[name].nbytes for name in dict.fromkeys(outputs))
    return KernelWork(bytes_read=read, bytes_written=written, vector_flops=vector, matrix_flops=matrix,
                      loop_bytes=_loop_bytes(graph, [graph.nodes[i] for i in nodes], inputs, outputs), part_s=part)


def _may_be_a_view(node: Node) -> bool:
    """Whether a backend may compute ``node`` as a view of its input, copying nothing: a reshape, a transpose
    (torch's ``permute``), a broadcast (``expand``), a slice with positive steps. The library backend returns
    Segformer-B0's transposes as views (7.1 us a call against its 5.6 us calling cost; Inductor's copy 85 us),
    under the 11.6 us floor of a copy."""
    if node.op is Op.SLICE:
        return all(step > 0 for step in node.attrs["steps"])
    return node.op in (Op.RESHAPE, Op.TRANSPOSE, Op.BROADCAST)


def _loop_bytes(graph: Graph, nodes: list[Node], inputs: Sequence[str], outputs: Sequence[str]) -> int:
    """The bytes the loops of a kernel with a library call must touch: tensors of the kernel's boundary they
    read or write, and each tensor passed between a loop and the call. The calls: a MATMUL with any loops; a
    convolution with loops before it (a prologue: no CPU library fuses one, while oneDNN applies the bias,
    activation and sum after a convolution as post-ops of the same call). Reshapes are views: a tensor seen
    through one is the tensor. 0 for a kernel without such a call or without loops."""
    source = {n.output: n.inputs[0] for n in nodes if n.op is Op.RESHAPE}

    def root(name: str) -> str:
        while name in source:
            name = source[name]
        return name

    products = [n for n in nodes if n.op is Op.MATMUL]
    loops = [n for n in nodes if n.op not in (Op.MATMUL, Op.RESHAPE, Op.OPAQUE)]
    if not products:
        products = [n for n in nodes if n.op in (Op.CONV, Op.CONV_TRANSPOSE)]
        loops = _feeding([n for n in loops if n.op not in ops.LINEAR],
                         {root(n) for node in products for n in node.inputs if n}, root)
    if not products or not loops:
        return 0
    boundary = {root(n) for n in (*inputs, *outputs)}
    by_loops = {root(n) for node in loops for n in (*node.inputs, node.output) if n}
    by_products = {root(n) for node in products for n in (*node.inputs, node.output) if n}
    touched = (by_loops & boundary) | (by_loops & by_products)
    return sum(graph.tensors[name].nbytes for name in touched)


def _feeding(loops: list[Node], targets: set[str], root) -> list[Node]:
    """The loops whose results reach ``targets`` through other loops (``loops`` is in topological order)."""
    wanted, feeding = set(targets), []
    for node in reversed(loops):
        if root(node.output) in wanted:
            feeding.append(node)
            wanted.update(root(n) for n in node.inputs if n)
    return feeding[::-1]


def memory_time(device: Device, work: KernelWork, warm: bool = True) -> float:
    """Seconds the kernel's bytes need at least: through the cache, and beyond its capacity through memory.

    ``warm=False`` charges every byte to device memory: the floor only for a kernel whose inputs were
    flushed from the cache and whose outputs must reach memory before it counts as done.
    """
    cache = device.cache_bytes if warm else 0
    spill = max(0, work.bytes_read - cache) + max(0, work.bytes_written - cache)
    return max(work.bytes_moved / device.cache_bandwidth, spill / device.memory_bandwidth)


def matrix_time(device: Device, work: KernelWork, dtype: str = "float32") -> float:
    """Seconds the kernel's products and convolutions need at least: at the matrix peak, or as measured alone."""
    return max(work.matrix_flops / device.matrix_peak(dtype), work.part_s)


def compute_time(device: Device, work: KernelWork, dtype: str = "float32") -> float:
    """Seconds the kernel's FLOPs need at least; vector and matrix units may run at once."""
    return max(work.vector_flops / device.vector_peak(dtype), matrix_time(device, work, dtype))


def lower_bound(device: Device, work: KernelWork, dtype: str = "float32", *, warm: bool = True) -> float:
    """Seconds no kernel doing ``work`` on ``device`` can beat (``warm``: see ``memory_time``)."""
    overlapped = max(memory_time(device, work, warm), compute_time(device, work, dtype))
    if device.kind == "cpu" and work.loop_bytes:
        loops = max(work.vector_flops / device.vector_peak(dtype), work.loop_bytes / device.cache_bandwidth)
        overlapped = max(overlapped, matrix_time(device, work, dtype) + loops)
    return device.launch_overhead + overlapped


def kernel_dtype(graph: Graph, names: Iterable[str]) -> str:
    """The compute dtype to bound a kernel with: a 16-bit float if it touches one (faster peaks), else float32."""
    dtypes = {graph.tensors[name].dtype for name in names}
    return next((d for d in HALF_DTYPES if d in dtypes), "float32")


def candidate_bounds(graph: Graph, candidates: Iterable, device: Device, dtype: str | None = None, *,
                     warm: bool = True, parts: Mapping[int, float] | None = None) -> list[float]:
    """``lower_bound`` of each candidate (anything with ``.nodes``, ``.inputs``, ``.outputs``), in order.

    ``dtype=None`` bounds each candidate with ``kernel_dtype`` of its inputs and outputs; ``parts``, the seconds
    LINEAR nodes took alone (``part_floor_s``).
    """
    bounds = []
    for c in candidates:
        work = kernel_work(graph, c.nodes, c.inputs, c.outputs, fast_convolution=device.fast_convolution,
                           parts=parts)
        kind = dtype or kernel_dtype(graph, (*c.inputs, *c.outputs))
        bounds.append(lower_bound(device, work, kind, warm=warm))
    return bounds
