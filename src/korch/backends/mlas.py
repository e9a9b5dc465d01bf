"""The MLAS backend (CPU): a candidate whose products or softmaxes ONNX Runtime's MLAS can compute, compiled by
Inductor with those primitives calling ``ort_gemm``'s operators, the steps a compiled unit's "MLAS by ONNX
Runtime" variant runs (``ort_steps.replacements``): a measured plan then prices the products the way its unit
runs them, not as ATen's GEMMs.

Each built kernel's operator sessions (a packed copy of its weights) are released when the kernel is dropped,
so a measuring process does not keep one per candidate.
"""

from __future__ import annotations

import dataclasses
import random
import weakref

import numpy as np

from korch.backends import ort_gemm, ort_steps
from korch.backends.inductor import InductorKernel
from korch.backends.torch_ops import kernel_function
from korch.ir.graph import Graph
from korch.ir.ops import Op

VERSION = "6"  # 2: CPU kernels timed on warm inputs (timing.timing_inputs); 3: activations as torch's ops;
# 4: 1x1 convolutions as MLAS products (ort_gemm.pointwise_conv_function); 5: sibling ones as one product;
# 6: a kernel built afresh called as one loaded from the store (kernel_store.direct_call)


class MlasKernel(InductorKernel):
    backend = "mlas"

    def __init__(self, kernel: Graph, device: str):
        ort_gemm.open_library()
        # keys its operator sessions; a kernel from the store has its code's token renamed to this one
        self.token = random.getrandbits(62)
        weakref.finalize(self, ort_gemm.ops().close_unit, self.token)
        super().__init__(kernel, device)

    def _function(self, kernel: Graph):
        kernel = dataclasses.replace(kernel, constants=dict(kernel.constants))

        def add_constant(name: str, value: np.ndarray) -> str:
            kernel.constants[name] = value
            return name

        replaced = ort_steps.replacements(kernel, [[node.name for node in kernel.nodes]], self.token, add_constant)
        return kernel_function(kernel, self.device, replaced)


class MlasBackend:
    name = "mlas"

    @property
    def version(self) -> str:
        return f"{VERSION}+{ort_gemm.NAMESPACE}"

    def supports_device(self, device: str) -> bool:
        return device == "cpu"

    def claims(self, kernel: Graph) -> str | None:
        if any(node.op is Op.OPAQUE for node in kernel.nodes):
            return "mlas: opaque primitive"
        if not ort_gemm.any_eligible(kernel):
            return "mlas: no product or softmax for ONNX Runtime"
        return None

    def build(self, kernel: Graph, device: str) -> MlasKernel:
        return MlasKernel(kernel, device)
