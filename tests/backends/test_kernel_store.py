"""korch's store of Inductor's CPU kernels (``backends/kernel_store.py``): a kernel built again is loaded, not
compiled, computes what it computed, and is never another kernel's (the MLAS backend's included)."""

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

from korch.backends import kernel_store
from korch.backends.check import random_inputs
from korch.backends.inductor import InductorKernel
from tests.backends.kernels import check_built, kernel


def _conv_kernel(rng):
    """A 3x3 convolution and its ReLU: freezing packs the weight for oneDNN (an opaque tensor)."""
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    return kernel([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  {"x": (1, 8, 20, 20)}, {"y": (1, 16, 20, 20)}, {"w": w, "b": b})


def _product_kernel(rng):
    """A product with a constant weight and its bias: the weight packed for oneDNN's product."""
    w = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    return kernel([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                  {"x": (32, 64)}, {"y": (32, 48)}, {"w": w, "b": b})


def _counting_compiles(monkeypatch) -> list:
    compiles = []
    compile_ = InductorKernel._compile
    monkeypatch.setattr(InductorKernel, "_compile", lambda self, *a: compiles.append(a) or compile_(self, *a))
    return compiles


@pytest.mark.parametrize("make", [_conv_kernel, _product_kernel])
def test_a_kernel_built_again_is_loaded_from_the_store_and_computes_the_same(monkeypatch, make):
    graph = make(np.random.default_rng())  # weights no earlier run stored
    compiles = _counting_compiles(monkeypatch)
    first = InductorKernel(graph, "cpu")
    assert len(compiles) == 1
    again = InductorKernel(graph, "cpu")
    assert len(compiles) == 1  # loaded: nothing traced, frozen or looked up in Inductor's caches
    assert again.source == first.source and again.launches == first.launches
    inputs = random_inputs(graph, seed=3)
    for a, b in zip(first(*inputs), again(*inputs)):
        assert torch.equal(a, b)
    check_built(again, graph)


@pytest.mark.parametrize("make", [_conv_kernel, _product_kernel])
def test_a_kernel_built_afresh_is_called_as_one_loaded_from_the_store(monkeypatch, make):
    """Not through the wrappers ``compile_fx`` returns its code in: timed through them, a search's kernels built
    with cold caches read slower than the same kernels loaded, and a product timed alone set floors above the
    kernels that hold it."""
    from torch._inductor.output_code import CompiledFxGraph

    graph = make(np.random.default_rng())
    first = InductorKernel(graph, "cpu")
    wrapped = []
    call = CompiledFxGraph.__call__
    monkeypatch.setattr(CompiledFxGraph, "__call__", lambda self, *a: wrapped.append(1) or call(self, *a))
    inputs = random_inputs(graph, seed=3)
    first(*inputs)
    again = InductorKernel(graph, "cpu")
    again(*inputs)
    assert wrapped == []
    assert first.fn.__code__ is again.fn.__code__
    check_built(first, graph)


def test_an_mlas_kernel_from_the_store_opens_sessions_of_its_own(monkeypatch):
    """The MLAS backend's code names a token its operators open their sessions by: a kernel loaded from the store
    names the token it drew, so two kernels alive at once do not share a session."""
    from korch.backends.mlas import MlasKernel

    graph = _product_kernel(np.random.default_rng())
    compiles = _counting_compiles(monkeypatch)
    first, again = MlasKernel(graph, "cpu"), MlasKernel(graph, "cpu")
    assert len(compiles) == 1
    assert first.token != again.token and str(again.token) in again.source and str(first.token) not in again.source
    inputs = random_inputs(graph, seed=3)
    for a, b in zip(first(*inputs), again(*inputs)):
        assert torch.equal(a, b)
    check_built(again, graph)


def test_a_kernel_of_other_weights_or_threads_is_kept_apart():
    rng = np.random.default_rng()
    graph, other = _conv_kernel(rng), _conv_kernel(rng)
    key = kernel_store.key(graph, "inductor", "v")
    assert kernel_store.key(other, "inductor", "v") != key  # same structure, other weights
    assert kernel_store.key(graph, "inductor-libconv", "v") != key
    assert kernel_store.key(graph, "inductor", "w") != key
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # Inductor writes the thread count into parallel loops
    try:
        assert kernel_store.key(graph, "inductor", "v") != key
    finally:
        torch.set_num_threads(threads)
    assert kernel_store.key(graph, "inductor", "v") == key


def test_a_damaged_entry_is_built_again_and_written_whole(monkeypatch):
    from korch.backends.inductor import VERSION

    graph = _conv_kernel(np.random.default_rng())
    InductorKernel(graph, "cpu")
    path = kernel_store._path(kernel_store.key(graph, "inductor", VERSION))
    path.write_bytes(path.read_bytes()[:100])  # cut short, as a full disk might leave it
    compiles = _counting_compiles(monkeypatch)
    check_built(InductorKernel(graph, "cpu"), graph)
    assert len(compiles) == 1
    assert kernel_store.load(kernel_store.key(graph, "inductor", VERSION)) is not None


def test_a_weight_is_kept_once_for_every_kernel_that_reads_it(monkeypatch):
    """Two kernels of one weight (a product alone, and with its bias) share the weight's blob; a damaged blob is
    written again by the build that finds it damaged."""
    from korch.backends.inductor import VERSION

    rng = np.random.default_rng()
    w = rng.standard_normal((64, 48)).astype(np.float32)
    alone = kernel([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (32, 64)}, {"y": (32, 48)}, {"w": w})
    biased = kernel([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                    {"x": (32, 64)}, {"y": (32, 48)}, {"w": w, "b": np.ones(48, np.float32)})

    def blobs(graph) -> set[str]:
        entry = torch.load(kernel_store._path(kernel_store.key(graph, "inductor", VERSION)), weights_only=True)
        found = set()

        def walk(value):
            if isinstance(value, dict) and set(value) == {"blob"}:
                found.add(value["blob"])
            elif isinstance(value, (list, tuple, dict)):
                for v in (value.values() if isinstance(value, dict) else value):
                    walk(v)
        walk([entry["constants"], entry["packs"]])
        return found

    InductorKernel(alone, "cpu"), InductorKernel(biased, "cpu")
    shared = blobs(alone) & blobs(biased)
    assert shared  # the weight, kept once
    for name in shared:
        kernel_store._path(name, kernel_store.BLOBS).write_bytes(b"damaged")
    compiles = _counting_compiles(monkeypatch)
    check_built(InductorKernel(alone, "cpu"), alone)  # built again, and its blobs kept again
    check_built(InductorKernel(alone, "cpu"), alone)
    assert len(compiles) == 1


def test_nothing_is_stored_or_loaded_where_inductors_caches_are_off(monkeypatch):
    from torch._inductor import config as inductor_config

    graph = _product_kernel(np.random.default_rng())
    compiles = _counting_compiles(monkeypatch)
    with inductor_config.patch(force_disable_caches=True):
        InductorKernel(graph, "cpu")
        InductorKernel(graph, "cpu")
    assert len(compiles) == 2
    from korch.backends.inductor import VERSION

    assert not kernel_store._path(kernel_store.key(graph, "inductor", VERSION)).exists()


def test_the_digest_follows_the_operators_cpp_source_that_generated_calls_name(monkeypatch):
    """An MLAS kernel's code calls ``korch_ort_<digest of ort_gemm_op.cpp>::...``: a kernel stored before that
    C++ changed must not answer after it (it called operators no library of this korch registers)."""
    from pathlib import Path

    from korch.backends import ort_gemm

    assert ort_gemm._SOURCE in kernel_store.source_files()
    kernel_store._process_part.cache_clear()
    before = kernel_store._process_part()
    read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: read(path) + (b"\n// changed\n" if path == ort_gemm._SOURCE
                                                                        else b""))
    kernel_store._process_part.cache_clear()
    try:
        assert kernel_store._process_part() != before
    finally:
        monkeypatch.undo()
        kernel_store._process_part.cache_clear()
