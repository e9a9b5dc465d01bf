"""The host CPU measured once with torch and cached as JSON (``cost.devices`` scales it into ceilings).

The CPU has no datasheet korch can read, so a probe (about two seconds, most
of it allocating) times:

* memory bandwidth: a 256 MB ``copy_`` (bytes read + written), ``sum`` (bytes
  read) and ``fill_`` (bytes written), interleaved over several rounds, the
  fastest of all;
* cache bandwidth: a ``copy_`` between two buffers that fit the cache together
  (256 KB, 1 MB and an eighth of the cache each), repeated, the fastest: without it
  every byte a kernel moves below the cache's size would be free, and a plan
  priced so would write a 30 MB intermediate as readily as nothing;
* matrix FLOP/s: a float32 2048x2048 product, best of two, by the fastest path korch's kernels call
  (``matmul_paths``);
* vector FLOP/s: an in-cache ``addcmul_`` loop, best of several;
* launch overhead: a 1-element ``add``, the mean of a loop, best of several.

A measured best is a rate some code reached, not a ceiling, so the device gets
headroom: launch overhead x0.5, memory bandwidth and matrix FLOP/s x2 (not the
x1.25 first planned: on a shared host the best-of rates swing, 11 to 22 GB/s
and 60 to 105 GFLOP/s within seconds on the 2-vCPU VM korch was written on,
and a probe taken in a slow spell must still stay above). The vector ceiling is
twice the larger FLOP/s ceiling: the elementwise measurement is bound by
torch's per-call cost, a fused kernel keeping data in registers can reach the
FMA units' rate, and CPUs issue adds and compares to pipes beside the FMA units
(Zen 4 has two FADD pipes beside its two FMA pipes). The cache size comes from
sysfs, every data cache level counted (a victim L3 holds what L2 does not).

The result is cached under ``config.cache_dir / "devices"``, keyed by a hash of
the CPU model, the core and torch thread counts, the torch version and the
probe's version, so each host measures once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path

from korch import config
from korch.errors import KorchError
from korch.fsutil import atomic_write_bytes

# Bump when the probe measures differently, so cached results are not reused.
PROBE_VERSION = 3
# Cache size assumed when sysfs says nothing: large, so the bound stays a floor.
FALLBACK_CACHE_BYTES = 512 << 20
FALLBACK_INNER_CACHE_BYTES = 2 << 20  # a core's L1 and L2 where sysfs does not say (most x86 cores: 1-2 MB)

_STREAM_BYTES = 256 << 20
_STREAM_ROUNDS = 3
_MATMUL_N = 2048


def _best(fn, runs: int) -> float:
    """Fastest of ``runs`` timed calls, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def _stream_bandwidth() -> float:
    """Best bytes/s of a copy (read + write), a sum (read) and a fill (write) of 256 MB, interleaved."""
    import torch

    n = _STREAM_BYTES // 4
    src, dst = torch.ones(n), torch.zeros(n)
    tests = [(lambda: dst.copy_(src), 8 * n), (lambda: src.sum(), 4 * n), (lambda: dst.fill_(2.0), 4 * n)]
    best = 0.0
    for _ in range(_STREAM_ROUNDS):  # round robin: a slow spell of a shared host hits all three alike
        for fn, nbytes in tests:
            best = max(best, nbytes / _best(fn, 1))
    return best


