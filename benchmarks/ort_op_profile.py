"""Where ONNX Runtime spends a model's time, per operator type: the peer's side of a korch profile.

ONNX Runtime's own profiler (``SessionOptions.enable_profiling``) records every node of every run; the first
``--warmup`` runs are left out, and each operator type's total is divided by the runs kept. Node times carry
the profiler's overhead (YOLOX-Nano: 9.9 ms of nodes a run profiled, 8.5 ms a run unprofiled), so read
shares, not sums. ``--level`` chooses ONNX Runtime's graph optimisations: ``all`` (the default, and what the
benchmarks compare against) converts convolution chains to its blocked NCHWc layout, ``extended`` does not.

    python benchmarks/ort_op_profile.py OUTDIR/reference.onnx [--threads 2] [--level all] [--by-shape Conv]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def profile(path: str, threads: int, level: str, runs: int, warmup: int) -> list[dict]:
    """One record per node run after warm-up: op type, input shapes, microseconds."""
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT / "src"))
    from korch.ir.ort import input_specs, random_inputs

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, f"ORT_ENABLE_{level.upper()}")
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="korch-ort-profile-"), "run")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = random_inputs(input_specs(session))
    for _ in range(warmup + runs):
        session.run(None, feed)
    trace = session.end_profiling()
    with open(trace) as f:
        events = json.load(f)
    os.remove(trace)
    starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    first_kept = starts[warmup]
    return [{"op": e["args"].get("op_name", "?"), "us": e["dur"],
             "shapes": [list(d.values())[0] for d in e["args"].get("input_type_shape", [])]}
            for e in events if e["ts"] >= first_kept and e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--level", choices=["basic", "extended", "all"], default="all")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--by-shape", metavar="OP", help="also list OP's nodes by their first two input shapes")
    args = parser.parse_args(argv)
    records = profile(args.model, args.threads, args.level, args.runs, args.warmup)
    total, count = collections.Counter(), collections.Counter()
    for r in records:
        total[r["op"]] += r["us"] / args.runs
        count[r["op"]] += 1 / args.runs
    print(f"{args.model}: {sum(total.values()):.0f} us of nodes a run ({args.level}, {args.threads} threads)")
    for op, us in total.most_common():
        print(f"  {op:24s} {us:8.0f} us  {round(count[op]):4d} nodes")
    if args.by_shape:
        shapes = collections.defaultdict(list)
        for r in records:
            if r["op"] == args.by_shape:
                shapes[json.dumps(r["shapes"][:2])].append(r["us"])
        for key, times in sorted(shapes.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {key:56s} x{len(times) / args.runs:3.0f}  median {sorted(times)[len(times) // 2]} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
