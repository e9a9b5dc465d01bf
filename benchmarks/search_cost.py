"""What a measured search costs, model by model, next to the Korch paper's tuning hours (its Table 2).

Each model is optimized in a fresh process with an empty profile database and cold compiler caches (a
temporary ``--db`` and ``TORCHINDUCTOR_CACHE_DIR``), timed from start to the written executable; the table
takes its counts and seconds from the plan's ``stats.measurement`` (``korch/orchestrate/segments.py``).

    python benchmarks/search_cost.py candy bert_layer --out benchmarks/results/search_cost_cpu.json

``--outdirs`` tabulates plans written already (``NAME=OUTDIR[:WALL_S]``) instead of running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAPER_TUNING_H = {"candy": 5.5, "efficientvit": 11.5, "yolox_nano": 2.8, "yolov4": 12.2, "segformer_b0": 9.2}


def run(model: str, target: str) -> tuple[Path, float]:
    """Optimize ``model`` from nothing; (its output directory, wall seconds)."""
    work = Path(tempfile.mkdtemp(prefix=f"korch-search-{model}-"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "korch", "optimize", f"zoo:{model}", "--target", target, "--cost",
                    "measured", "--db", str(work / "profile.sqlite"), "-o", str(work / model)],
                   check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    return work / model, time.perf_counter() - started


def row(model: str, outdir: Path, wall_s: float | None) -> dict:
    stats = json.loads((outdir / "plan.json").read_text())["stats"]
    m = stats["measurement"]
    return {"model": model, "candidates": m["candidates"], "signatures": m["signatures"],
            "asked": m["signatures_asked"], "measured_share": round(m["measured_share"], 3),
            "from_database": m["from_database"], "kernels_measured": m["kernels_measured"],
            "build_s": round(m["build_s"], 1), "timing_s": round(m["timing_s"], 1),
            "measure_and_solve_s": round(stats["stage_seconds"]["measure and solve"], 1),
            "wall_s": None if wall_s is None else round(wall_s, 1), "paper_tuning_h": PAPER_TUNING_H.get(model)}


def table(rows: list[dict]) -> str:
    lines = ["| model | candidates | signatures | measured share | from database | builds timed | building s "
             "| timing s | measure and solve s | optimize, wall | paper tuning |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        wall = "-" if r["wall_s"] is None else f"{r['wall_s'] / 60:.1f} min"
        paper = "-" if r["paper_tuning_h"] is None else f"{r['paper_tuning_h']} h"
        lines.append(f"| {r['model']} | {r['candidates']} | {r['signatures']} | {r['measured_share']:.0%} "
                     f"| {r['from_database']} | {r['kernels_measured']} | {r['build_s']} | {r['timing_s']} "
                     f"| {r['measure_and_solve_s']} | {wall} | {paper} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=[])
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--outdirs", nargs="*", default=[], help="NAME=OUTDIR[:WALL_S]: tabulate, do not run")
    parser.add_argument("--out", help="write the rows, with the machine and date, as JSON")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.outdirs:
        name, _, rest = spec.partition("=")
        outdir, _, wall = rest.partition(":")
        rows.append(row(name, Path(outdir), float(wall) if wall else None))
    for model in args.models:
        outdir, wall = run(model, args.target)
        rows.append(row(model, outdir, wall))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    from korch import bench

    bench.write_record(bench.record("measured search cost", "benchmarks/search_cost.py", argv, target=args.target,
                                    rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
