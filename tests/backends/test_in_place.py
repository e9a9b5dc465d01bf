"""Kernels timed in place: run in the plan's order on the values they pass each other, in the layouts they read."""

import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from korch import config
from korch.backends.db import ProfileDB
from korch.backends.in_place import PLACE_PREFIX, SEQUENCE_RUNS, InPlaceTimer, StoredPrices
from korch.ir import Op
from korch.ir.graph import CHANNELS_LAST, CONTIGUOUS
from korch.ir.subgraph import extract
from korch.orchestrate.candidates import enumerate_candidates
from korch.pipeline import _overflows_cache, optimize
from korch.report.markdown import render_markdown
from tests.backends.test_measure import _model
from tests.orchestrate.test_candidates import _graph


class Recording:
    """A backend whose kernels record the tensors they are called with and return a fresh output of each kind."""

    name = "recording"

    def __init__(self):
        self.calls: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]] = []

    def build(self, kernel, device):
        def run(*inputs):
            outputs = [torch.full(tuple(kernel.tensors[o].shape), float(len(self.calls))) for o in kernel.outputs]
            if kernel.tensors[kernel.outputs[0]].layout == CHANNELS_LAST:
                outputs = [o.contiguous(memory_format=torch.channels_last) for o in outputs]
            self.calls.append((kernel.name, list(inputs), outputs))
            return outputs if len(outputs) > 1 else outputs[0]
        return run


def _measurer(kernels, backend, failing=()):
    return SimpleNamespace(device="cpu", backends=[backend], kernel_graph=lambda c: kernels[c],
                           record_for=lambda c: None if c in failing else SimpleNamespace(backend=backend.name),
                           calling_s=lambda name: 0.0)


def _chain():
    """relu -> exp -> neg on an image, cut into three kernels: the middle one reads and writes channels-last."""
    g, b = _graph((1, 4, 3, 3))
    a = b.emit(Op.RELU, "in0")
    e = b.emit(Op.EXP, a)
    n = b.emit(Op.NEG, e)
    g.outputs = [n]
    return [extract(g, [0], ["in0"], [a], name="k0"),
            extract(g, [1], [a], [e], name="k1", layout=CHANNELS_LAST),
            extract(g, [2], [e], [n], name="k2")]


def test_each_kernel_reads_what_the_kernel_before_it_wrote_in_the_layout_it_reads():
    kernels, backend = _chain(), Recording()
    timer = InPlaceTimer(_measurer(kernels, backend))
    seconds = timer.time([0, 1, 2])
    assert set(seconds) == {0, 1, 2} and all(s >= 0 for s in seconds.values())
    assert len(backend.calls) == 3 * SEQUENCE_RUNS and timer.sequences == 1 and timer.timed == 3
    for run in range(SEQUENCE_RUNS):
        (_, first_in, first_out), (_, middle_in, middle_out), (_, last_in, _) = backend.calls[3 * run:3 * run + 3]
        assert torch.equal(middle_in[0], first_out[0]) and middle_in[0].is_contiguous(memory_format=torch.channels_last)
        assert not first_out[0].is_contiguous(memory_format=torch.channels_last)  # converted for the reader
        assert torch.equal(last_in[0], middle_out[0]) and last_in[0].is_contiguous()
        assert kernels[2].tensors[kernels[2].inputs[0]].layout == CONTIGUOUS
        if run:  # a value from outside the sequence is the same every run
            assert first_in[0] is backend.calls[0][1][0]


def test_a_sequence_with_a_kernel_that_cannot_be_built_here_times_nothing():
    kernels, backend = _chain(), Recording()
    timer = InPlaceTimer(_measurer(kernels, backend, failing={1}))
    assert timer.time([0, 1, 2]) == {} and timer.sequences == 0
    assert timer.failure == "LookupError: candidate 1 has no measured kernel"


def test_the_calling_cost_is_taken_off_each_kernel_in_place():
    kernels, backend = _chain(), Recording()
    measurer = _measurer(kernels, backend)
    measurer.calling_s = lambda name: 10.0  # more than any call takes: nothing is left
    assert InPlaceTimer(measurer).time([0, 1, 2]) == {0: 0.0, 1: 0.0, 2: 0.0}


