"""Where a CPU unit spends more than its kernels alone: the same events timed inside the unit and kernel by kernel.

A measured plan prices each kernel alone, on warm inputs; its compiled unit runs them in sequence. This compiles
the OUTDIR's unit again (its chosen variant) with Inductor's kernel profile (``cpp.enable_kernel_profile``: each
generated loop is a profiler event; library calls are events of their own), runs it under ``torch.profiler``,
then builds each planned kernel again by its plan's backend, with the same profile, and runs it alone on warm
inputs (the search's timing). Events are grouped by family (the name without its number: ``cpp_fused_add_cat``,
``mkldnn::_convolution_pointwise``, ``korch_ort_*::matmul``), so a family the unit spends more on names what
runs slower in sequence. The profile slows small loops: compare the two columns, not either with a timing.
``--by-event`` instead lists the unit's own events by their full names (each generated loop, each library call
with its shapes), how many a call runs and their milliseconds a call, and the kernels alone are not built: which
one call is slow, where a family sums many (YOLOX-Nano: its stem convolution, one oneDNN call of 1.0-1.6 ms).

    python benchmarks/unit_profile.py OUTDIR [--calls 5] [--weights VARIANT] [--by-event] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path


def family(name: str) -> str:
    """An event's name without the generated numbering and wrapper prefixes, shared by unit and kernel."""
    name = re.sub(r"^graph_\d+_", "", name)
    name = re.sub(r"^aoti_torch_cpu_mkldnn_", "mkldnn::", re.sub(r"^aoti_torch_cpu__", "mkldnn::_", name))
    return re.sub(r"_\d+$", "", name)


def profiled_events(run, calls: int, shapes: bool = False) -> list:
    """The profiler's events of ``calls`` calls of ``run()``, after two untimed calls; ``shapes``: the profiler
    records the calls' input shapes."""
    import torch

    with torch.inference_mode():
        run()
        run()
        with torch.profiler.profile(record_shapes=shapes) as prof:
            for _ in range(calls):
                run()
    return prof.events()


def profiled_ms(run, calls: int) -> dict[str, float]:
    """Self CPU milliseconds per call of ``run()`` by event family."""
    totals: dict[str, float] = collections.defaultdict(float)
    for event in profiled_events(run, calls):
        totals[family(event.name)] += event.self_cpu_time_total / calls / 1e3
    return totals


def by_event(event) -> str:
    """An event's full name, with its input shapes where the profiler recorded any (a library call's)."""
    shapes = [s for s in event.input_shapes if s]
    return f"{event.name} {shapes}" if shapes else event.name


def event_rows(run, calls: int) -> list[dict]:
    """The unit's events by full name, slowest first: milliseconds and events a call."""
    milliseconds: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    for event in profiled_events(run, calls, shapes=True):
        name = by_event(event)
        milliseconds[name] += event.self_cpu_time_total / calls / 1e3
        count[name] += 1
    return sorted(({"event": name, "unit_ms": round(ms, 3), "per_call": round(count[name] / calls)}
                   for name, ms in milliseconds.items()), key=lambda r: -r["unit_ms"])


def main(argv=None) -> int:
    import korch  # noqa: F401  (before torch: korch settles OpenMP's waiting)
    import torch

    from korch import bench, heap
    from korch.backends import ort_gemm
    from korch.backends.base import stored_as
    from korch.backends.check import random_inputs
    from korch.runtime import bundle, unit
    from korch.runtime.build import kernel_graphs, rebuild

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--calls", type=int, default=5, help="profiled calls of the unit and of each kernel")
    parser.add_argument("--weights", help="profile this variant of the manifest's (\"MLAS by ONNX Runtime\", ...) "
                                          "instead of the chosen one")
    parser.add_argument("--by-event", action="store_true",
                        help="the unit's events by full name instead of families against the kernels alone")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    heap.keep_freed_memory()  # as the unit and the search's workers run
    graph = bundle.read_graph(args.outdir)
    plan = bundle.read_plan(args.outdir)
    choice = json.loads((args.outdir / "manifest.json").read_text())["unit"]
    if args.weights:
        choice["weights"] = args.weights
    variant = unit.chosen_variant(choice)
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        compiled = unit.CompiledUnit.from_bytes(unit.compile_unit(graph, plan, "cpu", variant))
        if variant.ort_kernels:
            ort_gemm.open_library()
        inputs = unit.example_inputs(graph, "cpu")
        if args.by_event:
            rows = event_rows(lambda: compiled(*inputs), args.calls)
            summary = {"model": plan.model, "kernels": len(plan.kernels), "unit": choice.get("weights"),
                       "unit_profiled_ms": round(sum(r["unit_ms"] for r in rows), 2)}
            print(json.dumps(summary))
            for row in rows[:40]:
                print(f"{row['unit_ms']:9.3f} x{row['per_call']:<3d} {row['event'][:110]}")
            bench.write_record(bench.record("unit profile by event", "benchmarks/unit_profile.py", argv,
                                            summary=summary, rows=rows), args.out)
            return 0
        in_unit = profiled_ms(lambda: compiled(*inputs), args.calls)
        alone: dict[str, float] = collections.defaultdict(float)
        for k, kernel in zip(plan.kernels, kernel_graphs(graph, plan, layouts=True)):
            built = rebuild(kernel, k.backend or "inductor", "cpu", "cpu")
            xs = [stored_as(x, kernel.tensors[n].layout) for x, n in zip(random_inputs(kernel), kernel.inputs)]
            for name, ms in profiled_ms(lambda: built(*xs), args.calls).items():
                alone[name] += ms
    rows = sorted(({"family": name, "unit_ms": round(in_unit.get(name, 0.0), 3),
                    "alone_ms": round(alone.get(name, 0.0), 3)} for name in set(in_unit) | set(alone)),
                  key=lambda r: -abs(r["unit_ms"] - r["alone_ms"]))
    summary = {"model": plan.model, "kernels": len(plan.kernels), "unit": choice.get("weights"),
               "unit_profiled_ms": round(sum(in_unit.values()), 2), "alone_profiled_ms": round(sum(alone.values()), 2)}
    print(json.dumps(summary))
    for row in rows[:25]:
        print(f"{row['unit_ms']:9.2f} {row['alone_ms']:9.2f}  {row['family'][:100]}")
    bench.write_record(bench.record("unit profile", "benchmarks/unit_profile.py", argv, summary=summary, rows=rows),
                       args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
