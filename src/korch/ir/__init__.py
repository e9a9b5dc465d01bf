"""The primitive IR: ops and their semantics, graphs, shape rules, invariants, JSON and ONNX forms."""

from korch.ir.graph import Attrs, Graph, Node, Tensor
from korch.ir.ops import Kind, Op
from korch.ir.shapes import IRError, infer
from korch.ir.verify import verify

__all__ = ["Attrs", "Graph", "IRError", "Kind", "Node", "Op", "Tensor", "infer", "verify"]
