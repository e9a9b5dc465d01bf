"""The kernel timer's mechanics: warm-up first, rotation over input sets, budgets, the CUDA event path (faked).

Bounds on times are generous: these check the timer is sane, they make no claim about any kernel's speed.
"""

import contextlib
import time
import types
from typing import ClassVar

import pytest
import torch

from korch.backends import timing
from korch.backends.timing import planned_runs, rotation_count, rotation_sets, time_kernel


def sleeper(seconds, log=None):
    def call(i):
        if log is not None:
            log.append((i, time.perf_counter()))
        time.sleep(seconds)
    return call


def test_median_of_a_sleep_is_in_range():
    result = time_kernel(sleeper(0.002), device="cpu", budget_s=0.05)
    assert 0.002 <= result.min_s <= result.median_s < 0.05
    assert 5 <= result.runs <= 100


def test_runs_stop_at_the_budget_once_the_minimum_is_in():
    assert time_kernel(sleeper(0.02), device="cpu", warmup=1, warmup_s=0, budget_s=0.03).runs == 5
    assert time_kernel(lambda i: None, device="cpu", repeats=7).runs == 7


def test_warm_up_calls_happen_before_timed_calls_and_are_not_timed():
    calls = []

    def compiles_on_first_calls(i):
        calls.append(i)
        time.sleep(0.05 if len(calls) <= 3 else 0.001)

    result = time_kernel(compiles_on_first_calls, device="cpu", warmup=3, warmup_s=0, repeats=6)
    assert result.runs == 6 and len(calls) == 9
    assert result.median_s < 0.04 and result.min_s < 0.04


def test_warm_up_lasts_at_least_its_time():
    log = []
    result = time_kernel(sleeper(0.005, log), device="cpu", warmup=1, warmup_s=0.05, repeats=5)
    warmups = len(log) - result.runs
    assert warmups > 1
    assert log[warmups][1] - log[0][1] >= 0.05  # the first timed call starts after the warm-up time


def test_rotation_cycles_through_the_sets_across_warm_up_and_runs():
    seen = []
    time_kernel(seen.append, device="cpu", warmup=4, warmup_s=0, repeats=5, rotate=3)
    assert seen == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    seen.clear()
    time_kernel(seen.append, device="cpu", warmup=2, warmup_s=0, repeats=2)
    assert seen == [0, 0, 0, 0]


@pytest.mark.parametrize("kwargs", [{"rotate": 0}, {"repeats": 0}, {"device": "meta"}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        time_kernel(lambda i: None, **{"device": "cpu", **kwargs})


def test_planned_runs_fit_the_budget_within_bounds():
    assert planned_runs(0.001, 0.1, 5, 100) == 100
    assert planned_runs(0.002, 0.1, 5, 100) == 50
    assert planned_runs(1.0, 0.1, 5, 100) == 5
    assert planned_runs(1.0, 0.1, 5, 3) == 3
    assert planned_runs(0.0, 0.1, 5, 100) == 100


def test_rotation_count_overflows_the_cache_within_the_cap():
    mib = 1 << 20
    assert rotation_count(mib, 32 * mib) == 33           # 33 MiB > 32 MiB
    assert rotation_count(3 * mib, 32 * mib) == 11       # 33 MiB
    assert rotation_count(64 * mib, 32 * mib) == 1       # one set already overflows
    assert rotation_count(100, 32 * mib) == 64           # capped
    assert rotation_count(0, 32 * mib) == 1
    assert rotation_count(mib, 32 * mib, cap=8) == 8


def test_rotation_sets_makes_distinct_sets():
    sets = rotation_sets(lambda i: torch.full((256,), float(i)), nbytes=1024, cache_bytes=4000)
    assert len(sets) == 4 and [int(s[0]) for s in sets] == [0, 1, 2, 3]


def test_cache_sizes():
    assert timing.cache_size("cpu") > 0


class FakeEvent:
    """A CUDA event on the host clock: records when it is recorded, and the clock gap to another in ms."""

    log: ClassVar[list] = []

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()
        FakeEvent.log.append(("record", self))

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


@pytest.fixture
def fake_cuda(monkeypatch):
    FakeEvent.log = []
    log = FakeEvent.log
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync", device)))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("spin", cycles)))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(L2_cache_size=60 << 20))
    return log


def test_cuda_path_times_with_event_pairs(fake_cuda):
    calls = []

    def call(i):
        calls.append(i)
        fake_cuda.append(("call", i))
        time.sleep(0.002)

    result = time_kernel(call, device="cuda", rotate=4, warmup=3, warmup_s=0.01, budget_s=0.04)
    assert 0.002 <= result.min_s <= result.median_s < 0.05
    assert 5 <= result.runs <= 20  # about budget / warm-up estimate
    kinds = [entry[0] for entry in fake_cuda]
    first_record = kinds.index("record")
    assert kinds[:first_record].count("call") == len(calls) - result.runs  # warm-up first ...
    assert kinds[first_record - 2:first_record] == ["sync", "spin"]      # ... synchronized, then a spin
    timed = kinds[first_record:]
    assert timed[:-1] == ["record", "call", "record"] * result.runs and timed[-1] == "sync"
    assert calls == [i % 4 for i in range(len(calls))]


def test_cuda_cache_size_is_the_l2(fake_cuda):
    assert timing.cache_size("cuda") == 60 << 20
