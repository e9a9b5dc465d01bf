"""Element types of the IR: numpy dtype names, and their ONNX and torch counterparts.

A dtype in the IR is a plain string, numpy's name for it ("float32", "int64",
"bool"). These are the ones korch claims; any other dtype in a model keeps its
operator opaque.
"""

from __future__ import annotations

import numpy as np
import onnx

FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8")
SUPPORTED = FLOATS + INTS + ("bool",)


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


def from_onnx(elem_type: int) -> str:
    """ONNX TensorProto element type -> numpy dtype name."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name


def to_onnx(dtype: str) -> int:
    """numpy dtype name -> ONNX TensorProto element type."""
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def torch_dtype(dtype: str):
    import torch

    return getattr(torch, dtype)


def itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize
