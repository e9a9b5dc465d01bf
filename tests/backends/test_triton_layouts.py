"""korch's Triton kernels read and write channels-last values (in the interpreter): every boundary load and store
goes through the layout's storage order (``Emitter.offset``), and a pointwise kernel runs over its output in
that order."""

import pytest
import torch
from onnx import helper

from korch.backends.base import stored_as
from korch.backends.check import RandomArena, check
from korch.backends.triton.backend import TritonBackend
from korch.ir.graph import CHANNELS_LAST, CONTIGUOUS
from korch.ir.subgraph import extract
from tests.backends import cases
from tests.backends.kernels import kernel

LAID_OUT = {
    **{name: cases.ALL[name] for name in ("conv_bias_relu", "pool_add", "instance_norm_relu_pad",
                                          "pointwise_conv_silu")},
    # a transpose of the spatial axes and a per-channel scale: the index maps are not the identity
    "transpose_scale": lambda: kernel([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]),
                                       helper.make_node("Mul", ["t", "s"], ["y"])],
                                      {"x": (2, 3, 4, 5), "s": (1, 3, 1, 1)}, {"y": (2, 3, 5, 4)}),
}


@pytest.mark.parametrize("case", sorted(LAID_OUT))
def test_a_channels_last_triton_kernel_checks_and_matches_the_contiguous_one(case):
    contiguous = LAID_OUT[case]()
    graph = extract(contiguous, range(len(contiguous.nodes)), contiguous.inputs, contiguous.outputs,
                    layout=CHANNELS_LAST)
    laid_out = [t for t in (*graph.inputs, *graph.outputs) if graph.tensors[t].layout == CHANNELS_LAST]
    assert laid_out, "the case has no channels-last boundary"
    backend = TritonBackend()
    assert backend.claims(graph) is None
    built = backend.build(graph, "cpu")
    assert check(built, graph).ok  # into poisoned buffers stored channels-last
    inputs = RandomArena().inputs(graph)
    got = built(*inputs)
    want = backend.build(contiguous, "cpu")(*[stored_as(x, CONTIGUOUS) for x in inputs])
    for name, g, w in zip(graph.outputs, got, want):
        if graph.tensors[name].layout == CHANNELS_LAST:
            assert g.is_contiguous(memory_format=torch.channels_last) and not g.is_contiguous()
        torch.testing.assert_close(g, w)


def test_a_contiguous_input_to_a_channels_last_kernel_is_stored_as_it_reads_it():
    contiguous = LAID_OUT["transpose_scale"]()
    graph = extract(contiguous, range(len(contiguous.nodes)), contiguous.inputs, contiguous.outputs,
                    layout=CHANNELS_LAST)
    x = torch.randn(2, 3, 4, 5)
    s = torch.randn(1, 3, 1, 1)
    (got,) = TritonBackend().build(graph, "cpu")(x, s)
    torch.testing.assert_close(got, (x.transpose(2, 3) * s))


def test_channels_last_kernels_compile_for_hopper():
    """Each case, stored channels-last, compiles for sm_90 without a GPU (in spawned processes: this one
    interprets)."""
    from korch.backends.triton.ahead import compile_many

    kernels = []
    for case in sorted(LAID_OUT):
        contiguous = LAID_OUT[case]()
        kernels.append(extract(contiguous, range(len(contiguous.nodes)), contiguous.inputs, contiguous.outputs,
                               layout=CHANNELS_LAST))
    results = compile_many(kernels, jobs=2)
    assert [r.status for r in results] == ["compiled"] * len(kernels), [r.reason for r in results]
