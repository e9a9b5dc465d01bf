"""korch's executables against ONNX Runtime, each system alone in a fresh process: what a user of either sees.

Systems sharing a process disturb each other (ONNX Runtime's pool spins after a run, torch's OpenMP workers
after a loop, and ONNX Runtime ran slower once something had compiled), and a process's own speed varies
(where its pages land): so each round starts one process for korch's executable and one for ONNX Runtime on
the OUTDIR's ``reference.onnx`` (2 threads, all graph optimisations), one after the other, the same seeded
inputs, every OUTDIR in each round (plans of one model compare within one spell of the host); each process
reports the median of ``--calls`` calls after a warm-up, and the seconds it took to open the model (``korch.load``
of the OUTDIR; ONNX Runtime's session over ``reference.onnx``; torch.compile's first call, which compiles). A
system's latency is the median of its rounds; the ratio is ONNX Runtime's over korch's, and also of the two
systems' fastest rounds.
``--compile`` adds a third process a round: torch.compile of the zoo model's module (default mode).

    python benchmarks/alone_ort.py OUTDIR... [--rounds 3] [--calls 300] [--compile] --out benchmarks/results/FILE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 20


def _child(system: str, outdir: str, calls: int) -> dict[str, float]:
    """Median seconds of one call of ``system`` ("korch", "onnxruntime" or "torch.compile") on the OUTDIR's model
    (``call_s``), seconds from its imports to the first call's result (``open_s``) and to the call ready
    (``load_s``: ``korch.load``, ONNX Runtime's session; torch.compile compiles in its first call)."""
    sys.path.insert(0, str(ROOT / "src"))
    import korch  # noqa: F401  (first: it sets OpenMP's spinning before torch loads)
    from korch.runtime.selfcheck import seeded_inputs
    from interleaved_ort import ort_call, round_median_s  # this directory's: as the turns benchmark times

    started = time.perf_counter()
    if system == "korch":
        import torch

        executable = korch.load(outdir)
        feeds = seeded_inputs(executable.input_specs)
        inputs = [torch.from_numpy(feeds[name]) for name in executable.input_names]

        def call():
            executable(*inputs)
    elif system == "torch.compile":  # the zoo model's own module, Inductor's default mode; compiled in the warm-up
        import torch

        from korch import zoo

        manifest = json.loads((Path(outdir) / "manifest.json").read_text())
        module, _ = zoo.build(manifest["model"])
        specs = {i["name"]: (tuple(i["shape"]), i["dtype"]) for i in manifest["inputs"]}  # no ONNX Runtime here
        inputs = [torch.from_numpy(v) for v in seeded_inputs(specs).values()]
        compiled = torch.compile(module.eval())

        def call():
            with torch.no_grad():
                compiled(*inputs)
    else:
        call = ort_call(Path(outdir) / "reference.onnx")
    load_s = time.perf_counter() - started
    call()
    open_s = time.perf_counter() - started
    for _ in range(WARMUP):
        call()
    return {"call_s": round_median_s(call, calls), "open_s": open_s, "load_s": load_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdirs", nargs="*")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compile", action="store_true",
                        help="also torch.compile of the zoo model's module (default mode), alone in its processes")
    parser.add_argument("--child", nargs=2, metavar=("SYSTEM", "OUTDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child, args.calls)))
        return 0
    if not args.outdirs:
        parser.error("give at least one OUTDIR")
    sys.path.insert(0, str(ROOT / "src"))
    from korch import bench

    rows = []
    systems = ["korch", "onnxruntime", *(["torch.compile"] if args.compile else [])]
    taken = {outdir: {system: [] for system in systems} for outdir in args.outdirs}
    opened = {outdir: {system: [] for system in systems} for outdir in args.outdirs}
    loaded = {outdir: {system: [] for system in systems} for outdir in args.outdirs}
    for _ in range(args.rounds):  # a round visits every OUTDIR: plans of one model compare within a spell of the host
        for outdir in args.outdirs:
            for system in systems:
                done = subprocess.run([sys.executable, __file__, "--child", system, outdir, "--calls", str(args.calls)],
                                      check=True, capture_output=True, text=True)
                reported = json.loads(done.stdout.strip().splitlines()[-1])
                taken[outdir][system].append(reported["call_s"] * 1e3)
                opened[outdir][system].append(reported["open_s"])
                loaded[outdir][system].append(reported["load_s"])
    for outdir, rounds in taken.items():
        manifest = json.loads((Path(outdir) / "manifest.json").read_text())
        median = {system: statistics.median(ms) for system, ms in rounds.items()}
        best = {system: min(ms) for system, ms in rounds.items()}
        rows.append({"model": manifest.get("model", outdir), "outdir": outdir,
                     "unit": {k: v for k, v in manifest.get("unit", {}).items() if k != "measured_ms"},
                     "korch_ms": round(median["korch"], 3), "onnxruntime_ms": round(median["onnxruntime"], 3),
                     "onnxruntime_over_korch": round(median["onnxruntime"] / median["korch"], 3),
                     # each system's fastest process: on a host where a process's speed is bimodal (ONNX Runtime's
                     # YOLOX-Nano 3.9 or 6.9 ms, minutes apart), the ratio of what each does in its good processes
                     "best_onnxruntime_over_korch": round(best["onnxruntime"] / best["korch"], 3),
                     "rounds_ms": {system: [round(ms, 3) for ms in v] for system, v in rounds.items()},
                     # what a process took to open the model and return its first result: korch.load's cost
                     "open_s": {system: round(statistics.median(v), 3) for system, v in opened[outdir].items()},
                     "load_s": {system: round(statistics.median(v), 3) for system, v in loaded[outdir].items()}})
        if args.compile:
            rows[-1].update(compile_ms=round(median["torch.compile"], 3),
                            compile_over_korch=round(median["torch.compile"] / median["korch"], 3),
                            best_compile_over_korch=round(best["torch.compile"] / best["korch"], 3))
        print(json.dumps({k: rows[-1][k] for k in ("model", "korch_ms", "onnxruntime_ms", "onnxruntime_over_korch",
                                                   "best_onnxruntime_over_korch", "compile_over_korch", "open_s",
                                                   "load_s")
                          if k in rows[-1]}))
    bench.write_record(bench.record("korch against ONNX Runtime, each alone in fresh processes",
                                    "benchmarks/alone_ort.py", argv, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
