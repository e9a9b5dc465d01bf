"""Tile shapes for the tiled GEMM and convolution kernels, constructed from the GPU's limits and ranked by a model.

A measured search compiles and times every launch variant of every Triton
GEMM or convolution candidate, at 0.3 to 4.5 s a compile for sm_90: with the
eight fixed tile shapes of a hand-written list, hours of compiling for the
zoo. Here, as in ROLLER (the seed paper), tiles are constructed rather than
searched, and only the best ``config.launch_variants`` by a micro-performance
model are compiled and timed.

* **Construction.** Block sides are multiples of 16 (``tl.dot``'s least, and
  the MMA shapes' M and K: m16n8k8 for TF32, m16n8k16 for half), powers of
  two up to 256, clipped to the problem. A tile fits when its pipeline
  (``stages`` copies of its A and B tiles) fits the shared memory a block may
  use, and its float32 accumulator fits the registers of its warps (at most
  ``ACCUMULATORS_PER_THREAD`` a thread, leaving the rest to addresses and
  operands).
* **Model.** The time is the busiest SM's: the tiles it runs (the grid over
  the SMs), as many at once as registers, shared memory and warp slots let
  in, in rounds of K steps. A step of the tiles running together takes the
  longest of: their multiply-adds at the SM's share of the matrix rate;
  their operand bytes at its share of the L2 bandwidth; their operand reads
  from shared memory (each element once for every thread, or tensor-core
  warp, that needs it: a unit holding u outputs of the tile reuses a read
  about sqrt(u) times); one global load's latency over the loads a block
  keeps in flight (stages - 1). Padding counts: a 128-row tile on a 20-row
  problem does 128 rows of work. The whole problem also cannot beat its
  unique bytes at the memory bandwidth. Ties go to less operand traffic.

The ranking only has to put a near-best tile in the first two; on a GPU the
two are compiled and timed and the faster kept (``launch.TritonKernel.tune``).
What the choice costs against the eight fixed shapes is for a GPU session to
measure: the same benchmark with ``KORCH_LAUNCH_VARIANTS=0`` and without.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from korch.backends.triton.kernel_class import next_power_of_2
from korch.cost.devices import GPUS
from korch.ir.dtypes import itemsize as dtype_bytes

# The GPU the tiles are ranked for: an H100 SXM (sm_90), korch's campaign device; shared memory capped at the
# A100's 163 KB per block so that every tile also compiles for sm_80.
_H100 = GPUS["h100"]
SMS = _H100.sms
SHARED_BYTES_PER_BLOCK = 163 * 1024
SHARED_BYTES_PER_SM = 228 * 1024
REGISTERS_PER_SM = 65536
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32
# dense rates: half and TF32 on tensor cores, float32 as given ("ieee") on the FMA pipes
HALF_FLOPS, TF32_FLOPS, FMA_FLOPS = _H100.matrix_flops["float16"], _H100.matrix_flops["float32"], _H100.vector_flops
L2_BANDWIDTH = _H100.cache_bandwidth  # bytes/s into all SMs (the SM-side ceiling)
SHARED_BANDWIDTH_PER_SM = L2_BANDWIDTH / SMS  # 32 banks of 4 bytes a clock: the same 128 bytes a clock
MEMORY_BANDWIDTH = _H100.memory_bandwidth
ACCUMULATORS_PER_THREAD = 128       # float32 accumulator registers a thread may hold
LOAD_LATENCY_S = 600 / 1.98e9       # a global load's latency: about 600 cycles from issue to use
SIDES = (16, 32, 64, 128, 256)
K_SIDES = (16, 32, 64, 128)


@dataclasses.dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    seconds: float = 0.0  # the model's time for the problem it was ranked on
    traffic: int = 0      # operand bytes all its tiles load: between tiles as fast, the fewer the better


def matrix_rate(dtype: str, input_precision: str) -> float:
    """FLOP/s of ``tl.dot`` on ``dtype`` operands with ``input_precision`` ("ieee", "tf32", "tf32x3")."""
    if dtype == "float16":
        return HALF_FLOPS
    return {"tf32": TF32_FLOPS, "tf32x3": TF32_FLOPS / 3}.get(input_precision, FMA_FLOPS)


def clip_side(side: int, size: int) -> int:
    """The side, no larger than the problem rounded up to a power of two, at least 16."""
    return max(16, min(side, next_power_of_2(size)))


def _tile_count(tile: Tile, m: int, n: int, problems: int) -> int:
    return math.ceil(m / tile.block_m) * math.ceil(n / tile.block_n) * problems


def _shared_bytes(bm: int, bn: int, bk: int, stages: int, itemsize: int) -> int:
    return stages * (bm * bk + bk * bn) * itemsize


def blocks_per_sm(tile: Tile, itemsize: int) -> int:
    """Blocks of ``tile`` an SM holds at once: bounded by shared memory, registers, warp slots and blocks."""
    shared = _shared_bytes(tile.block_m, tile.block_n, tile.block_k, tile.stages, itemsize)
    registers = 2 * tile.block_m * tile.block_n  # the accumulator, and as much again for operands and addresses
    return max(0, min(SHARED_BYTES_PER_SM // shared, REGISTERS_PER_SM // registers,
                      WARPS_PER_SM // tile.warps, BLOCKS_PER_SM))


def model_seconds(tile: Tile, m: int, n: int, k: int, problems: int, dtype: str, matrix_flops: float) -> float:
    """The micro-performance model's time for ``problems`` GEMMs of m x n x k with ``tile`` (see the docstring)."""
    itemsize = dtype_bytes(dtype)
    resident = blocks_per_sm(tile, itemsize)
    if resident == 0:
        return math.inf
    per_sm = math.ceil(_tile_count(tile, m, n, problems) / SMS)  # tiles the busiest SM runs
    together = min(resident, per_sm)         # of them at once
    rounds = math.ceil(per_sm / together)
    steps = math.ceil(k / tile.block_k)
    compute = 2 * tile.block_m * tile.block_n * tile.block_k / (matrix_flops / SMS)
    traffic = (tile.block_m + tile.block_n) * tile.block_k * itemsize / (L2_BANDWIDTH / SMS)
    # each operand element goes from shared memory to every thread (FMA pipes) or warp (tensor cores) that
    # needs it: a unit holding u outputs of the tile reuses what it reads about sqrt(u) times
    units = tile.warps * (1 if matrix_flops > FMA_FLOPS else 32)
    reuse = math.sqrt(tile.block_m * tile.block_n / units)
    shared = 2 * itemsize * tile.block_k * tile.block_m * tile.block_n / reuse / SHARED_BANDWIDTH_PER_SM
    latency = LOAD_LATENCY_S / (tile.stages - 1)  # a block's loads in flight hide each other's latency
    step = max(together * compute, together * traffic, together * shared, latency)
    unique = (m * k + k * n) * problems * itemsize + m * n * problems * 4
    return max(rounds * steps * step, unique / MEMORY_BANDWIDTH)


