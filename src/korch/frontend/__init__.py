"""The ONNX frontend: load a model into a clean graph with a static shape for every tensor.

``load_onnx`` reads and validates the model, applies input shape overrides,
folds constants, removes inference no-ops and dead code, and resolves every
tensor's shape and dtype (see ``onnx_loader``, ``shapes``, ``fold``,
``noops`` and ``graph``).
"""

from korch.frontend.onnx_loader import ImportedModel, load_onnx, parse_input_shape

__all__ = ["ImportedModel", "load_onnx", "parse_input_shape"]
