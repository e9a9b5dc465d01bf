"""Two compiled-unit variants of one plan timed in short turns in one process: a ratio a slow spell of a shared
host cannot bias, where ``unit_variants_fresh.py``'s fresh processes read 10-50 ms for one unit within minutes.

Each variant (named as ``unit_variants_fresh.py`` names them: "packed for oneDNN, direct first convolutions", ...)
is compiled in a process of its own; then, in one process, each turn times ``--calls`` calls of one unit and
then of the other (their median), ``--turns`` times, the order swapped every turn. Reported: each unit's median
and fastest turn, and the median over turns of B's turn over A's.

    python benchmarks/unit_variants_turns.py OUTDIR "VARIANT A" "VARIANT B" [--turns 40] [--calls 20]
        [--out FILE.json]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("variants", nargs=2)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="korch-turns-") as tmp:
        paths = [str(Path(tmp) / f"{i}.pt2") for i in range(2)]
        for variant, path in zip(args.variants, paths):  # unit_variants_fresh's compile, in a process of its own
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "unit_variants_fresh.py"), args.outdir,
                            "--child", "compile", variant, path], check=True)
        turns = _turns(args.outdir, paths, args.turns, args.calls)
    sys.path.insert(0, str(ROOT / "src"))
    from korch import bench

    a, b = args.variants
    summary = {"model_dir": args.outdir, "median_ms": {a: statistics.median(turns[0]), b: statistics.median(turns[1])},
               "fastest_turn_ms": {a: min(turns[0]), b: min(turns[1])},
               "b_over_a_by_turn": statistics.median(y / x for x, y in zip(*turns))}
    print(summary)
    bench.write_record(bench.record("unit variants in turns", "benchmarks/unit_variants_turns.py", argv,
                                    summary=summary, turns_ms={a: turns[0], b: turns[1]}), args.out)
    return 0


def _turns(outdir: str, paths: list[str], turns: int, calls: int) -> list[list[float]]:
    """Each unit's median milliseconds a call, turn by turn."""
    sys.path.insert(0, str(ROOT / "src"))
    import korch  # noqa: F401  (before torch: korch settles OpenMP's waiting)
    import torch

    from korch.backends import ort_gemm
    from korch.runtime import bundle, unit

    ort_gemm.open_library()
    units = [unit.CompiledUnit(p) for p in paths]
    inputs = unit.example_inputs(bundle.read_graph(outdir), "cpu")
    torch.set_grad_enabled(False)
    for u in units:
        for _ in range(20):
            u(*inputs)
    medians: list[list[float]] = [[], []]
    for turn in range(turns):
        for i in ((0, 1) if turn % 2 == 0 else (1, 0)):
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                units[i](*inputs)
                times.append(time.perf_counter() - start)
            medians[i].append(round(statistics.median(times) * 1e3, 4))
    return medians


if __name__ == "__main__":
    sys.exit(main())
