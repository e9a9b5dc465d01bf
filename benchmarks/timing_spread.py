"""How far apart two prices of one kernel are: the same build timed twice minutes apart, two builds, new inputs.

Random candidate kernels of a model (``build_profile.sampled_jobs``) are built and checked twice, as two build
workers would (``A`` and ``B``), each set with its own input arena; then timed as the measured search times them
(``measure._time_checked``): A, B, A again, B again, and A on a fresh arena. For each pair, the |log ratio| of
the kernels' latencies less its median (the host's drift between the two passes), median and 90th percentile.

    python benchmarks/timing_spread.py zoo:candy [--kernels 60] [--out FILE.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    import numpy as np

    from build_profile import checked_jobs, retimed, sampled_jobs, sampling_parser
    from korch import bench
    from korch.backends.check import RandomArena

    parser = sampling_parser(__doc__, kernels=60, seed=11)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    jobs = sampled_jobs(args.model, args.kernels, args.seed)
    builds = {name: checked_jobs(jobs) for name in "AB"}

    def timed(name: str, arena) -> np.ndarray:
        return np.array([retimed(*built, arena) for built in builds[name]], dtype=float)

    arenas = {"A": RandomArena("cpu"), "B": RandomArena("cpu")}
    passes = {"A1": timed("A", arenas["A"]), "B1": timed("B", arenas["B"]), "A2": timed("A", arenas["A"]),
              "B2": timed("B", arenas["B"]), "A3": timed("A", RandomArena("cpu"))}
    pairs = {"one build, minutes apart": [("A1", "A2"), ("B1", "B2")], "two builds": [("A1", "B1"), ("A2", "B2")],
             "one build, new inputs": [("A1", "A3")]}
    rows = []
    for label, of in pairs.items():
        for x, y in of:
            ratio = np.log(passes[x] / passes[y])
            ratio = ratio[np.isfinite(ratio)]
            apart = np.abs(ratio - np.median(ratio))
            rows.append({"pair": f"{x} vs {y}", "what": label, "kernels": int(ratio.size),
                         "drift": round(float(np.median(ratio)), 4), "apart_median": round(float(np.median(apart)), 4),
                         "apart_p90": round(float(np.quantile(apart, 0.9)), 4)})
            print(rows[-1])
    bench.write_record(bench.record("two prices of one kernel", "benchmarks/timing_spread.py", argv, rows=rows),
                       args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
