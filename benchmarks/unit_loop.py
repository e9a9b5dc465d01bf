"""An OUTDIR's executable (its compiled unit, on a CPU) called in a loop for a while: what a sampling profiler
watches.

torch's profiler does not see the library calls inside an AOTInductor unit, and Inductor's kernel profile
slows its kernels, so the unit's time is read from outside, with ``perf`` (native symbols: MKL, oneDNN's JIT
code, libgomp's waiting, the unit's own kernels in its ``wrapper.so``):

    perf record -F 4999 -g -o /tmp/unit.perf python benchmarks/unit_loop.py OUTDIR 15
    perf report -i /tmp/unit.perf --no-children --sort dso -g none
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    import torch

    import korch
    from korch.runtime.selfcheck import seeded_inputs

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python benchmarks/unit_loop.py OUTDIR SECONDS", file=sys.stderr)
        return 2
    outdir, seconds = Path(argv[0]), float(argv[1])
    executable = korch.load(outdir)
    feed = seeded_inputs(executable.input_specs)
    inputs = [torch.from_numpy(feed[name]) for name in executable.input_specs]
    for _ in range(20):
        executable(*inputs)
    start, runs = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        executable(*inputs)
        runs += 1
    print(f"{runs} runs, {(time.perf_counter() - start) / runs * 1e3:.2f} ms a run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
