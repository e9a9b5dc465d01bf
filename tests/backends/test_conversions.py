"""A layout conversion priced as the compiled unit copies a value: Inductor's loop, timed once and kept."""

import pytest
import torch

from korch.backends import conversions, measure, registry
from korch.backends.base import BuildError
from korch.backends.db import ProfileDB
from korch.ir.graph import CHANNELS_LAST, CONTIGUOUS, Graph, Tensor

VALUE = Tensor(name="v", shape=(1, 24, 10, 12), dtype="float32")


@pytest.mark.parametrize("to", [CHANNELS_LAST, CONTIGUOUS])
def test_inductors_loop_copies_a_value_into_the_other_layout(to):
    source = CONTIGUOUS if to == CHANNELS_LAST else CHANNELS_LAST
    x = torch.randn(VALUE.shape)
    x = x.contiguous(memory_format=torch.channels_last) if source == CHANNELS_LAST else x
    out = torch.empty(VALUE.shape)
    out = out.contiguous(memory_format=torch.channels_last) if to == CHANNELS_LAST else out
    conversions.compiled_copy(x, to)(x, out)
    assert torch.equal(out, x)
    assert out.is_contiguous(memory_format=torch.channels_last if to == CHANNELS_LAST else torch.contiguous_format)


def _measurer(db, backends=None):
    return measure.KernelMeasurer(Graph(name="g"), [], [], target="cpu", db=db, backends=backends)


def test_a_conversion_is_timed_once_kept_and_priced_less_the_calling_cost(monkeypatch, tmp_path):
    monkeypatch.setattr(measure, "calling_cost_s", lambda backend, device: 1e-6)
    timed = []
    monkeypatch.setattr(conversions, "loop_s", lambda *args: timed.append(args[1]) or 4e-6)
    db = ProfileDB(tmp_path / "p.sqlite")
    first = _measurer(db)
    assert first.conversion_s(VALUE, CHANNELS_LAST) == pytest.approx(3e-6)
    assert first.conversion_s(VALUE, CHANNELS_LAST) == pytest.approx(3e-6) and timed == [CHANNELS_LAST]
    kept = db.get(conversions.signature(VALUE, CHANNELS_LAST), measure.device_key("cpu"))
    assert list(kept) == ["inductor"] and kept["inductor"].latency_s == 4e-6
    # another run answers from the database; the other direction is a signature of its own
    again = _measurer(db)
    assert again.conversion_s(VALUE, CHANNELS_LAST) == pytest.approx(3e-6) and timed == [CHANNELS_LAST]
    assert again.conversion_s(VALUE, CONTIGUOUS) == pytest.approx(3e-6) and timed == [CHANNELS_LAST, CONTIGUOUS]


def test_without_inductors_loop_a_conversion_is_a_torch_copy(monkeypatch, tmp_path):
    monkeypatch.setattr(conversions, "torch_copy_s", lambda *args: 7e-6)
    db = ProfileDB(tmp_path / "p.sqlite")
    assert _measurer(db, backends=[registry.LibraryBackend()]).conversion_s(VALUE, CHANNELS_LAST) == 7e-6

    def failing(*args):
        raise BuildError("inductor: cannot")
    monkeypatch.setattr(conversions, "loop_s", failing)
    assert _measurer(db).conversion_s(VALUE, CONTIGUOUS) == 7e-6
    assert not db.get(conversions.signature(VALUE, CONTIGUOUS), measure.device_key("cpu"))


def test_the_loop_is_timed_on_the_measurers_values():
    from korch.backends.check import RandomArena

    seconds = conversions.loop_s(VALUE, CHANNELS_LAST, RandomArena("cpu"), "cpu")
    assert 0.0 < seconds < 0.01
