"""ONNX Runtime as korch's outside reference and as the library that runs opaque nodes.

``run_model`` runs a whole ONNX model (the check every stage is held to);
``run_node`` runs one OPAQUE primitive as a one-node model, sessions cached.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from korch.ir import dtypes
from korch.ir.graph import Node

_MAX_IR_VERSION = 10
ort.set_default_logger_severity(4)  # errors reach the user as korch's one-line errors, not as ONNX Runtime's logs


def session(model: onnx.ModelProto | bytes | str, optimize: bool = True, *, threads: int | None = None,
            spinning: bool = True) -> ort.InferenceSession:
    """A CPU session of ``model``; ``threads`` (default ONNX Runtime's) of which none spins between runs
    unless ``spinning``."""
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: failures reach the user as korch's one-line errors
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if isinstance(model, onnx.ModelProto):
        if model.ir_version > _MAX_IR_VERSION:
            # onnx writes newer IR versions than ONNX Runtime reads; korch's models use nothing past 10
            model = onnx.ModelProto.FromString(model.SerializeToString())
            model.ir_version = _MAX_IR_VERSION
        model = model.SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def run_model(model: onnx.ModelProto | bytes | str, feeds: Mapping[str, np.ndarray],
              outputs: Sequence[str] | None = None, optimize: bool = True) -> dict[str, np.ndarray]:
    sess = session(model, optimize)
    names = list(outputs) if outputs else [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds))))


@functools.lru_cache(maxsize=256)
def _node_session(proto_bytes: bytes, input_types: tuple, output_names: tuple, imports: tuple) -> ort.InferenceSession:
    node = onnx.NodeProto.FromString(proto_bytes)
    inputs = [helper.make_tensor_value_info(name, dtypes.to_onnx(dtype), list(shape))
              for name, (shape, dtype) in input_types if name]
    outputs = [helper.make_empty_tensor_value_info(name) for name in output_names]
    graph = helper.make_graph([node], "opaque", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in imports])
    model.ir_version = min(model.ir_version, 10)
    return session(model, optimize=False)


def run_node(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Run an OPAQUE primitive in ONNX Runtime (absent optional inputs are ``None``)."""
    from korch.ir.to_onnx import captures, decode_opaque

    captured = captures(node)
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs[:len(inputs) - len(captured)])]
    names += captured  # values the node's subgraphs read from the enclosing graph, by their own names
    outs = tuple(f"out{i}" for i in range(len(node.outputs)))
    proto = decode_opaque(node.replace(inputs=tuple(names), outputs=outs))
    types = tuple((n, (tuple(x.shape), x.dtype.name)) for n, x in zip(names, inputs) if x is not None)
    imports = (("", node.attrs["opset"]),) if node.attrs["domain"] in ("", "ai.onnx") else (
        ("", node.attrs.get("default_opset", 17)), (node.attrs["domain"], node.attrs["opset"]))
    sess = _node_session(proto.SerializeToString(), types, outs, imports)
    feeds = {n: x for n, x in zip(names, inputs) if x is not None}
    return sess.run(list(outs), feeds)


def input_specs(session: ort.InferenceSession) -> dict[str, tuple[tuple[int, ...], str]]:
    """A session's inputs as ``random_inputs`` takes them: named axes as 1, ONNX Runtime's type names
    ("tensor(float)") as numpy's ("float32")."""
    numpy_name = {"float": "float32", "double": "float64"}
    return {i.name: (tuple(d if isinstance(d, int) else 1 for d in i.shape),
                     numpy_name.get(i.type[len("tensor("):-1], i.type[len("tensor("):-1]))
            for i in session.get_inputs()}


def random_inputs(specs: Mapping[str, tuple[tuple[int, ...], str]], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random arrays: floats ~ N(0, 1), ints in [0, 10), bools fair coins."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (shape, dtype) in specs.items():
        if dtypes.is_float(dtype):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == "bool":
            feeds[name] = rng.random(shape) < 0.5
        else:
            feeds[name] = rng.integers(0, 10, size=shape).astype(dtype)
    return feeds
