"""A plan's compiled-unit variants and ONNX Runtime, each timed in fresh processes taking turns: what a user of
each variant would see, beside what ``choose_unit`` measured at build (all variants in the building process).
A variant's name may end in ", blocked convolutions" or ", no blocked convolutions" (``backends/nchwc.py``), and
before that in ", direct first convolutions" or ", no direct first convolutions" (``backends/direct_conv.py``);
without, the manifest's choice holds.

The OUTDIR's plan is compiled as each variant named (``unit.VARIANTS``: "packed for oneDNN", "MLAS by ONNX
Runtime", ...; the manifest's chosen one when none is named), each in a process of its own; then every round
starts one process per variant and one for ONNX Runtime on ``reference.onnx`` (2 threads, all graph
optimisations), each reporting the median of ``--calls`` calls after 20 untimed. A system's latency is the
median of its rounds.

    python benchmarks/unit_variants_fresh.py OUTDIR ["MLAS by ONNX Runtime" ...] [--rounds 5] [--calls 100]
        [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _compile(outdir: str, variant: str, path: str) -> None:
    """Writes the OUTDIR's plan compiled as ``variant`` to ``path``."""
    sys.path.insert(0, str(ROOT / "src"))
    import korch  # noqa: F401  (before torch: korch settles OpenMP's waiting)

    from korch.runtime import bundle, unit

    choice = json.loads((Path(outdir) / "manifest.json").read_text())["unit"]
    # "NAME, blocked convolutions" / "NAME, no blocked convolutions" (and so for direct first convolutions, before
    # it): the variant with that choice made
    for key in (unit.BLOCKED_CONVOLUTIONS, unit.DIRECT_CONVOLUTIONS):
        for made, suffix in (("yes", f", {key}"), ("no", f", no {key}")):
            if variant.endswith(suffix):
                variant, choice[key] = variant.removesuffix(suffix), made
    choice["weights"] = variant
    data = unit.compile_unit(bundle.read_graph(outdir), bundle.read_plan(outdir), "cpu", unit.chosen_variant(choice))
    Path(path).write_bytes(data)


def _time(outdir: str, unit_path: str, calls: int) -> float:
    """Median milliseconds of one call: the unit at ``unit_path``, or ONNX Runtime where it is empty."""
    sys.path.insert(0, str(ROOT / "src"))
    import korch  # noqa: F401
    import torch

    from interleaved_ort import ort_call, round_median_s  # beside this script

    if unit_path:
        from korch.backends import ort_gemm
        from korch.runtime import bundle, unit

        ort_gemm.open_library()
        compiled = unit.CompiledUnit(unit_path)
        inputs = unit.example_inputs(bundle.read_graph(outdir), "cpu")
        torch.set_grad_enabled(False)

        def call():
            compiled(*inputs)
    else:
        call = ort_call(Path(outdir) / "reference.onnx")
    for _ in range(20):
        call()
    return round_median_s(call, calls) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("variants", nargs="*")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=3, metavar=("JOB", "VARIANT", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        job, variant, path = args.child
        if job == "compile":
            _compile(args.outdir, variant, path)
        else:
            print(json.dumps(_time(args.outdir, path, args.calls)))
        return 0
    manifest = json.loads((Path(args.outdir) / "manifest.json").read_text())
    variants = args.variants or [manifest["unit"]["weights"]]

    def child(job: str, variant: str, path: str) -> str:
        done = subprocess.run([sys.executable, __file__, args.outdir, "--calls", str(args.calls), "--child", job,
                               variant, path], check=True, capture_output=True, text=True)
        return done.stdout.strip().splitlines()[-1] if job == "time" else ""

    with tempfile.TemporaryDirectory(prefix="korch-variants-") as tmp:
        units = {variant: str(Path(tmp) / f"unit{i}.pt2") for i, variant in enumerate(variants)}
        for variant, path in units.items():
            child("compile", variant, path)
        systems = {**units, "onnxruntime": ""}
        taken: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.rounds):
            for name, path in systems.items():
                taken[name].append(float(child("time", name, path)))
            print(json.dumps({name: round(ms[-1], 3) for name, ms in taken.items()}), flush=True)
    median = {name: statistics.median(ms) for name, ms in taken.items()}
    print(json.dumps({"median_ms": {n: round(v, 3) for n, v in median.items()},
                      "onnxruntime_over": {n: round(median["onnxruntime"] / v, 3) for n, v in median.items()}}))
    sys.path.insert(0, str(ROOT / "src"))
    from korch import bench

    bench.write_record(bench.record("a plan's unit variants and ONNX Runtime in fresh processes",
                                    "benchmarks/unit_variants_fresh.py", argv, model=manifest["model"],
                                    built_ms=manifest["unit"].get("measured_ms", {}),
                                    median_ms={n: round(v, 3) for n, v in median.items()},
                                    rounds_ms={n: [round(x, 3) for x in v] for n, v in taken.items()}), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