def test_a_measured_cpu_plan_is_priced_in_place(tmp_path):
    model = _model()
    with config.patch(in_place="on"):
        plan = optimize(model, target="cpu", cost="measured", db=tmp_path / "p.sqlite").plan
    in_place = plan.stats["measurement"]["in_place"]
    assert in_place["sequences"] >= 1 and in_place["planned_kernels"] == len(plan.kernels)
    assert sum(s.timed_in_place for s in plan.segments) == len(plan.kernels)
    assert all(s.in_place_rounds == in_place["sequences"] for s in plan.segments)
    assert plan.predicted_latency_s == pytest.approx(sum(k.cost_s for k in plan.kernels)
                                                     + sum(c.cost_s for c in plan.conversions))
    assert f"- priced in place: {len(plan.kernels)} planned kernels at their times in sequence" in render_markdown(plan)
    with config.patch(in_place="on"):  # a second search finds the first one's prices in place
        again = optimize(model, target="cpu", cost="measured", db=tmp_path / "p.sqlite").plan
    second = again.stats["measurement"]["in_place"]
    assert second["sequences"] == second["kernels_timed"] == 0 and second["from_database"] >= len(again.kernels)
    assert again.predicted_latency_s == plan.predicted_latency_s
    assert f"{second['from_database']} prices from earlier searches" in render_markdown(again)
    for setting in ("off", "auto"):  # by default only where values overflow the cache: these are 2 KiB
        with config.patch(in_place=setting):
            alone = optimize(model, target="cpu", cost="measured", db=tmp_path / "p.sqlite").plan
        assert "in_place" not in alone.stats["measurement"] and not any(s.in_place_rounds for s in alone.segments)
        assert np.isfinite(alone.predicted_latency_s)


@pytest.mark.parametrize("cache_mib, expected", [(1, True), (64, False), (0, False)])
def test_by_default_kernels_are_priced_in_place_where_a_candidates_values_overflow_the_cache(cache_mib, expected):
    g, b = _graph((1, 64, 64, 64))  # 1 MiB an image: a candidate of two reads and writes 3 MiB
    g.outputs = [b.emit(Op.EXP, b.emit(Op.RELU, "in0"))]
    candidates = enumerate_candidates(g).candidates
    assert _overflows_cache(g, candidates, cache_mib << 20) is expected


class Forgetful:
    """A backend that keeps its kernels' outputs by weak reference and notes, at each call, which are alive."""

    name = "forgetful"

    def __init__(self):
        self.outputs: list[weakref.ref] = []
        self.alive_at_call: list[int] = []

    def build(self, kernel, device):
        def run(*inputs):
            self.alive_at_call.append(sum(ref() is not None for ref in self.outputs))
            output = torch.zeros(tuple(kernel.tensors[kernel.outputs[0]].shape))
            self.outputs.append(weakref.ref(output))
            return output
        return run


def test_a_value_is_let_go_once_the_last_kernel_that_reads_it_has_run():
    backend = Forgetful()
    InPlaceTimer(_measurer(_chain(), backend)).time([0, 1, 2])
    # k2 runs while k1's output (its input) is alive, k0's (read by k1 alone) no longer; k2's own output is the
    # sequence's, which nothing in it reads: let go at once
    assert backend.alive_at_call[:3] == [0, 1, 1]


def test_closing_the_timer_lets_go_of_its_kernels():
    kernels, backend = _chain(), Forgetful()
    timer = InPlaceTimer(_measurer(kernels, backend))
    timer.time([0, 1, 2])
    assert timer.built == 3
    timer.close()
    assert timer.built == 0 and timer.time([0, 1, 2]) and timer.built == 3  # built again when asked again


def _stored(tmp_path, name="t", version="1", chosen="recording"):
    """Prices in place kept in a database at ``tmp_path`` for the candidates of a chain of three primitives in
    model ``name``, their kernels measured by backend ``chosen`` at ``version``."""
    g, b = _graph((1, 4, 3, 3))
    g.name = name
    g.outputs = [b.emit(Op.NEG, b.emit(Op.EXP, b.emit(Op.RELU, "in0")))]
    candidates = enumerate_candidates(g).candidates
    measurer = SimpleNamespace(graph=g, candidates=candidates, db=ProfileDB(tmp_path / "p.sqlite"), device_key="cpu:t",
                               versions={"recording": version, "other": "1"},
                               record_for=lambda c: SimpleNamespace(backend=chosen))
    return StoredPrices(measurer), [c.id for c in candidates]


def test_prices_in_place_are_kept_by_the_kernels_place_model_and_backend_version(tmp_path):
    stored, ids = _stored(tmp_path)
    stored.put({c: 1e-6 * (c + 1) for c in ids})
    assert len({stored.signature(c) for c in ids}) == len(ids)  # one place each, none a kernel's own signature
    assert all(stored.signature(c).startswith(PLACE_PREFIX) for c in ids)
    assert _stored(tmp_path)[0].lookup(ids) == {c: 1e-6 * (c + 1) for c in ids}  # a later search finds them
    for changed in ({"name": "u"}, {"version": "2"}, {"chosen": "other"}):  # another model, version, backend
        assert _stored(tmp_path, **changed)[0].lookup(ids) == {}


def test_a_timer_keeps_each_kernels_first_price_and_finds_an_earlier_searchs():
    kernels, backend = _chain(), Recording()
    measurer = _measurer(kernels, backend)
    puts = []
    stored = SimpleNamespace(put=lambda prices: puts.append(dict(prices)),
                             lookup=lambda ids: {0: 5.0} if 0 in ids else {})
    timer = InPlaceTimer(measurer, stored)
    assert timer.known([0, 1]) == {0: 5.0} and timer.from_database == 1
    timer.time([0, 1, 2])
    timer.time([0, 1, 2])
    assert [set(p) for p in puts] == [{1, 2}, set()]  # kernel 0's price was stored before; 1 and 2 once
