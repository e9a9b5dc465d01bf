"""One plan's compiled unit built by two versions of korch, timed in turns in one process: what a change to
code generation is worth with the plan held fixed.

Each version compiles the OUTDIR's plan as its manifest's chosen variant in its own process
(``PYTHONPATH=SRC/src``, so an older checkout compiles with its own code; ``git worktree add DIR REV`` makes
one), then the units take turns as ``choose_unit`` times variants (``unit._fastest_seconds``), ``--trials`` times:

    git worktree add /tmp/korch-old d1a6f7c
    python benchmarks/unit_versions.py OUTDIR before=/tmp/korch-old now=. --out benchmarks/results/X.json

With ``--fresh`` each trial times each unit in a process of its own instead (the median of its calls over
``--seconds``, after 20 untimed): two units in one process can disturb each other (YOLOX-Nano's older unit
read 12.6 ms in a first turn and 17.0-17.2 ms in the five after, where fresh processes read 12.8-13.2 ms
in two of three).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_COMPILE = """
import json, sys
from pathlib import Path
from korch.runtime import unit
from korch.runtime.bundle import read_graph, read_plan
out, dest = Path(sys.argv[1]), sys.argv[2]
variant = unit.chosen_variant(dict(json.loads((out / "manifest.json").read_text())["unit"]))
Path(dest).write_bytes(unit.compile_unit(read_graph(out), read_plan(out), "cpu", variant))
"""


_TIME_FRESH = """
import json, statistics, sys, time
from pathlib import Path
import korch  # before torch: korch settles OpenMP's waiting
from korch.runtime import bundle, unit
package, out, seconds = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
manifest = json.loads((out / "manifest.json").read_text())
compiled = unit.CompiledUnit(package, [out / name for name in bundle.unit_libraries(manifest)])
inputs = unit.example_inputs(bundle.read_graph(out), "cpu")
for _ in range(20):
    compiled(*inputs)
times, end = [], time.perf_counter() + seconds
while time.perf_counter() < end or len(times) < 5:
    start = time.perf_counter()
    compiled(*inputs)
    times.append(time.perf_counter() - start)
print(round(statistics.median(times) * 1e3, 3))
"""


def time_fresh(package: Path, outdir: Path, seconds: float) -> float:
    """Milliseconds, the median of ``package``'s calls in a fresh process (this checkout's korch loads it)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    run = subprocess.run([sys.executable, "-c", _TIME_FRESH, str(package), str(outdir), str(seconds)], env=env,
                         check=True, capture_output=True, text=True)
    return float(run.stdout.split()[-1])


def compile_with(source: Path, outdir: Path, dest: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(source.resolve() / "src"))
    subprocess.run([sys.executable, "-c", _COMPILE, str(outdir), str(dest)], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("versions", nargs="+", help="NAME=KORCH_CHECKOUT, compiled and timed in this order")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--fresh", action="store_true", help="each unit timed in a fresh process, in turns")
    parser.add_argument("--seconds", type=float, default=3.0, help="with --fresh: seconds of timed calls")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from korch import bench
    from korch.runtime import bundle, unit

    versions = dict(v.split("=", 1) for v in args.versions)
    with tempfile.TemporaryDirectory(prefix="korch-unit-versions-") as tmp:
        paths = {name: Path(tmp) / f"{name}.pt2" for name in versions}
        for name, source in versions.items():
            compile_with(Path(source), args.outdir, paths[name])
        manifest = json.loads((args.outdir / "manifest.json").read_text())
        if not args.fresh:
            # a unit of the ONNX Runtime variant calls operators from the library its OUTDIR carries
            libraries = [args.outdir / name for name in bundle.unit_libraries(manifest)]
            units = {name: unit.CompiledUnit(str(path), libraries) for name, path in paths.items()}
            inputs = unit.example_inputs(bundle.read_graph(args.outdir), "cpu")
        trials = []
        for _ in range(args.trials):
            if args.fresh:
                ms = {name: time_fresh(path, args.outdir, args.seconds) for name, path in paths.items()}
            else:
                ms = {name: round(s * 1e3, 3) for name, s in unit._fastest_seconds(units, inputs, "cpu").items()}
            print(json.dumps(ms), flush=True)
            trials.append(ms)
    first = next(iter(versions))
    rows = {name: {"median_ms": sorted(t[name] for t in trials)[len(trials) // 2],
                   "faster_than_" + first: sum(t[name] < t[first] for t in trials)} for name in versions}
    print(json.dumps(rows))
    how = "each in fresh processes, in turns" if args.fresh else "in turns in one process"
    bench.write_record(bench.record(f"one plan's unit compiled by two versions of korch, {how}",
                                    "benchmarks/unit_versions.py", argv, model=manifest.get("model"),
                                    unit=manifest.get("unit"),
                                    versions=versions, trials=trials, summary=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
