"""Inductor's C++ kernels compiled together (``backends/cpp_batch.py``): the same kernels, fewer compiler runs."""

import os

import numpy as np
import torch

from korch.backends import cpp_batch
from korch.backends.check import check
from korch.backends.inductor import InductorKernel
from tests.backends.kernels import fresh_kernels


def _targets(batch) -> list[str]:
    return [p.command()[1] for p in batch.pending]


def test_kernels_compile_in_one_run_and_compute_what_they_compute_alone():
    kernels = fresh_kernels(3)
    with cpp_batch.deferred_compiles() as batch:
        built = [InductorKernel(k, "cpu") for k in kernels]
    targets = _targets(batch)
    assert len(targets) >= 3 and not any(os.path.exists(t) for t in targets)  # nothing compiled yet
    batch.compile()
    assert batch.runs == 1 and batch.compiled == len(targets)
    assert all(os.path.exists(t) for t in targets)  # where Inductor looks: a later build compiles nothing
    for b, k in zip(built, kernels):
        result = check(b, k, device="cpu")
        assert result.ok, result.message
    again = InductorKernel(kernels[0], "cpu")  # a fresh load of the same kernel, outside the batch
    x = torch.randn(kernels[0].tensors["x"].shape)
    y, s = again(x)
    np.testing.assert_allclose(y.numpy(), -np.exp(x.numpy()), rtol=1e-6)
    np.testing.assert_allclose(s.item(), -np.exp(x.numpy().astype(np.float64)).sum(), rtol=1e-4)


def test_a_batch_that_fails_leaves_each_kernel_to_compile_alone(monkeypatch):
    kernels = fresh_kernels(2)
    with cpp_batch.deferred_compiles() as batch:
        built = [InductorKernel(k, "cpu") for k in kernels]
    command = cpp_batch._Pending.command
    monkeypatch.setattr(cpp_batch._Pending, "command",  # a compiler run that fails
                        lambda self: (lambda c: (*c[:2], c[2] + " --no-such-option"))(command(self)))
    batch.compile()
    assert batch.compiled == 0
    for b, k in zip(built, kernels):
        result = check(b, k, device="cpu")  # compiled on its first call, as Inductor would
        assert result.ok, result.message


def test_kernels_compiled_already_are_loaded_at_once():
    kernel, = fresh_kernels(1)
    InductorKernel(kernel, "cpu")
    with cpp_batch.deferred_compiles() as batch:
        InductorKernel(kernel, "cpu")
    assert batch.pending == []


def test_a_batch_compiles_with_gccs_inliner_limits_raised(monkeypatch):
    """A batch is one large translation unit: without the raised limits its kernels call ATen's vector helpers
    instead of inlining them (inlining.py)."""
    from korch.backends import inlining

    commands = []
    run = cpp_batch.subprocess.run
    monkeypatch.setattr(cpp_batch.subprocess, "run", lambda words, **kw: (commands.append(words), run(words, **kw))[1])
    kernels = fresh_kernels(2)
    with cpp_batch.deferred_compiles() as batch:
        built = [InductorKernel(k, "cpu") for k in kernels]
    batch.compile()
    assert batch.runs == 1
    compiles = [words for words in commands if any(str(w).endswith("batch.cpp") for w in words)]
    assert len(compiles) == 1 and all(flag in compiles[0] for flag in inlining.FLAGS)
    for b, k in zip(built, kernels):
        result = check(b, k, device="cpu")
        assert result.ok, result.message
