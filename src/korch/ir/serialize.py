"""JSON form of a primitive graph: ``to_json`` / ``from_json``, and atomic ``save`` / ``load``.

Constants are stored inline as base64 of their raw little-endian bytes. Tuples
in attributes come back as tuples, so a graph read back compares equal, node
for node, to the one written.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from korch.fsutil import atomic_write_bytes
from korch.ir.graph import CONTIGUOUS, Attrs, Graph, Node, Tensor
from korch.ir.ops import Op

FORMAT = "korch-ir"
VERSION = 1


def _listify(value: Any) -> Any:
    return [_listify(v) for v in value] if isinstance(value, tuple) else value


def _tuplify(value: Any) -> Any:
    return tuple(_tuplify(v) for v in value) if isinstance(value, list) else value


def to_json(graph: Graph) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": graph.name,
        "opset": graph.opset,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
                     **({} if t.layout == CONTIGUOUS else {"layout": t.layout})} for t in graph.tensors.values()],
        "constants": {
            name: base64.b64encode(np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()).decode()
            for name, value in graph.constants.items()
        },
        "nodes": [
            {"op": n.op.name, "name": n.name, "inputs": list(n.inputs), "outputs": list(n.outputs),
             "attrs": {k: _listify(v) for k, v in n.attrs.items()}}
            for n in graph.nodes
        ],
    }


def from_json(data: dict) -> Graph:
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} v{VERSION} document")
    graph = Graph(name=data["name"], opset=data["opset"], inputs=list(data["inputs"]), outputs=list(data["outputs"]))
    for t in data["tensors"]:
        graph.tensors[t["name"]] = Tensor(name=t["name"], shape=tuple(t["shape"]), dtype=t["dtype"],
                                          layout=t.get("layout", CONTIGUOUS))
    for name, encoded in data["constants"].items():
        t = graph.tensors[name]
        raw = np.frombuffer(base64.b64decode(encoded), dtype=np.dtype(t.dtype).newbyteorder("<"))
        graph.constants[name] = raw.astype(t.dtype).reshape(t.shape)
    for n in data["nodes"]:
        attrs = Attrs({k: _tuplify(v) for k, v in n["attrs"].items()})
        graph.nodes.append(Node(op=Op[n["op"]], name=n["name"], inputs=tuple(n["inputs"]),
                                outputs=tuple(n["outputs"]), attrs=attrs))
    return graph


def save(graph: Graph, path: str | os.PathLike) -> Path:
    return atomic_write_bytes(path, json.dumps(to_json(graph)).encode())


def load(path: str | os.PathLike) -> Graph:
    return from_json(json.loads(Path(path).read_bytes()))
