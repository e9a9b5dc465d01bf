"""The library backend: one primitive through torch's own operator (cuBLAS/cuDNN on CUDA, oneDNN/MKL on CPUs).

It claims every kernel of exactly one primitive, opaque ones included (those run
in ONNX Runtime), so every single-primitive candidate is buildable and a plan
always exists. Linear primitives land on the vendor libraries through
``F.conv2d`` and ``torch.matmul``; everything else is one torch operator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from korch.backends.base import contiguous_only, write_outputs
from korch.backends.torch_ops import kernel_function
from korch.ir.graph import Graph

VERSION = "3"  # 2: CPU kernels timed on warm inputs (timing.timing_inputs); 3: 1-D convolutions as 2-D ones


class LibraryKernel:
    backend = "library"
    launches = 1
    source = None
    in_place = False

    def __init__(self, kernel: Graph, device: str):
        self.op = kernel.nodes[0].op.value
        self.fn = kernel_function(kernel, device)

    def __call__(self, *inputs: torch.Tensor, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        return write_outputs(self.fn(*inputs), out)


class LibraryBackend:
    name = "library"

    @property
    def version(self) -> str:
        return f"{VERSION}+torch{torch.__version__}"

    def supports_device(self, device: str) -> bool:
        return True

    def claims(self, kernel: Graph) -> str | None:
        return contiguous_only(self.name, kernel) or (
            None if len(kernel.nodes) == 1 else "library: one primitive per kernel")

    def build(self, kernel: Graph, device: str) -> LibraryKernel:
        return LibraryKernel(kernel, device)
