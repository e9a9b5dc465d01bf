"""A unit's own variants compiled in worker processes while the kernels build: the packages choose_unit gets
from them are the units compiled here would be, and a worker's failure is a variant's, not the run's."""

import concurrent.futures

import numpy as np
import pytest
import torch

from korch.errors import KorchError
from korch.pipeline import optimize
from korch.runtime import unit, unit_workers
from tests.runtime.test_unit import _matmul_relu_model


def test_the_variants_compiled_in_workers_are_the_ones_choose_unit_times(monkeypatch):
    model, weight = _matmul_relu_model()
    result = optimize(model, target="cpu", cost="roofline")
    assert unit_workers.start(result.graph, result.plan, "cpu") is None  # too small a plan to start workers for
    started = unit_workers.start(result.graph, result.plan, "cpu", min_kernels=0)
    assert started is not None
    try:
        assert set(started.futures) == set(unit.own_variants(result.graph, result.plan)) and len(started.futures) > 1

        def no_compiler_here(*args, **kwargs):
            raise AssertionError("compiled in this process")

        monkeypatch.setattr(unit, "compile_unit", no_compiler_here)
        data, choice = unit.choose_unit(result.graph, result.plan, compiled=started.compiled())
    finally:
        started.close()
    assert "failed" not in choice and set(choice["measured_ms"]) == set(started.futures)
    x = torch.randn(4, 16)
    np.testing.assert_allclose(unit.CompiledUnit.from_bytes(data)(x)[0].numpy(),
                               torch.relu(x @ torch.from_numpy(weight)).numpy(), rtol=1e-5, atol=1e-6)


def test_a_workers_failure_is_its_variants():
    failed, died = concurrent.futures.Future(), concurrent.futures.Future()
    failed.set_result("RuntimeError: no oneDNN here")
    died.set_exception(concurrent.futures.process.BrokenProcessPool("killed"))
    with pytest.raises(KorchError, match="no oneDNN here"):
        unit_workers._result(failed)
    with pytest.raises(KorchError, match="worker died"):
        unit_workers._result(died)
    done = concurrent.futures.Future()
    done.set_result(b"package")
    assert unit_workers._result(done) == b"package"