def construct(m: int, n: int, k: int, problems: int, dtype: str, matrix_flops: float) -> list[Tile]:
    """Every tile that fits (see the docstring), clipped to the problem, fastest first by the model."""
    itemsize = dtype_bytes(dtype)
    seen: dict[tuple[int, int, int, int, int], Tile] = {}
    for bm in SIDES:
        for bn in SIDES:
            for bk in K_SIDES:
                for stages in (2, 3, 4):
                    sides = (clip_side(bm, m), clip_side(bn, n), clip_side(bk, k))
                    if _shared_bytes(*sides, stages, itemsize) > SHARED_BYTES_PER_BLOCK:
                        continue
                    warps = 8 if sides[0] * sides[1] >= 128 * 128 else 4
                    if sides[0] * sides[1] > ACCUMULATORS_PER_THREAD * warps * 32:
                        continue
                    key = (*sides, warps, stages)
                    if key not in seen:
                        tile = Tile(*key)
                        steps = math.ceil(k / tile.block_k)
                        loads = _tile_count(tile, m, n, problems) * (tile.block_m + tile.block_n) * steps * tile.block_k
                        seen[key] = dataclasses.replace(
                            tile, seconds=model_seconds(tile, m, n, k, problems, dtype, matrix_flops),
                            traffic=loads * itemsize)
    # ties (both bound by memory, or by the matrix rate) go to less traffic, then fewer stages (less to compile)
    return sorted((t for t in seen.values() if math.isfinite(t.seconds)),
                  key=lambda t: (round(t.seconds, 12), t.traffic, t.stages, t.block_m * t.block_n * t.block_k))


@functools.lru_cache(maxsize=4096)  # a kernel class generates its kernel to claim it: the same GEMM many times
def best_tiles(m: int, n: int, k: int, problems: int, dtype: str, count: int,
               matrix_flops: float) -> tuple[Tile, ...]:
    """The model's ``count`` fastest tiles for the problem (at least one), each after the first of a shape
    (BLOCK_M x BLOCK_N) not chosen yet: a hedge against the model, not its runner-up with one more stage."""
    chosen: list[Tile] = []
    for tile in construct(m, n, k, problems, dtype, matrix_flops):
        if len(chosen) >= max(1, count):
            break
        if not chosen or all((t.block_m, t.block_n) != (tile.block_m, tile.block_n) for t in chosen):
            chosen.append(tile)
    return tuple(chosen)
