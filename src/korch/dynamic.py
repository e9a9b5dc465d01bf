"""``korch optimize --dynamic seq=LOW..HIGH``: one OUTDIR that serves every size of a dimension in a range.

The range is cut into buckets (``runtime/buckets.py``: powers of two). Each
bucket gets the optimal plan at its largest size; consecutive buckets whose
plans choose the same kernels share one compiled unit. The primitive graph as a
function of the size (``ir/sizes.py``, fitted on imports at four sizes) lets
each unit serve every size of its range exactly: ``torch.export`` with the
dimension dynamic, AOTInductor, no padding. Each unit is checked against ONNX
Runtime at the smallest and the largest size it serves, and written as a
complete executable of its own under ``buckets/``; OUTDIR's manifest (written
last) lists them, and ``korch.load`` returns a ``BucketedExecutable``.

Compiled units are CPU executables: a GPU target is refused (korch's GPU
kernels are built for one shape), as is ``--kernel-by-kernel``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx

from korch.errors import KorchError
from korch.pipeline import CheckFailed, Optimized, Progress, load_model, model_bytes, optimize, reports

SAMPLE_OFFSETS = (0, 1, 2, 3)  # the sizes the graph's functions are fitted on: the range's largest and below


@dataclasses.dataclass
class DynamicOptimized:
    """What ``optimize_dynamic`` made: each group of buckets (low, high) with its plan, and the executable."""

    groups: list[tuple[int, int, Optimized]]
    executable: object
    manifest: dict


def optimize_dynamic(model, dynamic: tuple[str, int, int], *, output: str | os.PathLike, target: str | None = None,
                     input_shapes: Mapping[str, Sequence[int] | int] | None = None,
                     input_values: Mapping | None = None, tolerance: float | None = None,
                     progress: Progress | None = None, **planning) -> DynamicOptimized:
    """Plan, compile, check and write an executable of ``model`` serving sizes ``low..high`` of the dimension
    ``dim`` (``dynamic = (dim, low, high)``) to ``output``. ``planning``: ``pipeline.optimize``'s planning
    options (cost, db, jobs, time_limit, max_kernel_nodes, precision)."""
    from korch.backends.registry import device_for
    from korch.ir.sizes import SizeFunctions
    from korch.runtime import buckets as bucketing
    from korch.runtime.bundle import BundleWriter
    from korch.runtime.write import write_executable

    dim, low, high = dynamic
    target = target or "cpu"
    if device_for(target) != "cpu":
        raise KorchError(f"--dynamic builds compiled units, which run on CPUs: not for --target {target}")
    progress = progress or Progress()
    shapes = dict(input_shapes or {})

    def imported(size: int):
        return load_model(model, {**shapes, dim: size}, input_values)[1]

    if progress.on_stage:
        progress.on_stage(f"fit the graph as a function of {dim}")
    samples = sorted({max(high - k, bucketing.MIN_DYNAMIC) for k in SAMPLE_OFFSETS})
    sizes = SizeFunctions.fit(dim, {s: imported(s) for s in samples}) if len(samples) == len(SAMPLE_OFFSETS) \
        else None
    buckets = bucketing.power_of_two_buckets(low, high)
    if sizes is None:  # too few sizes to fit: one static unit per size
        buckets = [bucketing.Bucket(s, s) for s in range(low, high + 1)]
        at_low, at_high = imported(low), imported(high)
        input_axes = {n: [a for a, (x, y) in enumerate(zip(at_low.tensors[n].shape, at_high.tensors[n].shape))
                          if x != y] for n in at_high.inputs}
    else:
        input_axes = {n: list(a) for n, a in sizes.input_axes.items()}
    plans = {}
    for bucket in buckets:
        if progress.on_stage:
            progress.on_stage(f"plan {dim}={bucket.low}..{bucket.high} at {dim}={bucket.high}")
        plans[bucket] = optimize(model, output=None, target=target, input_shapes={**shapes, dim: bucket.high},
                                 input_values=input_values, **planning)

    def same_kernels(a, b) -> bool:
        return [k.nodes for k in plans[a].plan.kernels] == [k.nodes for k in plans[b].plan.kernels]

    groups = bucketing.merge_equal(buckets, same_kernels)
    reference = model_bytes(model)
    outdir = Path(output)
    writer = BundleWriter(outdir)  # removes OUTDIR's manifest: incomplete until the last line writes it
    shutil.rmtree(outdir / "buckets", ignore_errors=True)  # an earlier build's buckets
    written = []
    for group in groups:
        first, last = group[0], group[-1]
        result = plans[last]
        group_sizes = None
        if sizes is not None and first.low < last.high:  # the functions in this plan's names, checked at both ends
            group_sizes = sizes.for_graph(result.graph, last.high)
            group_sizes.check_graph_at(result.graph, imported(first.low), first.low)
        if progress.on_stage:
            progress.on_stage(f"compile and check {dim}={first.low}..{last.high} ({len(result.plan.kernels)} kernels)")
        assembled = _build_bucket(result, target, reference, group_sizes, dim, first.low, last.high, input_values,
                                  tolerance)
        directory = bucketing.Bucket(first.low, last.high).directory(dim)
        write_executable(outdir / directory, assembled, reports(result, assembled.manifest))
        written.append({"low": first.low, "high": last.high, "dir": directory, "kernels": len(result.plan.kernels),
                        "predicted_ms": round(result.plan.predicted_latency_s * 1e3, 4),
                        "check": assembled.manifest["check"], "unit": assembled.manifest["unit"].get("weights")})
    # the last bucket's executable is built at the range's largest size: its declarations are the range's
    manifest = _manifest(assembled.manifest, {"dim": dim, "low": low, "high": high,
                                              "axes": {n: a for n, a in input_axes.items() if a}}, written)
    writer.write("reference.onnx", reference)
    from korch.report.markdown import render_buckets

    writer.write("report.md", render_buckets(manifest).encode())
    writer.finish(manifest)
    if not manifest["check"]["ok"]:
        raise CheckFailed(f"a bucket of {outdir} does not match ONNX Runtime; see {outdir / 'report.md'}; it is "
                          f"kept, marked as failing its check: korch run {outdir} --allow-unchecked runs it")
    from korch.runtime.load import load

    return DynamicOptimized([(g[0].low, g[-1].high, plans[g[-1]]) for g in groups], load(outdir), manifest)


def _build_bucket(result: Optimized, target: str, reference: bytes, sizes, dim: str, low: int, high: int,
                  input_values: Mapping | None, tolerance: float | None):
    """The bucket's plan compiled into one unit serving ``low..high``, assembled and checked at both ends."""
    from korch.backends.library import LibraryKernel
    from korch.runtime import unit
    from korch.runtime.assemble import assemble
    from korch.runtime.build import BuiltStep, kernel_graphs
    from korch.runtime.buckets import specs_at
    from korch.runtime.selfcheck import check_against_onnxruntime, seeded_inputs

    graph, plan = result.graph, result.plan
    reason = unit.supports(graph, "cpu")
    if reason:
        raise KorchError(f"--dynamic needs one compiled unit per bucket, and this model has none: {reason}")
    size_range = unit.SizeRange(sizes, low, high) if low < high else None
    try:
        data, choice = unit.choose_unit(graph, plan, "cpu", size_range)
    except Exception as exc:
        raise KorchError(f"compiling {dim}={low}..{high} into one unit failed: {exc}") from exc
    # the kernel list describes the plan; the unit is what runs (nothing is built kernel by kernel)
    steps = [BuiltStep(planned, kernel, LibraryKernel(kernel, "cpu"), "torch", checked=True)
             for planned, kernel in zip(plan.kernels, kernel_graphs(graph, plan))]
    assembled = assemble(graph, plan, steps, target=target, device="cpu", reference_model=reference, unit=data,
                         unit_choice=choice)
    if size_range is not None:
        assembled.manifest["sizes"] = {"dim": dim, "low": low, "high": high,
                                       "axes": {n: list(a) for n, a in sizes.input_axes.items()}}
    model = onnx.load_from_string(reference)
    values = dict(input_values or {})
    axes = sizes.input_axes if sizes else {}
    by_size = {}
    for size in sorted({low, high}):
        specs = specs_at(assembled.executable.input_specs, axes, size)
        feeds = {**seeded_inputs({n: s for n, s in specs.items() if n not in values}), **values}
        by_size[size] = check_against_onnxruntime(assembled.executable, model, feeds, tolerance=tolerance)
    worst = max(by_size.values(), key=lambda c: (not c.ok, c.max_rel))
    assembled.manifest["check"] = {**worst.to_json(), "sizes": {str(s): c.to_json() for s, c in by_size.items()}}
    assembled.executable.check = worst
    return assembled


def _manifest(largest: dict, size_range: dict, written: list[dict]) -> dict:
    """OUTDIR's manifest: what the largest bucket's says of the model and its inputs, the range, the buckets."""
    from korch.runtime.buckets import RUNS

    return {
        **{key: largest[key] for key in ("model", "target", "device", "versions", "precision", "inputs", "outputs")},
        "runs": RUNS, "sizes": size_range, "buckets": written,
        "check": {"ok": all(b["check"]["ok"] for b in written),
                  "max_rel": max(b["check"]["max_rel"] for b in written),
                  "max_abs": max(b["check"]["max_abs"] for b in written)},
    }
