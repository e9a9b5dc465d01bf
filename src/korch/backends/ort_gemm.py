"""ONNX Runtime's GEMM (MLAS) as an operator a compiled unit calls: ``torch.ops.korch.ort_matmul``.

On AVX2 CPUs MLAS multiplies float32 matrices 10-40% faster than every path
torch offers (MKL, oneDNN with packed weights, Inductor's C++ template;
``benchmarks/gemm_paths.py``). A product of an activation with a constant
weight can therefore run as a one-MatMul ONNX Runtime session whose weight is
an initializer (MLAS packs it once, when the session opens), called from the
AOTInductor unit through a ``torch.library`` operator and writing its result
in place through I/O binding.

The operator receives the weight the unit holds and a key baked in when the
unit is compiled (a random unit token and the GEMM's slot), opens the session
on its first call and keeps it for the process. Its threads do not spin
between calls: they share the cores with torch's OpenMP threads (which must
not spin either, ``threads.py``).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

_SESSIONS: dict[tuple[int, int], object] = {}
_LOCK = threading.Lock()


def eligible(graph: Graph, node: Node) -> bool:
    """A float32 MATMUL of an activation by a constant 2-D weight."""
    if node.op is not Op.MATMUL or len(node.inputs) != 2:
        return False
    weight = graph.constants.get(node.inputs[1])
    if weight is None or node.inputs[0] in graph.constants:
        return False
    return weight.ndim == 2 and weight.dtype == np.float32 and graph.tensor(node.inputs[0]).dtype == "float32"


def _session(weight: torch.Tensor):
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    k, n = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "korch_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(weight.detach().cpu().numpy(), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = torch.get_num_threads()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _matmul(x: torch.Tensor, w: torch.Tensor, unit: int, slot: int) -> torch.Tensor:
    key = (unit, slot)
    session = _SESSIONS.get(key)
    if session is None:
        with _LOCK:
            session = _SESSIONS.get(key) or _SESSIONS.setdefault(key, _session(w))
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = x.new_empty(rows.shape[0], w.shape[1])
    binding = session.io_binding()
    binding.bind_input("x", "cpu", 0, np.float32, list(rows.shape), rows.data_ptr())
    binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.data_ptr())
    session.run_with_iobinding(binding)
    return out.reshape(*x.shape[:-1], w.shape[1])


# annotations are strings under ``from __future__ import annotations``: the schema is given explicitly
ort_matmul = torch.library.custom_op("korch::ort_matmul", _matmul, mutates_args=(),
                                     schema="(Tensor x, Tensor w, int unit, int slot) -> Tensor")
ort_matmul.register_fake(lambda x, w, unit, slot: x.new_empty(*x.shape[:-1], w.shape[1]))


def forget(unit: int) -> None:
    """Close the sessions of a unit no longer loaded."""
    with _LOCK:
        for key in [k for k in _SESSIONS if k[0] == unit]:
            del _SESSIONS[key]


def node_function(unit: int, slot: int):
    """The NodeFn of an eligible MATMUL in unit ``unit``: one output, computed by ONNX Runtime."""
    return lambda x, w: [torch.ops.korch.ort_matmul(x, w, unit, slot)]
