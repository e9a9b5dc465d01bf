"""ONNX Runtime's MLAS kernels as operators a compiled unit calls: ``ops().matmul`` (an
activation by a constant weight; ``matmul_blocks``, the same in column blocks), ``batched_matmul`` (two
activations, attention's products) and ``softmax`` (over the last axis); and ``mkl_matmul``, a product by a
constant weight in MKL's packed GEMM, which AOTInductor's own code cannot call (the packed weight holds its
address, so a package cannot carry it: the operator packs it when it is first called).

On AVX2 CPUs MLAS multiplies float32 matrices 10-40% faster than every path
torch offers (MKL, oneDNN with packed weights, Inductor's C++ template;
``benchmarks/gemm_paths.py``), and its softmax takes half the time of
Inductor's loops. A product of an activation with a constant weight runs as a
one-MatMul ONNX Runtime session whose weight is an initializer (MLAS packs it
once, when the session opens); the others as one-node sessions without
initializers.

The operators are C++ (``ort_gemm_op.cpp``, built by ``native.py``): the unit
calls them with no Python in between, and they split the work among torch's
own OpenMP threads, each running its share through a session on one thread.
A session opens on its operator's first call, from a key baked in when the
unit is compiled (a random unit token and the operator's slot); its one-node
model comes from ``korch::ort_gemm_model`` or ``korch::ort_op_model``, here.
Fission writes a softmax as five primitives: ``softmaxes`` finds them in a
kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from korch.backends import native
from korch.backends.torch_ops import is_pointwise_conv
from korch.ir.graph import Graph, Node
from korch.ir.interpret import pad_spatial, windows
from korch.ir.ops import Op

_SOURCE = Path(__file__).with_name("ort_gemm_op.cpp")
_HEADERS = (Path(__file__).with_name("direct_conv.h"),)  # what the source includes from this package
# The operators' namespace names the sources that define them: executables of two korch versions, each
# carrying its own library, run side by side in one process (torch allows one library per namespace).
NAMESPACE = "korch_ort_" + hashlib.sha256(b"".join(p.read_bytes() for p in (_SOURCE, *_HEADERS))).hexdigest()[:12]
# the operator library's name in an executable's directory: its namespace (``korch_ort`` before 2026-11-24)
LIBRARY_FILE = f"{NAMESPACE}.so"


def ops(namespace: str = NAMESPACE):
    """The operators of ``namespace`` (this korch's by default), ``ops().matmul(...)``."""
    return getattr(torch.ops, namespace)


def _by_constant_weight(graph: Graph, node: Node, rank: int) -> bool:
    """Whether ``node`` takes a float32 activation and a constant float32 weight of ``rank`` axes, nothing else."""
    if len(node.inputs) != 2 or node.inputs[0] in graph.constants:
        return False
    weight = graph.constants.get(node.inputs[1])
    return weight is not None and weight.ndim == rank and weight.dtype == np.float32 \
        and graph.tensor(node.inputs[0]).dtype == "float32"


def eligible(graph: Graph, node: Node) -> bool:
    """A float32 MATMUL of an activation by a constant 2-D weight."""
    return node.op is Op.MATMUL and _by_constant_weight(graph, node, 2)


def conv1d_eligible(graph: Graph, node: Node) -> bool:
    """A float32 1-D convolution of one group, of an activation by a constant weight (Whisper's front end): a
    product of its windows by the weight (``conv1d_function``)."""
    return node.op is Op.CONV and node.attrs["group"] == 1 and _by_constant_weight(graph, node, 3)


def pointwise_conv_eligible(graph: Graph, node: Node) -> bool:
    """A float32 2-D 1x1 convolution (``torch_ops.is_pointwise_conv``) of an activation by a constant weight: a
    product of its pixels' channels by the weight (``pointwise_conv_function``)."""
    return is_pointwise_conv(graph, node) and _by_constant_weight(graph, node, 4)


def conv_columns(weight: np.ndarray) -> np.ndarray:
    """The weight of a convolution ``conv1d_eligible`` or ``pointwise_conv_eligible`` as the matrix its windows
    or pixels multiply: (C_out, C_in, k) as (C_in * k, C_out), (C_out, C_in, 1, 1) as (C_in, C_out)."""
    return np.ascontiguousarray(weight.reshape(weight.shape[0], -1).T)


def batched_eligible(graph: Graph, node: Node) -> bool:
    """A float32 MATMUL of two activations with equal batch axes (attention's products)."""
    if node.op is not Op.MATMUL or len(node.inputs) != 2 or any(n in graph.constants for n in node.inputs):
        return False
    a, b = (graph.tensor(n) for n in node.inputs)
    return a.dtype == b.dtype == "float32" and a.rank == b.rank >= 2 and a.shape[:-2] == b.shape[:-2]


@dataclasses.dataclass(frozen=True)
class Softmax:
    """A softmax over the last axis as fission writes it (max, subtract, exp, sum, divide): ``output``, the
    divide's, from ``input``; ``parts``, the names of the five primitives."""

    input: str
    output: str
    parts: frozenset[str]


def softmaxes(graph: Graph, nodes: Sequence[Node]) -> list[Softmax]:
    """The float32 softmaxes over the last axis among ``nodes`` (one kernel's primitives) whose intermediate
    values nothing else reads."""
    producer = {out: node for node in nodes for out in node.outputs}
    consumers = graph.consumers()
    found = []
    for divide in nodes:
        if divide.op is not Op.DIV:
            continue
        exp, total = (producer.get(name) for name in divide.inputs)
        if not (exp and total and exp.op is Op.EXP and total.op is Op.REDUCE_SUM and total.inputs == exp.outputs):
            continue
        shifted = producer.get(exp.inputs[0])
        if not shifted or shifted.op is not Op.SUB:
            continue
        x, peak = shifted.inputs[0], producer.get(shifted.inputs[1])
        if not peak or peak.op is not Op.REDUCE_MAX or peak.inputs != (x,) or graph.tensor(x).dtype != "float32":
            continue
        last = (graph.tensor(x).rank - 1,)
        if any(r.attrs.get("axes") != last or not r.attrs.get("keepdims") for r in (peak, total)):
            continue
        inner = (peak, shifted, exp, total)
        parts = frozenset(n.name for n in (*inner, divide))
        if any(n.output in graph.outputs or any(c.name not in parts for c in consumers.get(n.output, ()))
               for n in inner):
            continue
        found.append(Softmax(x, divide.output, parts))
    return found


def any_eligible(graph: Graph) -> bool:
    """Whether ``graph`` has a product, a 1-D convolution or a softmax that ONNX Runtime could run."""
    return any(eligible(graph, n) or batched_eligible(graph, n) or conv1d_eligible(graph, n)
               or pointwise_conv_eligible(graph, n) for n in graph.nodes) or bool(softmaxes(graph, graph.nodes))


def of_activations(graph: Graph) -> frozenset[str]:
    """The products of two activations and the softmaxes' parts of ``graph``: attention's work in MLAS."""
    return frozenset([n.name for n in graph.nodes if batched_eligible(graph, n)]
                     + [name for softmax in softmaxes(graph, graph.nodes) for name in softmax.parts])


def library() -> Path:
    """The operator library for this torch, built on first use (see ``native.build``)."""
    return native.build(_SOURCE, NAMESPACE)


def open_library(path: Path | None = None) -> None:
    """Make the operators callable in this process, from ``path`` (an executable's copy, named by its namespace) or
    the library built here."""
    namespace = NAMESPACE if path is None else Path(path).stem
    if not native.load(namespace, path or library()):
        return
    import onnxruntime

    runtime = sorted(Path(onnxruntime.__file__).parent.glob("capi/libonnxruntime.so*"))
    if not runtime:
        raise FileNotFoundError(f"no libonnxruntime.so in {Path(onnxruntime.__file__).parent / 'capi'}")
    ops(namespace).open_runtime(str(runtime[0]))
    fakes = {"matmul": lambda x, w, unit, slot: x.new_empty(*x.shape[:-1], w.shape[1]),
             "matmul_blocks": lambda x, w, unit, slot, blocks: x.new_empty(blocks, x.numel() // x.shape[-1],
                                                                           w.shape[1] // blocks),
             "batched_matmul": lambda a, b, unit, slot: a.new_empty(*a.shape[:-1], b.shape[-1]),
             "softmax": lambda x, unit, slot: x.new_empty(x.shape),
             "mkl_matmul": lambda x, w, unit, slot: x.new_empty(*x.shape[:-1], w.shape[1])}
    # imported here, since it builds on this module; importing it also defines korch::ort_nchwc_model, the
    # models the blocked convolutions open their sessions on
    from korch.backends import direct_conv, nchwc
    fakes["nchwc_conv"] = nchwc.fake_conv
    fakes["direct_conv"] = direct_conv.fake_conv
    for name, fake in fakes.items():
        if hasattr(ops(namespace), name):  # an executable of an earlier korch carries fewer operators
            torch.library.register_fake(f"{namespace}::{name}", fake)


def _model_bytes(w: torch.Tensor) -> torch.Tensor:
    """The one-MatMul ONNX model holding ``w``, serialized (what the C++ operator opens a session on)."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "korch_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(w.detach().cpu().numpy(), "w")])
    return _serialized(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))


def _serialized(model) -> torch.Tensor:
    return torch.frombuffer(bytearray(model.SerializeToString()), dtype=torch.uint8)


# the activation operators' one-node models, by the kind the C++ operator asks for
_OP_NODES = {
    "matmul": ("MatMul", "", {}),
    "matmul_transb": ("FusedMatMul", "com.microsoft", {"transB": 1}),
    "softmax": ("Softmax", "", {"axis": -1}),
}


def _op_model_bytes(kind: str) -> torch.Tensor:
    """The one-node ONNX model of activation operator ``kind`` (inputs x and, for products, b; output y)."""
    from onnx import TensorProto, helper

    op, domain, attrs = _OP_NODES[kind]
    names = ["x", "b"] if "matmul" in kind else ["x"]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], domain=domain, **attrs)], f"korch_{kind}",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid("", 13)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return _serialized(helper.make_model(graph, opset_imports=opsets, ir_version=8))


_LIBRARY = torch.library.Library("korch", "FRAGMENT")
_LIBRARY.define("ort_gemm_model(Tensor w) -> Tensor")
_LIBRARY.impl("ort_gemm_model", _model_bytes, "CompositeExplicitAutograd")
_LIBRARY.define("ort_op_model(str kind) -> Tensor")
_LIBRARY.impl("ort_op_model", _op_model_bytes, "CompositeExplicitAutograd")


# weights above this many bytes are cut into column blocks, one per thread (kRowSplitBytes in ort_gemm_op.cpp)
_ROW_SPLIT_BYTES = 4 << 20


def column_blocks(k: int, n: int) -> int:
    """How many column blocks a product by a ``k`` x ``n`` weight is computed in by ``product_function``, each
    thread writing its own: one per torch thread for a weight too large for every thread to stream all of,
    where the columns divide evenly; else 1 (the C++ operator splits the work and returns one array)."""
    threads = torch.get_num_threads()
    if k * n * 4 <= _ROW_SPLIT_BYTES or threads < 2 or n % threads or n // threads < 64:
        return 1
    return threads


def product_function(unit: int, slot: int, widths: Sequence[int], blocks: int = 1):
    """The NodeFn of eligible MATMULs of one activation, by weights side by side of ``widths`` columns: one
    product, its column blocks the outputs. With ``blocks`` > 1 it is computed in that many column blocks
    (``column_blocks``) and read through a view: the unit's kernels take its columns where they lie."""
    def run(x, w):
        if blocks > 1:
            y = ops().matmul_blocks(x, w, unit, slot, blocks).permute(1, 0, 2).reshape(*x.shape[:-1], w.shape[1])
        else:
            y = ops().matmul(x, w, unit, slot)
        return _by_columns(y, widths)
    run.blocks = blocks  # for inspection
    return run


def _by_columns(y: torch.Tensor, widths: Sequence[int]) -> list[torch.Tensor]:
    """A product by weights side by side, cut into each weight's columns."""
    return list(y.split(list(widths), dim=-1)) if len(widths) > 1 else [y]


def mkl_product_function(unit: int, slot: int, widths: Sequence[int]):
    """``product_function``'s step in MKL's packed GEMM instead (``korch_ort::mkl_matmul``: the weight packed on
    the first call, where it stays)."""
    def run(x, w):
        return _by_columns(ops().mkl_matmul(x, w, unit, slot), widths)
    return run


def mkl_packed_faster(graph: Graph) -> bool:
    """Whether this torch has MKL's packed GEMM (``mkl::_mkl_linear``: x86 builds) and it multiplies the largest
    product by a constant weight of ``graph`` faster than oneDNN's packed one, each call's fastest of
    ``_PROBE_CALLS``, the two taking turns. On AMD CPUs MKL runs generic code (ATen's MKL product reached 212
    GFLOP/s on a Zen 5 where oneDNN's packed one reached 480, ``cost.probe.matmul_paths``); on the AVX-512 Xeon
    its packed GEMM is 4-10% ahead of oneDNN and MLAS on the transformers' shapes (``benchmarks/gemm_paths.py``).
    A unit whose products run in MKL is compiled only where it may win."""
    if not (torch._C.has_mkl and hasattr(torch.ops.mkl, "_mkl_linear")):
        return False
    products = [n for n in graph.nodes if eligible(graph, n)]
    if not products:
        return False
    node = max(products, key=lambda n: graph.tensor(n.inputs[0]).numel * graph.tensor(n.output).shape[-1])
    k, n = graph.constants[node.inputs[1]].shape
    return _mkl_packed_faster(graph.tensor(node.inputs[0]).numel // k, k, n)


_PROBE_CALLS = 5


@functools.cache  # one answer a shape and process: the variants a unit compiles do not change from call to call
def _mkl_packed_faster(m: int, k: int, n: int) -> bool:
    from korch.cost.probe import matmul_paths

    x, weight = torch.rand(m, k), torch.rand(n, k)
    onednn = matmul_paths(x, weight.t()).get("oneDNN packed")  # the weight packed once, as the CPU probe times it
    if onednn is None:  # no oneDNN in this torch: nothing packed to weigh MKL's against
        return False
    by_mkl = torch.ops.mkl._mkl_reorder_linear_weight(weight, m)
    calls = {"mkl": lambda: torch.ops.mkl._mkl_linear(x, by_mkl, weight, None, m), "oneDNN": onednn}
    fastest = dict.fromkeys(calls, math.inf)
    with torch.inference_mode():
        for call in calls.values():  # warm-up
            call()
        for _ in range(_PROBE_CALLS):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                fastest[name] = min(fastest[name], time.perf_counter() - start)
    return fastest["mkl"] < fastest["oneDNN"]


def conv1d_function(unit: int, slot: int, node: Node, kernel: int):
    """The NodeFn of a ``conv1d_eligible`` CONV of ``kernel`` taps, given its weight as ``conv_columns``:
    the windows (N, L_out, C_in * k), times the weight in MLAS, seen as (N, C_out, L_out)."""
    a = node.attrs

    def run(x, columns):
        taps = windows(pad_spatial(x, a["pads"], 0.0), (kernel,), a["strides"], a["dilations"])
        return [ops().matmul(taps.permute(0, 2, 1, 3).flatten(2), columns, unit, slot).transpose(1, 2)]
    return run


def pointwise_conv_function(unit: int, slot: int, widths: Sequence[int] | None = None):
    """The NodeFn of ``pointwise_conv_eligible`` CONVs of one activation, given their weights as ``conv_columns``
    side by side (a (C_in, sum of ``widths``) matrix; one CONV by default): the pixels' channels
    (N * H * W, C_in) times the weight in MLAS, each CONV's columns seen as (N, C_out, H, W). The rows are a
    view of a value stored channels-last (any other is copied so first) and the outputs are channels-last (or
    the channels of one channels-last product). oneDNN's convolution spends 15-20 us a call more setting itself
    up (YOLOX-Nano's 64 -> 64 channels at 26x26: 30 against 15 us, 2 threads, Zen 5)."""
    def run(x, columns):
        n, c, h, w = x.shape
        # a value computed in the same kernel is laid out channels-last where it is made, not copied by the
        # operator (ATen's transposing copy, on one thread: YOLOX-Nano's SPP concatenation, 85 us a call)
        pixels = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
        y = ops().matmul(pixels.reshape(n * h * w, c), columns, unit, slot).view(n, h, w, columns.shape[1])
        parts = y.split(list(widths), dim=-1) if widths and len(widths) > 1 else [y]
        return [part.permute(0, 3, 1, 2) for part in parts]
    return run


def batched_function(unit: int, slot: int):
    """The NodeFn of a ``batched_eligible`` MATMUL."""
    return lambda a, b: [ops().batched_matmul(a, b, unit, slot)]


def softmax_function(unit: int, slot: int):
    """The NodeFn of a ``Softmax``: its input in, its output out."""
    return lambda x: [ops().softmax(x, unit, slot)]