def _cache_bandwidth(cache: int) -> float:
    """Best bytes/s (read + written) of a copy between two buffers that stay in the cache, at three sizes
    (the inner caches are faster than the last level: the floor takes the fastest)."""
    import torch

    best = 0.0
    for size in (256 << 10, 1 << 20, max(64 << 10, min(cache // 8, 8 << 20))):
        n = size // 4
        src, dst = torch.ones(n), torch.zeros(n)
        calls = max(4, (64 << 20) // (8 * n))  # about 64 MB moved per timed run

        def copies():
            for _ in range(calls):
                dst.copy_(src)

        best = max(best, 8 * n * calls / _best(copies, 5))
    return best


def matmul_paths(a, b) -> dict:
    """``a @ b`` by each path a korch kernel may multiply with, as calls without arguments: ATen's ``matmul``
    (MKL, or oneDNN where ATen chooses it) and, where torch has oneDNN, its product with the weight packed once
    (what the compiled units' frozen products and korch's library kernels call). On AMD CPUs MKL runs generic
    code: a Zen 5 host's ``matmul`` reached 212 GFLOP/s where the packed product and MLAS reached 480-490, and a
    ceiling of twice the first left MLAS's products 15% below their floors."""
    import torch

    paths = {"matmul": lambda: torch.matmul(a, b)}
    if torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), a.shape[0])
        paths["oneDNN packed"] = lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")
    return paths


def measure(cache: int = FALLBACK_CACHE_BYTES) -> dict[str, float]:
    """Raw rates of this host, as torch reaches them: bytes/s, FLOP/s and seconds per tiny op."""
    import torch

    bandwidth = _stream_bandwidth()
    gen = torch.Generator().manual_seed(config.seed)
    a, b = torch.randn(_MATMUL_N, _MATMUL_N, generator=gen), torch.randn(_MATMUL_N, _MATMUL_N, generator=gen)
    matmul = max(2 * _MATMUL_N ** 3 / _best(product, 2) for product in matmul_paths(a, b).values())

    m, reps = 1 << 15, 64  # three 128 KB operands: in L2
    x, y, z = torch.rand(m, generator=gen), torch.rand(m, generator=gen), torch.rand(m, generator=gen) * 1e-3

    def fma_loop():
        for _ in range(reps):
            x.addcmul_(y, z)

    vector = 2 * m * reps / _best(fma_loop, 5)

    p, q, calls = torch.ones(1), torch.ones(1), 200

    def tiny_loop():
        for _ in range(calls):
            torch.add(p, q)

    launch = _best(tiny_loop, 5) / calls
    return {"memory_bandwidth": bandwidth, "cache_bandwidth": _cache_bandwidth(cache), "matmul_flops": matmul,
            "elementwise_flops": vector, "tiny_op_seconds": launch}


def cache_bytes(sysfs: Path = Path("/sys/devices/system/cpu")) -> int:
    """Bytes of all data caches of this host (each shared cache once), from sysfs."""
    seen = {(level, shared): size for level, shared, size in _data_caches(sysfs.glob("cpu[0-9]*/cache/index[0-9]*"))}
    return sum(seen.values()) or FALLBACK_CACHE_BYTES


def inner_cache_bytes(sysfs: Path = Path("/sys/devices/system/cpu")) -> int:
    """Bytes of the data caches below the last level that one core reads through (cpu0's L1 and L2 on most
    hosts): what a kernel's thread keeps to itself between calls."""
    levels = {level: size for level, _, size in _data_caches((sysfs / "cpu0" / "cache").glob("index[0-9]*"))}
    inner = sum(size for level, size in levels.items() if level < max(levels, default=0))
    return inner or FALLBACK_INNER_CACHE_BYTES


def _data_caches(indices) -> Iterator[tuple[int, str, int]]:
    """(level, CPUs sharing it, bytes) of each data or unified cache among sysfs's cache ``indices``; an index
    sysfs cannot fully read is left out."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for index in indices:
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            size = (index / "size").read_text().strip()
            nbytes = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        except (OSError, ValueError, IndexError):
            continue
        yield level, shared, nbytes


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_path() -> Path:
    import torch

    key = f"{cpu_model()}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}|{PROBE_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(config.cache_dir) / "devices" / f"cpu-{digest}.json"


@functools.cache
def peak_matrix_flops() -> float:
    """The FMA units' float32 peak of all cores from /proc/cpuinfo (0 if unknown): a ceiling no code passes.

    FLOPs per cycle per core: 64 with AVX-512 (two 16-lane FMA pipes, counted at
    the widest any core has), 32 with AVX2+FMA, 16 otherwise; at the highest
    clock the host reports, with a quarter more for boost it may not report.
    """
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return 0.0
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= set(flags) else 16
    mhz = [float(line.split(":", 1)[1]) for line in info.splitlines() if line.startswith("cpu MHz")]
    try:
        mhz.append(int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1000)
    except (OSError, ValueError):
        pass
    return (os.cpu_count() or 1) * per_cycle * max(mhz, default=0.0) * 1e6 * 1.25


RECORD_ENV = "KORCH_CPU_RECORD"
_RECORD_KEYS = ("cpu", "threads", "torch", "cache_bytes", "measured")
_MEASURED_KEYS = ("memory_bandwidth", "cache_bandwidth", "matmul_flops", "elementwise_flops", "tiny_op_seconds")


@functools.cache
def _record_at(path: Path) -> dict:
    if path.exists():
        try:
            record = json.loads(path.read_text())
            if all(k in record for k in _RECORD_KEYS) and all(k in record["measured"] for k in _MEASURED_KEYS):
                return record
        except (ValueError, TypeError):
            pass  # a corrupt file: measure again
    import torch

    record = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "probe_version": PROBE_VERSION,
              "cache_bytes": cache_bytes()}
    record["measured"] = measure(record["cache_bytes"])
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())
    return record


def cpu_record() -> dict:
    """This host's probe record (the measured bests, the cache size, what was measured on): read from the
    cache, or measured (under two seconds) and cached. ``cost.devices`` turns it into ceilings.

    ``KORCH_CPU_RECORD=FILE.json`` prices on a record taken before (a probe file of this cache), so that plans
    do not follow the load of the moment: the tests price on a quiet host's record."""
    fixed = os.environ.get(RECORD_ENV)
    if fixed:
        record = json.loads(Path(fixed).read_text())
        if not (all(k in record for k in _RECORD_KEYS) and all(k in record["measured"] for k in _MEASURED_KEYS)):
            raise KorchError(f"{RECORD_ENV}={fixed} is not a probe record (keys {', '.join(_RECORD_KEYS)})")
        return record
    return _record_at(_cache_path())
