"""Compiled units with channels-last against NCHW values between kernels, and each against torch.compile and
ONNX Runtime: one process per OUTDIR, the systems taking turns.

An OUTDIR's plan is compiled into two units with the weights variant (and the 1x1 convolutions as products
or in the library) its manifest chose, one storing the
4-D values a convolution reads channels-last at kernel boundaries (``unit.kernel_boundaries``), one in NCHW,
as ``choose_unit`` compares them; the bundled model behind ``zoo:NAME`` runs under ``torch.compile`` (default
mode) and the OUTDIR's ``reference.onnx`` in ONNX Runtime (torch's thread count, all graph optimisations).

    python benchmarks/boundary_layout.py OUTDIR=zoo:NAME... --out benchmarks/results/boundary_layout_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("unit, NCHW between kernels", "unit, channels-last between kernels", "torch.compile", "onnxruntime")


def compare(outdir: Path, model: str, rounds: int, calls: int) -> dict:
    import torch

    from korch import zoo
    from korch.runtime import bundle, unit
    from korch.runtime.selfcheck import seeded_inputs
    from interleaved_ort import interleaved_ms, ort_session

    manifest = json.loads((outdir / "manifest.json").read_text())
    graph = bundle.read_graph(outdir)
    plan = bundle.read_plan(outdir)
    variant = unit.chosen_variant(manifest["unit"])  # its boundary layout is replaced by each of the two below
    units = [unit.CompiledUnit.from_bytes(unit.compile_unit(
        graph, plan, "cpu", dataclasses.replace(variant, channels_last_boundaries=layout))) for layout in (False, True)]
    feed = seeded_inputs({name: (graph.tensors[name].shape, graph.tensors[name].dtype) for name in graph.inputs})
    inputs = [torch.from_numpy(feed[name]) for name in graph.inputs]
    module, examples = zoo.build(model.removeprefix("zoo:"))
    compiled = torch.compile(module.eval())
    session = ort_session(outdir / "reference.onnx")
    ms = interleaved_ms(dict(zip(SYSTEMS, (lambda: units[0](*inputs), lambda: units[1](*inputs),
                                           lambda: compiled(*examples), lambda: session.run(None, feed)))),
                        rounds, calls)
    channels_last = ms["unit, channels-last between kernels"]
    return {"model": model, "unit_weights": manifest["unit"]["weights"],
            "unit_chosen_boundaries": manifest["unit"].get("boundaries"),
            "unit_pointwise_convolutions": manifest["unit"].get("pointwise convolutions"),
            **{f"{name} ms": round(value, 2) for name, value in ms.items()},
            "NCHW over channels-last": round(ms["unit, NCHW between kernels"] / channels_last, 3),
            "torch.compile over channels-last": round(ms["torch.compile"] / channels_last, 3),
            "onnxruntime over channels-last": round(ms["onnxruntime"] / channels_last, 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", help="OUTDIR=zoo:NAME (an executable of that zoo model)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per system and round")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one pair in this process
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import korch  # noqa: F401  (before torch: korch settles OpenMP's waiting)
    from korch import bench

    if args.one:
        outdir, model = args.one.split("=", 1)
        print(json.dumps(compare(Path(outdir), model, args.rounds, args.calls)))
        return 0
    rows = []
    for pair in args.pairs:  # a process each: one model's units and compiled graphs never share a heap
        done = subprocess.run([sys.executable, __file__, "--one", pair, "--rounds", str(args.rounds),
                               "--calls", str(args.calls), pair], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{pair}: failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    bench.write_record(bench.record("compiled units: values between kernels channels-last against NCHW",
                                    "benchmarks/boundary_layout.py", argv, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
