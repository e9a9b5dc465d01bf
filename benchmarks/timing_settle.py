"""What stopping a CPU timing once its median is known costs and saves: kernels timed as the search times them.

Random candidate kernels of a model are built and checked as a build worker does (``measure._build_and_check``),
then each is timed as the measured search times it (``measure._time_checked``) under each ``--settle`` setting
(``off``: every run the budget allows; a fraction: ``timing.settled``), settings taking turns kernel by kernel,
twice. Reports each setting's seconds a timing and runs, how far apart its two timings of a kernel are (median
and 90th percentile of |log ratio|), and how its timings sit against the first setting's (a shift would bias
every price).

    python benchmarks/timing_settle.py zoo:candy [--kernels 80] [--settle off,0.02,0.01] [--out FILE.json]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    import numpy as np

    from build_profile import checked_jobs, retimed, sampled_jobs, sampling_parser
    from korch import bench
    from korch.backends import measure, timing
    from korch.backends.check import RandomArena

    parser = sampling_parser(__doc__, kernels=80, seed=5)
    parser.add_argument("--settle", default="off,0.02,0.01")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    settings = [None if s == "off" else float(s) for s in args.settle.split(",")]
    built = [b for b in checked_jobs(sampled_jobs(args.model, args.kernels, args.seed)) if b[0].status == "ok"]
    arena, current = RandomArena("cpu"), {}
    latency = {s: ([], []) for s in settings}
    runs, spent = {s: [] for s in settings}, {s: 0.0 for s in settings}

    def with_setting(*args, **kwargs):  # the search's timing, at the setting in turn
        result = timing.time_measured(*args, **{**kwargs, "settle_within": current["setting"]})
        runs[current["setting"]].append(result.runs)
        return result

    measure.time_measured = with_setting
    for checked, kernel, backend in built:
        for round_ in range(2):
            for setting in settings:
                current["setting"] = setting
                started = time.perf_counter()
                latency[setting][round_].append(retimed(checked, kernel, backend, arena))
                spent[setting] += time.perf_counter() - started
    rows, first = [], np.array(latency[settings[0]][0] + latency[settings[0]][1])
    for setting in settings:
        a, b = (np.array(x) for x in latency[setting])
        apart = np.abs(np.log(a / b))
        shift = np.log(np.concatenate([a, b]) / first)
        rows.append({"settle": setting if setting is not None else "off",
                     "ms_a_timing": round(spent[setting] / (2 * len(built)) * 1e3, 2),
                     "median_runs": float(np.median(runs[setting])),
                     "two_timings_apart_median": round(float(np.median(apart)), 4),
                     "two_timings_apart_p90": round(float(np.quantile(apart, 0.9)), 4),
                     "mean_log_ratio_to_first": round(float(shift.mean()), 4)})
        print(rows[-1])
    bench.write_record(bench.record("a CPU timing stopped once its median is settled", "benchmarks/timing_settle.py",
                                    argv, rows=rows, kernels=len(built)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
