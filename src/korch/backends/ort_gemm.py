"""ONNX Runtime's GEMM (MLAS) as an operator a compiled unit calls: ``torch.ops.korch_ort.matmul``.

On AVX2 CPUs MLAS multiplies float32 matrices 10-40% faster than every path
torch offers (MKL, oneDNN with packed weights, Inductor's C++ template;
``benchmarks/gemm_paths.py``). A product of an activation with a constant
weight can therefore run as a one-MatMul ONNX Runtime session whose weight is
an initializer (MLAS packs it once, when the session opens).

The operator is C++ (``ort_gemm_op.cpp``, built by ``native.py``): the unit
calls it with no Python in between, and it splits the rows among torch's own
OpenMP threads, each running its rows through the session on one thread. The
session opens on the operator's first call, from the weight the unit holds
and a key baked in when the unit is compiled (a random unit token and the
GEMM's slot); the one-MatMul model comes from ``korch::ort_gemm_model``, here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from korch.backends import native
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

# the operator library's name in an executable's directory
LIBRARY_FILE = "korch_ort.so"
_NAMESPACE = "korch_ort"
_SOURCE = Path(__file__).with_name("ort_gemm_op.cpp")


def eligible(graph: Graph, node: Node) -> bool:
    """A float32 MATMUL of an activation by a constant 2-D weight."""
    if node.op is not Op.MATMUL or len(node.inputs) != 2:
        return False
    weight = graph.constants.get(node.inputs[1])
    if weight is None or node.inputs[0] in graph.constants:
        return False
    return weight.ndim == 2 and weight.dtype == np.float32 and graph.tensor(node.inputs[0]).dtype == "float32"


def library() -> Path:
    """The operator library for this torch, built on first use (see ``native.build``)."""
    return native.build(_SOURCE)


def open_library(path: Path | None = None) -> None:
    """Make ``torch.ops.korch_ort.matmul`` callable in this process, from ``path`` (an executable's copy) or
    the library built here."""
    if not native.load(_NAMESPACE, path or library()):
        return
    import onnxruntime

    runtime = sorted(Path(onnxruntime.__file__).parent.glob("capi/libonnxruntime.so*"))
    if not runtime:
        raise FileNotFoundError(f"no libonnxruntime.so in {Path(onnxruntime.__file__).parent / 'capi'}")
    torch.ops.korch_ort.open_runtime(str(runtime[0]))
    torch.library.register_fake("korch_ort::matmul",
                                lambda x, w, unit, slot: x.new_empty(*x.shape[:-1], w.shape[1]))


def _model_bytes(w: torch.Tensor) -> torch.Tensor:
    """The one-MatMul ONNX model holding ``w``, serialized (what the C++ operator opens a session on)."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "korch_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(w.detach().cpu().numpy(), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return torch.frombuffer(bytearray(model.SerializeToString()), dtype=torch.uint8)


_LIBRARY = torch.library.Library("korch", "FRAGMENT")
_LIBRARY.define("ort_gemm_model(Tensor w) -> Tensor")
_LIBRARY.impl("ort_gemm_model", _model_bytes, "CompositeExplicitAutograd")


def node_function(unit: int, slot: int):
    """The NodeFn of an eligible MATMUL in unit ``unit``: one output, computed by ONNX Runtime."""
    return lambda x, w: [torch.ops.korch_ort.matmul(x, w, unit, slot)]
