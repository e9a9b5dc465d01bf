"""The MLAS backend: kernels whose products and softmaxes run in ONNX Runtime's MLAS, built as a compiled unit
builds them, checked against the reference executor; their operator sessions released with them."""

import gc

import pytest
import torch

from korch.backends import ort_gemm
from korch.backends.check import random_inputs
from korch.backends.mlas import MlasBackend
from korch.backends.registry import backends_for
from tests.backends import cases
from tests.backends.kernels import check_built

_CLAIMED = ["softmax", "matmul_bias_relu_residual", "attention_scores", "attention_output", "pointwise_conv_silu"]


def test_mlas_claims_kernels_with_a_product_or_a_softmax_on_cpus_only():
    backend = MlasBackend()
    assert [name for name, case in cases.ALL.items() if backend.claims(case()) is None] == _CLAIMED
    assert backend.claims(cases.layer_norm()).startswith("mlas: no product")
    assert backend.supports_device("cpu") and not backend.supports_device("cuda")
    assert "mlas" in [b.name for b in backends_for("cpu")] and "mlas" not in [b.name for b in backends_for("h100")]


@pytest.mark.parametrize("case", _CLAIMED)
def test_mlas_kernels_match_the_reference_and_call_onnx_runtime(case):
    graph = cases.ALL[case]()
    built = MlasBackend().build(graph, "cpu")
    check_built(built, graph)
    assert built.backend == "mlas" and f"torch.ops.{ort_gemm.NAMESPACE}." in built.source


def test_a_channels_last_pointwise_convolution_reads_its_pixels_where_they_lie():
    """A 1x1 convolution kernel whose values are stored channels-last (a measured plan's layout): MLAS claims it,
    multiplies the rows of its input as stored, and writes its output channels-last."""
    from korch.backends.check import RandomArena, check
    from korch.ir.graph import CHANNELS_LAST
    from korch.ir.subgraph import extract

    contiguous = cases.pointwise_conv_silu()
    graph = extract(contiguous, range(len(contiguous.nodes)), contiguous.inputs, contiguous.outputs,
                    layout=CHANNELS_LAST)
    assert MlasBackend().claims(graph) is None
    built = MlasBackend().build(graph, "cpu")
    assert check(built, graph).ok
    (out,) = built(*RandomArena().inputs(graph))
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    assert "clone" not in built.source.split("def call")[-1]  # the rows are a view of the input


def test_a_dropped_kernel_releases_its_sessions():
    """Closing a unit's sessions lets its slots open again, for another weight; a dropped MLAS kernel closes
    its own."""
    ort_gemm.open_library()  # the first test of its worker, it must not rely on another having built a kernel
    ops = ort_gemm.ops()
    ops.matmul(torch.ones(2, 4), torch.ones(4, 3), 991, 0)
    with pytest.raises(RuntimeError, match="opened for a 4x3 weight"):
        ops.matmul(torch.ones(2, 5), torch.ones(5, 3), 991, 0)
    ops.close_unit(991)
    torch.testing.assert_close(ops.matmul(torch.ones(2, 5), torch.ones(5, 3), 991, 0), torch.full((2, 3), 5.0))

    kernel = cases.matmul_bias_relu_residual()
    built = MlasBackend().build(kernel, "cpu")
    built(*random_inputs(kernel))  # its one product opens slot 0 for its 24x24 weight
    token = built.token
    with pytest.raises(RuntimeError, match="opened for a 24x24 weight"):
        ops.matmul(torch.ones(2, 5), torch.ones(5, 3), token, 0)
    del built
    gc.collect()
    torch.testing.assert_close(ops.matmul(torch.ones(2, 5), torch.ones(5, 3), token, 0), torch.full((2, 3), 5.0))
