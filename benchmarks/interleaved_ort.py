"""korch's executables against ONNX Runtime, interleaved in rounds in one process: ratios a slow spell of a
shared machine cannot bias (each turn starts after a pause, ``turn_median_s``).

``korch bench`` (and so ``zoo_bench.py``) times each system in one block; on a shared host a slow spell can
fall on one system's block and move a ratio by 10% or more. Here each round times every system for a few
calls in turn (korch's executables, then ONNX Runtime with the same thread count and all graph
optimisations), and a system's latency is the median of its rounds' medians.

    python benchmarks/interleaved_ort.py OUTDIR... --out benchmarks/results/interleaved_ort_cpu.json

``--compile`` then times ``torch.compile`` of each zoo model's own module against korch's executable, in turns
of their own: ONNX Runtime is timed before anything is compiled in the process, since it runs slower after.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


# a pause before each system's turn: the threads of the one before (ONNX Runtime's pool spins after a run)
# would otherwise compete with its first calls (a unit timed right after ONNX Runtime read 16-23 ms in turns
# of 3 calls, 11 ms alone)
SETTLE_S = 0.2


def turn_median_s(fn, calls: int) -> float:
    """One system's turn: a pause, an untimed call that wakes its threads, then the median of ``calls``."""
    time.sleep(SETTLE_S)
    fn()
    return round_median_s(fn, calls)


def round_median_s(fn, calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def ort_session(model_path: Path):
    """ONNX Runtime on the CPU with torch's thread count and all graph optimisations (its defaults)."""
    import onnxruntime
    import torch

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    return onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def ort_call(model_path: Path):
    """One call of ONNX Runtime (``ort_session``) on the model at ``model_path``, on its seeded inputs."""
    from korch.ir.ort import input_specs
    from korch.runtime.selfcheck import seeded_inputs

    session = ort_session(model_path)
    feeds = seeded_inputs(input_specs(session))
    return lambda: session.run(None, feeds)


def interleaved_ms(systems: dict, rounds: int, calls: int) -> dict[str, float]:
    """Each system's latency in ms: a warm-up turn each, then ``rounds`` rounds of turns, the median of the
    turns' medians."""
    import torch

    medians = {name: [] for name in systems}
    with torch.inference_mode():
        for fn in systems.values():
            round_median_s(fn, calls)  # warm-up (torch.compile compiles here)
        for _ in range(rounds):
            for name, fn in systems.items():
                medians[name].append(turn_median_s(fn, calls))
    return {name: float(np.median(m)) * 1e3 for name, m in medians.items()}


def compare(outdir: Path, rounds: int, calls: int, compiled: str | None = None) -> dict:
    """Median latency of the executable in ``outdir`` and of ONNX Runtime on its reference model, in turns;
    with ``compiled`` (``zoo:NAME``), also of ``torch.compile`` (default mode) of that model's own module."""
    import torch

    import korch
    from korch.runtime.selfcheck import seeded_inputs

    executable = korch.load(outdir)
    session = ort_session(outdir / "reference.onnx")
    feed = seeded_inputs(executable.input_specs)
    inputs = [torch.from_numpy(feed[name]) for name in executable.input_specs]
    run_korch = lambda: executable(*inputs)  # noqa: E731
    ms = interleaved_ms({"korch": run_korch, "onnxruntime": lambda: session.run(None, feed)}, rounds, calls)
    row = {"korch_ms": round(ms["korch"], 3), "onnxruntime_ms": round(ms["onnxruntime"], 3),
           "onnxruntime_over_korch": round(ms["onnxruntime"] / ms["korch"], 3)}
    if compiled:
        # in turns of their own, after ONNX Runtime's: once torch.compile has compiled in the process, ONNX
        # Runtime runs slower (YOLOX-Nano 16.5 ms against 9.0 ms, the ViT block's ratio 1.047x against 1.007x)
        from korch.bench import torch_module_for

        module = torch.compile(torch_module_for(compiled, b"", "cpu")[0])
        ms = interleaved_ms({"korch": run_korch, "torch.compile": lambda: module(*inputs)}, rounds, calls)
        row.update(korch_ms_beside_compile=round(ms["korch"], 3), compile_ms=round(ms["torch.compile"], 3),
                   compile_over_korch=round(ms["torch.compile"] / ms["korch"], 3))
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdirs", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=15, help="timed calls per system and round")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compile", action="store_true",
                        help="also torch.compile (default mode) of each zoo model's own module, in the same turns")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import korch  # noqa: F401  (before torch: korch settles OpenMP's waiting)
    from korch import bench

    rows = []
    for outdir in args.outdirs:
        plan = json.loads((outdir / "plan.json").read_text())
        manifest = json.loads((outdir / "manifest.json").read_text())
        row = {"model": plan["model"], "cost_model": plan["cost_model"],
               "unit_weights": manifest.get("unit", {}).get("weights"),
               **compare(outdir, args.rounds, args.calls, f"zoo:{plan['model']}" if args.compile else None)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    bench.write_record(bench.record("korch against ONNX Runtime, interleaved", "benchmarks/interleaved_ort.py",
                                    argv, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
