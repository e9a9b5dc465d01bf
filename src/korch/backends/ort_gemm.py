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

_SESSIONS: dict[tuple[int, int], "_Gemm"] = {}
_LOCK = threading.Lock()


def eligible(graph: Graph, node: Node) -> bool:
    """A float32 MATMUL of an activation by a constant 2-D weight."""
    if node.op is not Op.MATMUL or len(node.inputs) != 2:
        return False
    weight = graph.constants.get(node.inputs[1])
    if weight is None or node.inputs[0] in graph.constants:
        return False
    return weight.ndim == 2 and weight.dtype == np.float32 and graph.tensor(node.inputs[0]).dtype == "float32"


class _Gemm:
    """One weight's session, called through ONNX Runtime's C-level I/O binding: the Python wrapper
    (``InferenceSession.io_binding``) costs 20 us more per call than the 8 us this path takes."""

    def __init__(self, weight: torch.Tensor):
        from onnx import TensorProto, helper, numpy_helper
        from onnxruntime.capi import _pybind_state

        from korch.ir import ort

        k, n = weight.shape
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "korch_gemm",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
            [numpy_helper.from_array(weight.detach().cpu().numpy(), "w")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        self.session = ort.session(model, threads=torch.get_num_threads(), spinning=False)
        self.shape = (k, n)
        self._binding = _pybind_state.SessionIOBinding(self.session._sess)
        self._cpu = _pybind_state.OrtDevice(_pybind_state.OrtDevice.cpu(), _pybind_state.OrtDevice.default_memory(), 0)
        self._run_options = _pybind_state.RunOptions()
        self._lock = threading.Lock()

    def __call__(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        with self._lock:
            self._binding.bind_input("x", self._cpu, _FLOAT32, list(rows.shape), rows.data_ptr())
            self._binding.bind_output("y", self._cpu, _FLOAT32, list(out.shape), out.data_ptr())
            self.session._sess.run_with_iobinding(self._binding, self._run_options)


_FLOAT32 = np.dtype(np.float32)


def _matmul(x: torch.Tensor, w: torch.Tensor, unit: int, slot: int) -> torch.Tensor:
    gemm = _SESSIONS.get((unit, slot))
    if gemm is None:
        with _LOCK:
            gemm = _SESSIONS.get((unit, slot)) or _SESSIONS.setdefault((unit, slot), _Gemm(w))
    if gemm.shape != tuple(w.shape):
        raise RuntimeError(f"korch::ort_matmul: unit {unit} slot {slot} was opened for a {gemm.shape} weight, "
                           f"called with {tuple(w.shape)}")
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty((rows.shape[0], w.shape[1]), dtype=x.dtype)
    gemm(rows, out)
    return out.view(*x.shape[:-1], w.shape[1])


# registered with the dispatcher directly: ``torch.library.custom_op``'s wrapper costs 30 us more per call
_LIBRARY = torch.library.Library("korch", "DEF")
_LIBRARY.define("ort_matmul(Tensor x, Tensor w, int unit, int slot) -> Tensor")
_LIBRARY.impl("ort_matmul", _matmul, "CPU")
torch.library.register_fake("korch::ort_matmul", lambda x, w, unit, slot: x.new_empty(*x.shape[:-1], w.shape[1]),
                            lib=_LIBRARY)


def node_function(unit: int, slot: int):
    """The NodeFn of an eligible MATMUL in unit ``unit``: one output, computed by ONNX Runtime."""
    return lambda x, w: [torch.ops.korch.ort_matmul(x, w, unit, slot)]
