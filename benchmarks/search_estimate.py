"""Estimate, without a GPU, what a measured search of each zoo model would cost on a GPU machine.

``korch optimize zoo:NAME --target h100 --cost measured --estimate`` for every zoo model (see
``korch/search_estimate.py``): compiles and timed variants, and the minutes on a 16-core machine, when every
distinct candidate kernel is measured and when only the roofline plan's kernels are (the two ends of the
lazy search). Issue 14 asks at most 10 minutes per zoo model.

    python benchmarks/search_estimate.py --out benchmarks/results/search_estimate_h100.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO = ["candy", "efficientvit", "yolov4", "yolox_nano", "segformer_b0", "bert_layer", "vit_block"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--target", default="h100")
    parser.add_argument("--jobs", type=int, default=16, help="cores of the GPU machine compiling")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from korch import bench
    from korch.search_estimate import estimate

    rows = []
    for model in args.models.split(","):
        e = estimate(f"zoo:{model}", target=args.target, jobs=args.jobs)
        print(e.describe(), flush=True)
        rows.append({"model": model, "candidates": e.candidates, "compile_s_by_class": e.compile_s,
                     "timing_s_by_backend": e.timing_s,
                     **{f"{label}_{key}": value for label, work in (("every", e.every), ("plan", e.plan_only))
                        for key, value in (("signatures", work.signatures), ("compiles", dict(work.compiles)),
                                           ("timed_variants", work.timed_variants),
                                           ("kernels", work.built), ("kernels_by_backend", dict(work.kernels)),
                                           ("timing_s", round(e.timing_seconds(work), 1)),
                                           ("minutes", round(e.minutes(work), 2)))}})
    bench.write_record(bench.record(f"measured search estimate ({args.target}, {args.jobs} cores)",
                                    "benchmarks/search_estimate.py", argv, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
