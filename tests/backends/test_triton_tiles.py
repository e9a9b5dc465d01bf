"""Tiles constructed from the GPU's limits and ranked by the micro-performance model (backends/triton/tiles.py)."""

from __future__ import annotations

import pytest

from korch.backends.triton import tiles
from korch.backends.triton.tiles import FMA_FLOPS, TF32_FLOPS, best_tiles, construct

SHAPES = [(128, 768, 768, 1), (197, 768, 3072, 1), (43264, 32, 144, 1), (2704, 128, 1152, 1),
          (128, 128, 64, 12), (4096, 4096, 4096, 1), (5, 7, 9, 1)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rate", [FMA_FLOPS, TF32_FLOPS])
def test_every_constructed_tile_fits_the_gpu(shape, rate):
    built = construct(*shape, "float32", rate)
    assert built
    for t in built:
        assert all(side % 16 == 0 for side in (t.block_m, t.block_n, t.block_k))
        assert t.stages * (t.block_m * t.block_k + t.block_k * t.block_n) * 4 <= tiles.SHARED_BYTES_PER_BLOCK
        assert t.block_m * t.block_n <= tiles.ACCUMULATORS_PER_THREAD * t.warps * 32
        assert tiles.blocks_per_sm(t, 4) >= 1
    assert [round(t.seconds, 12) for t in built] == sorted(round(t.seconds, 12) for t in built)  # fastest first


@pytest.mark.parametrize("rate", [FMA_FLOPS, TF32_FLOPS])
def test_large_problems_get_large_tiles_and_small_ones_small(rate):
    large = best_tiles(4096, 4096, 4096, 1, "float32", 2, rate)
    small = best_tiles(128, 768, 768, 1, "float32", 2, rate)
    assert min(t.block_m * t.block_n for t in large) >= 128 * 128  # reuse: less traffic per multiply-add
    assert max(t.block_m * t.block_n for t in small) <= 64 * 64    # parallelism: 6 tiles of 128x128 for 132 SMs


def test_the_two_variants_are_two_shapes_and_a_tiny_problem_one():
    for shape in SHAPES[:-1]:
        chosen = best_tiles(*shape, "float32", 2, TF32_FLOPS)
        assert len({(t.block_m, t.block_n) for t in chosen}) == len(chosen) == 2
    (only,) = best_tiles(5, 7, 9, 1, "float32", 2, TF32_FLOPS)
    assert (only.block_m, only.block_n, only.block_k) == (16, 16, 16)


def test_tensor_cores_move_the_bound_from_the_multiply_adds_to_memory():
    fma = best_tiles(4096, 4096, 4096, 1, "float32", 1, FMA_FLOPS)[0]
    tf32 = best_tiles(4096, 4096, 4096, 1, "float32", 1, TF32_FLOPS)[0]
    flops = 2 * 4096 ** 3
    assert fma.seconds >= flops / FMA_FLOPS and tf32.seconds >= flops / TF32_FLOPS
    assert tf32.seconds < fma.seconds / 4
