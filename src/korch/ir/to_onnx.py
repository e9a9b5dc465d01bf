"""Export a primitive graph to ONNX, one standard ONNX node per primitive.

The result opens in ONNX Runtime and Netron, so a person can look at the
primitive graph and ONNX Runtime can check it. Each primitive maps to the ONNX
operator of the same meaning at opset ``max(config.export_opset, graph.opset)``;
opaque nodes are written back as the ONNX node they came from, brought to that
opset by onnx's version converter when the model's is older.
"""

from __future__ import annotations

import base64

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from korch import config
from korch.ir import dtypes, ops
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

_INT64_MIN = np.iinfo(np.int64).min
_GLOBAL_POOL = {Op.REDUCE_MEAN: "GlobalAveragePool", Op.REDUCE_MAX: "GlobalMaxPool"}


def decode_opaque(node: Node) -> onnx.NodeProto:
    """The ONNX node an OPAQUE primitive keeps, with its inputs and outputs renamed to the IR's (its trailing
    inputs that are values its subgraphs capture from the enclosing graph by name are not node inputs)."""
    proto = onnx.NodeProto.FromString(base64.b64decode(node.attrs["node"]))
    del proto.input[:]
    del proto.output[:]
    proto.input.extend(node.inputs[:len(node.inputs) - len(captures(node))])
    proto.output.extend(node.outputs)
    return proto


def captures(node: Node) -> tuple[str, ...]:
    """The enclosing graph's names an OPAQUE node's subgraphs read (its last ``len`` inputs carry them)."""
    return tuple(node.attrs.get("captures", ()))


def outer_scope_names(node: onnx.NodeProto) -> list[str]:
    """Names the node's subgraphs (If branches, Loop and Scan bodies, nested ones included) read without
    defining them: values of the enclosing graph, in first-use order."""
    used: dict[str, None] = {}

    def visit(graph: onnx.GraphProto, outer_defined: frozenset) -> None:
        defined = set(outer_defined) | {v.name for v in graph.input} | {i.name for i in graph.initializer}
        for inner in graph.node:
            for name in inner.input:
                if name and name not in defined:
                    used.setdefault(name)
            for attribute in inner.attribute:
                for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    visit(sub, frozenset(defined))
            defined.update(o for o in inner.output if o)

    for attribute in node.attribute:
        for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
            visit(sub, frozenset())
    return list(used)


def encode_opaque(proto: onnx.NodeProto) -> str:
    return base64.b64encode(proto.SerializeToString()).decode()


