"""Shared by the fission tests: lower a model with no opaque fallback, and compare it with ONNX Runtime."""

from __future__ import annotations

import warnings

import numpy as np
import onnx

from korch.fission import OpaqueOperatorWarning, fission
from korch.frontend import load_onnx
from korch.ir import Graph
from korch.ir import interpret, ort


def lower(model: onnx.ModelProto) -> Graph:
    """Import and fission ``model``; an operator left opaque fails the test (a fallback would hide a missing rule)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", OpaqueOperatorWarning)
        return fission(load_onnx(model))


def check_against_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol=1e-4, atol=1e-5) -> Graph:
    """The reference executor on the primitive graph matches ONNX Runtime on ``model``, output by output."""
    graph = lower(model)
    got = interpret.run(graph, feeds)
    want = ort.run_model(model, feeds)
    for name, value in want.items():
        assert got[name].shape == value.shape and got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=name)
    return graph
