"""korch: optimal kernel orchestration for tensor programs.

The pipeline, one sub-package per stage:
``frontend`` (ONNX / PyTorch import) -> ``fission`` (operators to primitives,
the ``ir``) -> ``orchestrate`` (candidate kernels, binary linear program)
-> ``cost`` (lower bounds, measured latencies) -> ``backends`` (kernel
generators) -> ``runtime`` (execution).
"""

from korch.errors import KorchError

__version__ = "0.1.0"
__all__ = ["KorchError", "__version__"]