class _Writer:
    def __init__(self, graph: Graph, opset: int):
        self.graph = graph
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.domains: dict[str, int] = {}

    def const(self, hint: str, value) -> str:
        name = f"{hint}__{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def ints(self, hint: str, values) -> str:
        return self.const(hint, np.asarray(values, dtype=np.int64))

    def emit(self, op_type: str, inputs, outputs, name: str, **attrs) -> None:
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=name, **attrs))

    def write(self, node: Node) -> None:
        a, op, out, name = node.attrs, node.op, node.outputs, node.name or node.outputs[0]
        x = node.inputs
        if op is Op.OPAQUE:
            for value, name in zip(x[len(x) - len(captures(node)):], captures(node)):
                if value != name:  # the subgraphs read the value by its name in the original model
                    self.emit("Identity", [value], [name], f"{name}/capture")
            if a["domain"] not in ("", "ai.onnx"):
                self.nodes.append(decode_opaque(node))
                self.domains[a["domain"]] = a["opset"]
            else:
                self._opaque_at_export_opset(node)
        elif op is Op.CAST:
            self.emit("Cast", x, out, name, to=dtypes.to_onnx(a["to"]))
        elif op is Op.MOD:
            self.emit("Mod", x, out, name, fmod=a["fmod"])
        elif op in ops.ELEMENTWISE:
            self.emit(op.value, x, out, name)
        elif op in _GLOBAL_POOL and a["keepdims"] and a["axes"] == tuple(range(2, self.graph.tensors[x[0]].rank)):
            # the same meaning; ONNX Runtime sums in the same order as for the original model's global pools
            self.emit(_GLOBAL_POOL[op], x, out, name)
        elif op in ops.REDUCE:
            self.emit(op.value, [x[0], self.ints(name, a["axes"])], out, name, keepdims=int(a["keepdims"]))
        elif op in ops.WINDOW:
            self._pool(node)
        elif op is Op.TRANSPOSE:
            self.emit("Transpose", x, out, name, perm=list(a["perm"]))
        elif op is Op.RESHAPE:
            self.emit("Reshape", [x[0], self.ints(name, a["shape"])], out, name)
        elif op is Op.SLICE:
            self._slice(node)
        elif op is Op.CONCAT:
            self.emit("Concat", x, out, name, axis=a["axis"])
        elif op is Op.PAD:
            value = [x[1]] if len(x) > 1 else []
            self.emit("Pad", [x[0], self.ints(name, a["pads"]), *value], out, name, mode=a["mode"])
        elif op is Op.GATHER:
            self.emit("Gather", x, out, name, axis=a["axis"])
        elif op is Op.BROADCAST:
            self.emit("Expand", [x[0], self.ints(name, a["shape"])], out, name)
        elif op is Op.MATMUL:
            self.emit("MatMul", x, out, name)
        elif op in (Op.CONV, Op.CONV_TRANSPOSE):
            extra = {"output_padding": list(a["output_padding"])} if op is Op.CONV_TRANSPOSE else {}
            self.emit(op.value, x, out, name, strides=list(a["strides"]), pads=list(a["pads"]),
                      dilations=list(a["dilations"]), group=a["group"], **extra)
        else:  # pragma: no cover - guarded by test_every_op_exports
            raise NotImplementedError(f"no ONNX form for {op}")

    def _opaque_at_export_opset(self, node: Node) -> None:
        """Write an opaque ONNX node, converted by onnx's version converter if the model's opset is older."""
        proto = decode_opaque(node)
        if node.attrs["opset"] == self.opset:
            self.nodes.append(proto)
            return
        t = self.graph.tensors
        single = helper.make_model(
            helper.make_graph([proto], "opaque",
                              [helper.make_tensor_value_info(x, dtypes.to_onnx(t[x].dtype), list(t[x].shape))
                               for x in dict.fromkeys(node.inputs) if x],
                              [helper.make_tensor_value_info(x, dtypes.to_onnx(t[x].dtype), list(t[x].shape))
                               for x in node.outputs]),
            opset_imports=[helper.make_opsetid("", node.attrs["opset"])])
        converted = version_converter.convert_version(single, self.opset).graph
        prefix = f"{node.name or node.outputs[0]}__v{self.opset}/"
        keep = set(node.inputs) | set(node.outputs)
        rename = {}
        for inner in converted.node:
            for i, name in enumerate(inner.output):
                if name not in keep:
                    rename[name] = inner.output[i] = prefix + name
        for init in converted.initializer:
            rename[init.name] = init.name = prefix + init.name
            self.initializers.append(init)
        for inner in converted.node:
            for i, name in enumerate(inner.input):
                inner.input[i] = rename.get(name, name)
            self.nodes.append(inner)

    def _pool(self, node: Node) -> None:
        a, x, name = node.attrs, node.inputs[0], node.name or node.outputs[0]
        pads, k = list(a["pads"]), len(a["kernel"])
        extra = {"count_include_pad": int(a["count_include_pad"])} if node.op is Op.AVG_POOL else {}
        # (an average pool gets no such pad: ONNX Runtime's pad fusion would fold a zero Pad straight back)
        if node.op is Op.MAX_POOL and any(p >= a["kernel"][i % k] for i, p in enumerate(pads)):
            # ONNX Runtime refuses pads as wide as the kernel: pad with -inf first
            t = self.graph.tensors[x]
            fill = -np.inf if dtypes.is_float(t.dtype) else np.iinfo(t.dtype).min
            padded = f"{name}__padded"
            full = [0, 0] + pads[:k] + [0, 0] + pads[k:]
            self.emit("Pad", [x, self.ints(name, full), self.const(name, np.array(fill, dtype=t.dtype))], [padded], padded)
            x, pads = padded, [0] * (2 * k)
        self.emit(node.op.value, [x], node.outputs, name, kernel_shape=list(a["kernel"]), strides=list(a["strides"]),
                  pads=pads, dilations=list(a["dilations"]), **extra)

    def _slice(self, node: Node) -> None:
        a = node.attrs
        shape = self.graph.tensors[node.output].shape
        ends = []
        for start, step, count in zip(a["starts"], a["steps"], shape):
            end = start + count * step
            # a negative end would count from the back; "before index 0" is INT64_MIN
            ends.append(end if end >= 0 else _INT64_MIN)
        axes = list(range(len(shape)))
        self.emit("Slice", [node.inputs[0], self.ints(node.name, a["starts"]), self.ints(node.name, ends),
                            self.ints(node.name, axes), self.ints(node.name, a["steps"])], node.outputs, node.name)


def to_onnx(graph: Graph) -> onnx.ModelProto:
    opset = max(config.export_opset, graph.opset)
    writer = _Writer(graph, opset)
    for node in graph.nodes:
        writer.write(node)

    def info(name: str) -> onnx.ValueInfoProto:
        t = graph.tensors[name]
        return helper.make_tensor_value_info(name, dtypes.to_onnx(t.dtype), list(t.shape))

    initializers = [numpy_helper.from_array(v, name) for name, v in graph.constants.items()] + writer.initializers
    produced = {o for n in graph.nodes for o in n.outputs}
    onnx_graph = helper.make_graph(
        writer.nodes, graph.name,
        inputs=[info(n) for n in graph.inputs],
        outputs=[info(n) for n in graph.outputs],
        initializer=initializers,
        value_info=[info(n) for n in graph.tensors if n in produced and n not in graph.outputs],
    )
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in writer.domains.items()]
    model = helper.make_model(onnx_graph, opset_imports=imports, producer_name="korch")
    model.ir_version = min(model.ir_version, 10)
    return model
