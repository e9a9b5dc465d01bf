"""A plan's predicted latency (the binary linear program's objective) against what its executable spends.

For each OUTDIR (written by ``korch optimize --cost measured``): a fresh process loads the executable, runs it
on seeded inputs and takes the median of timed calls, the OUTDIRs taking turns round after round (a host whose
speed drifts by a fifth over minutes slows every plan alike) and the median of the rounds kept; the plan's
predicted latency is the sum of its kernels' measured costs. Issue 11 asks predicted / measured within
0.85-1.15 for every zoo model.

    korch optimize zoo:bert_layer --target cpu --cost measured -o /tmp/bert_layer
    python benchmarks/predicted_vs_measured.py /tmp/bert_layer ... \\
        --out benchmarks/results/predicted_vs_measured_cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_TIME_ONE = """
import json, sys
sys.path.insert(0, {src!r})
import korch  # before torch: korch settles OpenMP's waiting
import torch
from korch.backends.timing import time_kernel
from korch.runtime.selfcheck import seeded_inputs
executable = korch.load({outdir!r})
feeds = seeded_inputs(executable.input_specs)
inputs = [torch.from_numpy(feeds[n]) for n in executable.input_names]
with torch.inference_mode():
    timing = time_kernel(lambda i: executable(*inputs), device="cpu", budget_s={budget}, min_repeats=10)
print(json.dumps({{"median_s": timing.median_s, "weights": executable.manifest.get("unit", {{}}).get("weights")}}))
"""


def measure(outdir: Path, budget: float) -> dict:
    done = subprocess.run([sys.executable, "-c", _TIME_ONE.format(src=str(ROOT / "src"), outdir=str(outdir),
                                                                  budget=budget)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdirs", nargs="+", type=Path)
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of timed calls per executable")
    parser.add_argument("--repeats", type=int, default=3, help="rounds: fresh processes per executable, the OUTDIRs "
                        "taking turns (median kept)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from korch import bench
    from korch.backends.timing import take_turns

    rounds = take_turns(args.outdirs, lambda outdir, _: measure(outdir, args.budget)["median_s"], args.repeats)
    rows = []
    for outdir in args.outdirs:
        plan = json.loads((outdir / "plan.json").read_text())
        runs = sorted(rounds[outdir])
        measured_s = runs[len(runs) // 2]
        predicted_s = plan["predicted_latency_s"]
        manifest = json.loads((outdir / "manifest.json").read_text())
        row = {"model": plan["model"], "cost_model": plan["cost_model"], "kernels": len(plan["kernels"]),
               "predicted_ms": round(predicted_s * 1e3, 3), "measured_ms": round(measured_s * 1e3, 3),
               "runs_ms": [round(s * 1e3, 3) for s in runs],
               "predicted_over_measured": round(predicted_s / measured_s, 3),
               "unit_weights": manifest.get("unit", {}).get("weights"),
               "unit_variants_ms": manifest.get("unit", {}).get("measured_ms")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    bench.write_record(bench.record("predicted vs measured latency", "benchmarks/predicted_vs_measured.py", argv,
                                    rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
