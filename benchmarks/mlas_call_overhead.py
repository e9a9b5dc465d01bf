"""What one MLAS product costs a compiled unit beyond its arithmetic: each call timed hot (called again and
again, as a search times a kernel alone) and after a sweep of 16 MiB through both cores' caches (as in a unit,
where other kernels run between two products).

korch's MLAS products (``backends/ort_gemm.py``) are one-MatMul ONNX Runtime sessions run from C++: the session's
``Run`` path (its state, its code) is what a cold call finds out of the cache. YOLOX-Nano's products are small
(16-512 channels, 169-10816 pixels), so a fixed cost a call weighs on its 82 of them. ``--shapes M,K,N;...``
picks the products (rows, inner, columns); the default is a spread of YOLOX-Nano's.

    python benchmarks/mlas_call_overhead.py [--threads 2] [--calls 300] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

YOLOX_SHAPES = "169,64,64;169,64,4;676,64,64;2704,64,64;10816,16,16;169,256,128;2704,128,32"
SWEEP_FLOATS = 4 << 20  # 16 MiB: past both cores' L2 and a good part of the shared L3


def median_us(call, calls: int, sweep=None) -> float:
    """The median microseconds of ``call()``, each call after ``sweep()`` where given (untimed)."""
    seconds = []
    for _ in range(calls):
        if sweep is not None:
            sweep()
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1e6


def main(argv=None) -> int:
    import korch  # noqa: F401  (before torch: korch settles OpenMP's waiting)
    import torch

    from korch import bench
    from korch.backends import ort_gemm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=YOLOX_SHAPES, help="products as M,K,N;M,K,N;...")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    ort_gemm.open_library()
    unit = random.getrandbits(62)
    swept = torch.randn(SWEEP_FLOATS)
    rows = []
    with torch.inference_mode():
        for slot, shape in enumerate(args.shapes.split(";")):
            m, k, n = (int(v) for v in shape.split(","))
            x, w = torch.randn(m, k), torch.randn(k, n)

            def call():
                ort_gemm.ops().matmul(x, w, unit, slot)

            torch.testing.assert_close(ort_gemm.ops().matmul(x, w, unit, slot), x @ w, rtol=1e-4, atol=1e-3)
            median_us(call, 20)  # warm-up
            hot, cold = [], []
            for _ in range(2):  # hot and swept in turns, so that a drifting host moves both alike
                hot.append(median_us(call, args.calls))
                cold.append(median_us(call, args.calls, lambda: swept.mul_(1.0)))
            row = {"m": m, "k": k, "n": n, "hot_us": round(min(hot), 2), "swept_us": round(min(cold), 2)}
            row["extra_us"] = round(row["swept_us"] - row["hot_us"], 2)
            rows.append(row)
            print(f"{m}x{k}x{n}: hot {row['hot_us']:.1f} us, after a sweep {row['swept_us']:.1f} us "
                  f"(+{row['extra_us']:.1f})", flush=True)
    extra = statistics.median(r["extra_us"] for r in rows)
    print(f"median extra a call after a sweep: {extra:.1f} us")
    bench.write_record(bench.record("one MLAS product hot and after a cache sweep", "benchmarks/mlas_call_overhead.py",
                                    argv, rows=rows, median_extra_us=extra), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
