"""On a GPU (marked ``gpu``: skipped without CUDA; the campaign runs them first, ``TRITON_INTERPRET=0``): every
kernel class korch's Triton generator writes, and Inductor's and the libraries' kernels, built for CUDA and
checked against the reference executor into poisoned outputs, at several shapes and under both precision
policies; each launch variant that the search could choose checks; Triton kernels stored channels-last check; a
measured search times in its build workers, short kernels inside a replayed CUDA graph; a whole zoo model's
executable matches ONNX Runtime on its first call and on a replayed CUDA graph, and its kernels are timed inside
that graph."""

import pytest

from korch import config, precision
from korch.backends.check import check, checked_variants
from korch.backends.inductor import InductorBackend
from korch.backends.library import LibraryBackend
from korch.backends.triton.backend import TritonBackend, kernel_class_of
from tests.backends import cases

pytestmark = pytest.mark.gpu

BACKENDS = {"triton": TritonBackend, "inductor": InductorBackend, "library": LibraryBackend}


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
@pytest.mark.parametrize("case", sorted(cases.ALL))
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_each_kernel_checks_on_cuda(backend, case, policy):
    graph = cases.ALL[case]()
    built_by = BACKENDS[backend]()
    if built_by.claims(graph) is not None:
        pytest.skip(f"{backend} does not claim {case}")
    with precision.use(policy):
        built = built_by.build(graph, "cuda")
        result = check(built, graph, device="cuda")
    assert result.ok, result.message


def _shaped_cases():
    from tests.backends.test_triton_conv import CASES as CONV
    from tests.backends.test_triton_matmul import CASES as MATMUL

    return {**{f"matmul_{k}": v for k, v in MATMUL.items()}, **{f"conv_{k}": v for k, v in CONV.items()}}


@pytest.mark.parametrize("case", sorted(_shaped_cases()))
def test_triton_gemms_check_on_cuda_at_every_shape(case):
    graph = _shaped_cases()[case]()
    built = TritonBackend().build(graph, "cuda")
    result = check(built, graph, device="cuda")
    assert result.ok, result.message


@pytest.mark.parametrize("case", sorted(cases.ALL))
def test_every_triton_launch_variant_checks_on_cuda(case):
    graph = cases.ALL[case]()
    if kernel_class_of(graph) is None:
        pytest.skip(f"no Triton kernel class writes {case}")
    built = TritonBackend().build(graph, "cuda")
    assert checked_variants(built, graph, device="cuda") == tuple(range(len(built.generated.variants)))


@pytest.mark.parametrize("name", ["bert_layer", "candy"])
def test_a_zoo_executable_matches_onnx_runtime_replayed(tmp_path, name):
    from korch.pipeline import optimize

    with config.patch(compiled_unit=False):
        result = optimize(f"zoo:{name}", output=tmp_path / "out", cost="roofline")
    check_result = result.executable.check
    assert check_result.ok and check_result.replayed, check_result.summary()
    assert result.manifest["cuda_graph"] is True and result.manifest["device"] == "cuda"


def test_a_measured_search_times_in_its_build_workers_and_its_plan_checks(tmp_path, monkeypatch):
    """On a GPU the build workers time their kernels (one at a time, under a lock); this process times none,
    and the plan made of their timings runs and matches ONNX Runtime."""
    from korch.backends import measure
    from korch.pipeline import optimize
    from tests.backends.test_measure import _model

    timed_here = []
    real = measure._time_checked
    monkeypatch.setattr(measure, "_time_checked", lambda *a, **k: timed_here.append(1) or real(*a, **k))
    with config.patch(compiled_unit=False):
        result = optimize(_model(), output=tmp_path / "out", cost="measured", db=tmp_path / "p.sqlite", jobs=2,
                          max_kernel_nodes=3)
    stats = result.plan.stats["measurement"]
    assert stats["kernels_measured"] > 0 and stats["timing_s"] > 0 and not timed_here
    assert all(k.measured for k in result.plan.kernels)
    assert result.executable.check.ok and result.executable.check.replayed


@pytest.mark.parametrize("case", ["conv_bias_relu", "pool_add", "instance_norm_relu_pad", "transpose_scale"])
def test_a_channels_last_triton_kernel_checks_on_cuda(case):
    from korch.ir.graph import CHANNELS_LAST
    from korch.ir.subgraph import extract
    from tests.backends.test_triton_layouts import LAID_OUT

    contiguous = LAID_OUT[case]()
    graph = extract(contiguous, range(len(contiguous.nodes)), contiguous.inputs, contiguous.outputs,
                    layout=CHANNELS_LAST)
    result = check(TritonBackend().build(graph, "cuda"), graph, device="cuda")
    assert result.ok, result.message


def test_each_kernel_is_timed_inside_a_replayed_graph_and_together_they_make_the_replay(tmp_path):
    """``kernel_times`` on a GPU: one time per kernel from events a CUDA graph records between them; their sum
    is the replay's time (the events' own nodes and the graph's launch aside)."""
    import statistics

    import torch

    from korch.pipeline import optimize
    from korch.runtime.kernel_times import kernel_times, stamp_cost_s
    from korch.runtime.selfcheck import seeded_inputs

    with config.patch(compiled_unit=False):
        executable = optimize("zoo:candy", output=tmp_path / "out", cost="roofline").executable
    feeds = seeded_inputs(executable.input_specs)
    inputs = [torch.from_numpy(feeds[n]).cuda() for n in executable.input_names]
    times = kernel_times(executable, inputs)
    assert len(times) == len(executable.kernels) and all(t > 0 for t in times)
    replays = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        executable(*inputs)
        end.record()
        torch.cuda.synchronize()
        replays.append(start.elapsed_time(end) * 1e-3)
    assert 0.5 < sum(times) / statistics.median(replays) < 1.5
    stamp_s = stamp_cost_s("cuda")  # each kernel's time holds one event's: 2-4 us on an H200 (2026-11-30)
    assert 0 < stamp_s < 10e-6 and 0.5 < (sum(times) - stamp_s * len(times)) / statistics.median(replays) < 1.5


def test_a_short_kernel_is_timed_inside_a_replayed_cuda_graph():
    """The measured search's timer captures a short kernel's runs in one CUDA graph between timing events
    (``external``) and replays it: the capture and the events' times must work on the real device."""
    import torch

    from korch.backends.timing import time_kernel

    sets = [torch.randn(4096, device="cuda") for _ in range(4)]
    timing = time_kernel(lambda i: sets[i].neg(), device="cuda", rotate=4, graphed=True)
    assert timing.graphed and 0 < timing.min_s <= timing.median_s < 50e-6, timing


def test_an_empty_kernel_chained_in_a_replayed_graph_costs_the_graphs_time_per_node():
    """What the measured search adds to each GPU kernel's timing (``calling.calling_cost_s``): an empty kernel's
    time chained in a replayed graph, 1.09 us on an H200 (2026-11-30, ``device_facts.kernel_time``)."""
    import torch

    from korch.backends.timing import chained_in_graph_s

    x = torch.randn(1, device="cuda")
    assert 0.1e-6 < chained_in_graph_s(lambda: x.neg(), "cuda") < 10e-6
