"""How long torch's OpenMP workers should spin when a compiled unit shares the cores with ONNX Runtime.

Each model is optimized once (``korch optimize --cost roofline``, in a process
that spins ``threads.SPIN_COUNT`` rounds, so its unit may call ONNX Runtime's
GEMMs), then timed in fresh processes under each OpenMP setting: libgomp's
default (spin 300,000 rounds), each ``GOMP_SPINCOUNT`` of ``--spin-counts``
and ``OMP_WAIT_POLICY=PASSIVE``. In each process korch's executable and ONNX
Runtime on the same model take turns; the settings take turns across rounds.

    python benchmarks/openmp_spin.py --models bert_layer,yolox_nano --spin-counts 100,1000,10000 \\
        --out benchmarks/results/openmp_spin_cpu.json

A ``--models`` entry that is a directory is an OUTDIR korch already built (a measured plan, say): it is timed
as it is, under the same settings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def _settings(spin_counts: str) -> dict[str, dict]:
    """libgomp's default, each spin count asked for, and not spinning at all."""
    counts = {f"GOMP_SPINCOUNT={n}": {"GOMP_SPINCOUNT": n} for n in spin_counts.split(",") if n}
    return {"libgomp default": {}, **counts, "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}


def _environment(setting: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if not setting:
        env["OMP_WAIT_POLICY"] = ""  # keeps korch from asking for its own count: libgomp's default applies
    return {**env, **setting}


def _time_in_this_process(outdir: str, budget_s: float) -> dict:
    """Median ms of korch's executable and of ONNX Runtime, taking turns (a child of ``main``)."""
    import torch

    import korch
    from korch.backends.timing import take_turns, time_kernel
    from korch.ir import ort

    executable = korch.load(outdir)
    session = ort.session(str(Path(outdir) / "reference.onnx"))
    rng = np.random.default_rng(0)
    feeds = {i.name: (rng.random(shape).astype(np.float32) if i.type == "tensor(float)" else np.ones(shape, np.int64))
             for i in session.get_inputs() for shape in [[d if isinstance(d, int) else 1 for d in i.shape]]}
    tensors = {name: torch.from_numpy(value) for name, value in feeds.items()}
    systems = {"korch": lambda _: executable(**tensors), "onnxruntime": lambda _: session.run(None, feeds)}

    def median_s(name: str, round_: int) -> float:
        return time_kernel(systems[name], device="cpu", budget_s=budget_s, min_repeats=3,
                           warmup=3 if round_ == 0 else 0, warmup_s=0.0).median_s

    with torch.inference_mode():
        medians = take_turns(list(systems), median_s, 3)
    return {name: float(np.median(m)) * 1e3 for name, m in medians.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert_layer,yolox_nano")
    parser.add_argument("--spin-counts", default="100,1000,10000", help="GOMP_SPINCOUNT values to time")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of timed runs per system and turn")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_time_in_this_process(args.child, args.budget)))
        return 0

    from korch import bench, threads

    settings = _settings(args.spin_counts)
    rows = []
    with tempfile.TemporaryDirectory(prefix="korch-spin-") as tmp:
        for model in args.models.split(","):
            outdir = model
            if not os.path.isdir(model):
                outdir = os.path.join(tmp, model)
                subprocess.run([sys.executable, "-m", "korch", "optimize", f"zoo:{model}", "--cost", "roofline", "-q",
                                "-o", outdir], env=_environment({"GOMP_SPINCOUNT": str(threads.SPIN_COUNT)}),
                               check=True, capture_output=True)
            unit = json.loads(Path(outdir, "manifest.json").read_text()).get("unit", {})
            samples = {name: [] for name in settings}
            for _ in range(args.rounds):
                for name, setting in settings.items():
                    done = subprocess.run([sys.executable, __file__, "--child", outdir, "--budget", str(args.budget)],
                                          env=_environment(setting), check=True, capture_output=True, text=True)
                    samples[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            for name in settings:
                median = {system: float(np.median([s[system] for s in samples[name]]))
                          for system in samples[name][0]}
                rows.append({"model": model, "openmp": name, "unit_weights": unit.get("weights"),
                             "median_ms": median, "korch_vs_onnxruntime": median["onnxruntime"] / median["korch"],
                             "rounds": samples[name]})
                print(model, name, {k: round(v, 2) for k, v in median.items()},
                      f"korch vs onnxruntime {rows[-1]['korch_vs_onnxruntime']:.2f}x")
    bench.write_record(bench.record("korch's compiled unit under OpenMP spin settings", "benchmarks/openmp_spin.py",
                                    argv, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
