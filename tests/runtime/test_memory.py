"""The memory planner: no two live tensors share a buffer, and reuse makes the peak smaller than the naive sum."""

import random

import pytest

from korch.runtime.memory import KernelStep, check_plan, lifetimes, plan_memory


def _chain(n, size=1000):
    steps = [KernelStep(("x",) if i == 0 else (f"t{i - 1}",), (f"t{i}",)) for i in range(n)]
    return steps, {f"t{i}": size for i in range(n)}


def test_a_chain_needs_two_buffers():
    steps, nbytes = _chain(10)
    plan = plan_memory(steps, nbytes, graph_inputs=["x"], graph_outputs=["t9"])
    check_plan(steps, plan)
    assert len(plan.buffer_bytes) == 2
    assert plan.peak_bytes < plan.naive_bytes
    assert "t9" not in plan.assignment and "x" not in plan.assignment


def test_a_tensor_read_late_keeps_its_buffer():
    steps = [KernelStep(("x",), ("a",)), KernelStep(("a",), ("b",)), KernelStep(("b",), ("c",)),
             KernelStep(("a", "c"), ("y",))]
    plan = plan_memory(steps, {"a": 64, "b": 64, "c": 64, "y": 64}, graph_inputs=["x"], graph_outputs=["y"])
    check_plan(steps, plan)
    assert plan.assignment["a"] not in (plan.assignment["b"], plan.assignment["c"])


def test_read_before_write_is_an_error():
    with pytest.raises(ValueError, match="before any step writes"):
        lifetimes([KernelStep(("a",), ("b",))], {"a", "b"})


@pytest.mark.parametrize("seed", range(30))
def test_random_dags_never_share_live_buffers(seed):
    rng = random.Random(seed)
    tensors = ["x"]
    steps, nbytes = [], {}
    for i in range(rng.randint(5, 40)):
        reads = tuple(rng.sample(tensors, min(len(tensors), rng.randint(1, 3))))
        writes = tuple(f"k{i}_{j}" for j in range(rng.randint(1, 3)))
        for w in writes:
            nbytes[w] = rng.choice([64, 1000, 4096, 100000])
        steps.append(KernelStep(reads, writes))
        tensors += writes
    outputs = [steps[-1].outputs[0]]
    plan = plan_memory(steps, nbytes, graph_inputs=["x"], graph_outputs=outputs)
    check_plan(steps, plan)
    assert plan.peak_bytes <= plan.naive_bytes
    for t, b in plan.assignment.items():
        assert plan.buffer_bytes[b] >= nbytes[t]


def test_the_checker_catches_overlap():
    from korch.runtime.memory import MemoryPlan

    steps = [KernelStep(("x",), ("a",)), KernelStep(("a",), ("b",)), KernelStep(("a", "b"), ("y",))]
    bad = MemoryPlan(buffer_bytes=(64,), assignment={"a": 0, "b": 0}, naive_bytes=128)
    with pytest.raises(AssertionError, match="overlaps"):
        check_plan(steps, bad)
