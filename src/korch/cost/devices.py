"""The devices korch can cost kernels for: peak rates no kernel on them can beat.

Each ``Device`` holds the ceilings the roofline lower bound (``cost/roofline.py``)
divides work by. Every number is an upper limit of what the hardware can do
(vendor peaks, dense, at the highest boost clock), never a typical rate, so
that time = work / rate is a floor. Where a published figure is not such a
limit (an FP32 rate that other pipes can add to, an L2 size the SXM part does
not state), the entry says what it uses instead and why; docs/cost.md has the
table with every source.

The GPUs are a fixed table; the host CPU (``"cpu"``) is measured once by
``cost/probe.py`` and cached.
"""

from __future__ import annotations

import dataclasses
import math

from korch.cost import probe
from korch.errors import KorchError

HALF_DTYPES = ("float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Device:
    """Peak rates of one device; every rate is an upper bound, so work / rate is a lower bound on time."""

    name: str
    kind: str  # "gpu" | "cpu"
    memory_bandwidth: float  # bytes/s of device memory (HBM, DRAM): reads and writes together
    vector_flops: float  # FLOP/s of scalar/vector units on float32 (and every non-16-bit dtype)
    matrix_flops: dict[str, float] = dataclasses.field(hash=False)  # dtype -> dense matmul/conv FLOP/s
    launch_overhead: float = 0.0  # s: the least time any kernel takes, however little it does
    source: str = ""  # where the numbers come from
    half_vector_flops: float = 0.0  # FLOP/s of vector units on packed float16/bfloat16 (0: as float32)
    cache_bytes: int = 0  # bytes of the last-level cache: kernel inputs it may hold, outputs it may absorb
    cache_bandwidth: float = math.inf  # bytes/s through that cache (every byte a kernel moves passes it)
    # whether some library on it runs convolutions with a fast algorithm (cuDNN's Winograd and FFT: a V100 runs
    # 3x3 float32 convolutions at up to 4x the FMA peak in direct-algorithm FLOPs); if so a convolution's floor
    # counts one multiply-add per output, input channel and stride phase, not per kernel tap
    fast_convolution: bool = True
    sms: int = 0  # a GPU's streaming multiprocessors (0: not a GPU)

    def vector_peak(self, dtype: str = "float32") -> float:
        if dtype in HALF_DTYPES and self.half_vector_flops:
            return max(self.half_vector_flops, self.vector_flops)
        return self.vector_flops

    def matrix_peak(self, dtype: str = "float32") -> float:
        """The dtype's dense matrix rate; a dtype without one gets the fastest rate listed (still a ceiling)."""
        if dtype in self.matrix_flops:
            return self.matrix_flops[dtype]
        return max(self.matrix_flops.values(), default=self.vector_flops)


# Per-kernel floor on every GPU: the shortest time between two dependent kernels
# replayed in a CUDA graph. A public measurement of no-op kernels chained in a
# replayed graph gave about 0.58 us per node (ahrefs/ocannl issue 488, RTX 5070 Ti,
# CUDA 13.3); datacenter parts are not faster at this. Half a microsecond is under
# that, so no real kernel beats it; 1 us would not be safe on recent drivers.
GPU_LAUNCH_OVERHEAD = 0.5e-6

MIB = 1 << 20


def _sm_ceiling(sms: int, clock_hz: float) -> float:
    """Bytes/s all SMs can take in: 128 B/clk per SM through L1/shared memory, at the boost clock."""
    return sms * 128 * clock_hz


def _issue_ceiling(sms: int, clock_hz: float) -> float:
    """Counted vector FLOP/s: 4 warp instructions (128 thread-ops) per SM and clock, 2 FLOPs each (an FMA)."""
    return sms * 128 * 2 * clock_hz


_H100_SOURCE = (
    "NVIDIA H100 Tensor Core GPU datasheet and Hopper architecture whitepaper (H100 SXM5: 132 SMs, "
    "boost 1.98 GHz, HBM3 3.35 TB/s, FP32 66.9 TFLOPS, FP16 non-tensor 133.8, TF32 tensor 494.7 dense "
    "(989 with sparsity), FP16/BF16 tensor 989.4 dense, L2 50 MB); cache bandwidth: SM-side ceiling "
    "132 x 128 B/clk x 1.98 GHz (NVIDIA publishes no H100 L2 bandwidth)"
)

_H200_SOURCE = (
    "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM 141 GB: HBM3e 4.8 TB/s; FP32 67 TFLOPS, TF32 989 and "
    "FP16/BF16 1979 TFLOPS with sparsity, i.e. the H100 SXM's 494.7 / 989.4 dense); same GH100 SMs and clocks "
    "as the H100 SXM5; L2 60 MB as PyTorch reports it on an H200 (more than the H100's 50: the larger "
    "figure keeps the bound a floor); cache bandwidth: SM-side ceiling as for the H100"
)

_A100_SOURCE = (
    "NVIDIA A100 Tensor Core GPU datasheet and Ampere architecture whitepaper (A100 SXM4 80GB: 108 SMs, "
    "boost 1.41 GHz, HBM2e 2039 GB/s, FP32 19.5 TFLOPS, FP16 non-tensor 78, TF32 tensor 156 dense, "
    "FP16/BF16 tensor 312 dense, L2 40 MB at 5120 B/clk); vector ceiling: issue rate 2 x FP32 "
    "(FP32 and INT/ALU pipes co-issue)"
)

_V100_SOURCE = (
    "NVIDIA Tesla V100 datasheet and Volta architecture whitepaper (V100 SXM2 32GB: 80 SMs, boost 1.53 GHz, "
    "HBM2 900 GB/s, FP32 15.7 TFLOPS, tensor (FP16) 125 TFLOPS, no TF32: float32 matmul at the FP32 FMA peak, "
    "L2 6 MB at 2048 B/clk per the Ampere whitepaper's comparison); vector ceiling: issue rate 2 x FP32"
)

GPUS: dict[str, Device] = {
    "h100": Device(
        name="h100", kind="gpu", memory_bandwidth=3.35e12,
        vector_flops=_issue_ceiling(132, 1.98e9),  # 66.9e12, the published FP32 peak
        half_vector_flops=2 * _issue_ceiling(132, 1.98e9),  # 133.8e12, the published FP16 non-tensor peak
        matrix_flops={"float32": 494.7e12, "float16": 989.4e12, "bfloat16": 989.4e12},
        launch_overhead=GPU_LAUNCH_OVERHEAD, cache_bytes=50 * MIB, cache_bandwidth=_sm_ceiling(132, 1.98e9),
        sms=132, source=_H100_SOURCE,
    ),
    "h200": Device(
        name="h200", kind="gpu", memory_bandwidth=4.8e12,
        vector_flops=_issue_ceiling(132, 1.98e9),
        half_vector_flops=2 * _issue_ceiling(132, 1.98e9),
        matrix_flops={"float32": 494.7e12, "float16": 989.4e12, "bfloat16": 989.4e12},
        launch_overhead=GPU_LAUNCH_OVERHEAD, cache_bytes=60 * MIB, cache_bandwidth=_sm_ceiling(132, 1.98e9),
        sms=132, source=_H200_SOURCE,
    ),
    "a100": Device(
        name="a100", kind="gpu", memory_bandwidth=2.039e12,
        vector_flops=_issue_ceiling(108, 1.41e9),  # 39.0e12 = 2 x the published 19.5
        half_vector_flops=2 * _issue_ceiling(108, 1.41e9),
        matrix_flops={"float32": 156e12, "float16": 312e12, "bfloat16": 312e12},
        launch_overhead=GPU_LAUNCH_OVERHEAD, cache_bytes=40 * MIB, cache_bandwidth=5120 * 1.41e9,
        sms=108, source=_A100_SOURCE,
    ),
    "v100": Device(
        name="v100", kind="gpu", memory_bandwidth=900e9,
        vector_flops=_issue_ceiling(80, 1.53e9),  # 31.3e12 = 2 x the published 15.7
        half_vector_flops=2 * _issue_ceiling(80, 1.53e9),
        matrix_flops={"float32": 15.7e12, "float16": 125e12},
        launch_overhead=GPU_LAUNCH_OVERHEAD, cache_bytes=6 * MIB, cache_bandwidth=2048 * 1.53e9,
        sms=80, source=_V100_SOURCE,
    ),
}

KNOWN_TARGETS = ("cpu", *GPUS)

# Headroom above the probe's measured best: a ceiling must stay above what any
# kernel reaches, and the probe's own code is not the fastest. x2, not x1.25: on
# the shared 2-vCPU VM korch was written on, best-of rates swung from second to
# second between 11 and 22 GB/s (copy) and 60 and 105 GFLOP/s (matmul).
BANDWIDTH_HEADROOM = 2.0
FLOPS_HEADROOM = 2.0


def cpu_device_from(record: dict) -> Device:
    """The host as a ``Device``: the probe's measured bests (``probe.cpu_record``) with headroom.

    Three choices make the CPU's floors tighter than a GPU's (docs/cost.md, "The host CPU"):
    * no launch term: inside the compiled unit a kernel costs 0.1 us, and a measured kernel's latency less its
      backend's calling cost comes out at 0 to 0.4 us for a kernel of a few bytes;
    * vector FLOP/s at the FMA peak: that counts an FMA as two operations, and no x86 core issues more than
      two 512-bit (or four 256-bit) vector operations a cycle, so it is at least the rate of any mix;
    * convolutions without a fast algorithm: korch's CPU backends run them direct (oneDNN's direct
      convolution through torch, MLAS's im2col products, korch's own products for 1x1 convolutions).
    """
    raw = record["measured"]
    # the measured best can sit far below what oneDNN reaches in a good spell: never below the FMA peak
    matrix = max(raw["matmul_flops"] * FLOPS_HEADROOM, probe.peak_matrix_flops())
    vector = max(raw["elementwise_flops"] * FLOPS_HEADROOM, matrix)
    bandwidth = raw["memory_bandwidth"] * BANDWIDTH_HEADROOM
    cache_bandwidth = max(raw["cache_bandwidth"] * BANDWIDTH_HEADROOM, bandwidth)
    return Device(
        name="cpu", kind="cpu", memory_bandwidth=bandwidth, vector_flops=vector,
        matrix_flops={"float32": matrix}, launch_overhead=0.0,
        cache_bytes=int(record["cache_bytes"]), cache_bandwidth=cache_bandwidth, fast_convolution=False,
        source=(f"probe v{probe.PROBE_VERSION} of {record['cpu']} ({record['threads']} torch threads, "
                f"torch {record['torch']}): measured best x{BANDWIDTH_HEADROOM} bandwidths (memory, cache), "
                f"x{FLOPS_HEADROOM} FLOP/s or the FMA peak (vector and matrix), no launch term, direct "
                "convolutions; cache from sysfs"),
    )


def get_device(target: str, exact_float32: bool = False) -> Device:
    """The device named ``target``: one of ``KNOWN_TARGETS``; "cpu" is this host, probed once and cached.

    ``exact_float32``: float32 products computed exactly (the ``fp32`` precision policy, TF32 off), so a GPU
    multiplies them on its FMA units: their matrix rate is the vector peak, not the TF32 tensor-core rate
    (an H100: 66.9 against 494.7 TFLOP/s; measured there, 51.7 with cuBLAS).
    """
    name = target.lower()
    if name == "cpu":
        return cpu_device_from(probe.cpu_record())
    if name in GPUS:
        device = GPUS[name]
        if exact_float32:
            exact = min(device.matrix_peak("float32"), device.vector_peak("float32"))
            device = dataclasses.replace(device, matrix_flops={**device.matrix_flops, "float32": exact})
        return device
    raise KorchError(f"unknown target {target!r}; known: {', '.join(KNOWN_TARGETS)}")
