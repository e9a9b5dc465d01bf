"""korch's configuration: every tunable value in one place.

Each value is typed, commented, and takes its default from a ``KORCH_*``
environment variable where one is named. Stages read ``config.X``; they never
read ``os.environ`` themselves. Tests change values with ``patch``::

    with config.patch(cache_dir=tmp_path):
        ...
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from korch.errors import KorchError


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else default


# Where korch keeps what it can rebuild: exported zoo models, profiles.
cache_dir: Path = _env_path(
    "KORCH_CACHE_DIR",
    _env_path("XDG_CACHE_HOME", Path.home() / ".cache") / "korch",
)

# ONNX opset of the primitive graphs korch writes (19: AveragePool dilations, Pad wrap).
export_opset: int = int(os.environ.get("KORCH_EXPORT_OPSET", "19"))

# Constant folding skips a node whose folded outputs would exceed this many
# elements: folding must not blow a small shape computation up into a huge
# constant (an Expand of a weight to a batch, say).
fold_max_elements: int = int(os.environ.get("KORCH_FOLD_MAX_ELEMENTS", str(1 << 24)))

# A 1x1 convolution of a channel concatenation is split per part and moved before the upsampling
# Resizes that made them, and one of a token projection folds into it (frontend/linear_motion.py); 0 keeps
# the graph as given.
move_linear_maps: bool = os.environ.get("KORCH_MOVE_LINEAR_MAPS", "1") != "0"

# A convolution of a space-to-depth concatenation (YOLO's Focus stem) becomes one strided convolution of the
# image (frontend/space_to_depth.py); 0 keeps the graph as given.
fold_space_to_depth: bool = os.environ.get("KORCH_FOLD_SPACE_TO_DEPTH", "1") != "0"

# A measured CPU search prices the kernels its optimum selects as they run in sequence (backends/in_place.py),
# not only alone: "on", "off", or "auto": where some candidate kernel's values overflow the last-level cache
# twice over (where alone, on warm inputs, a kernel runs faster than in the executable; docs/orchestration.md).
_in_place = os.environ.get("KORCH_IN_PLACE", "auto")
in_place: str = {"1": "on", "0": "off"}.get(_in_place, _in_place)

# Columns a round of the measured search may measure beside its plan's: those still in reach of a plan cheaper
# than the cheapest measured one, by the relaxation's reduced costs (orchestrate/lazy.py). 0 measures only what
# each round's plan selects: fewer measurements, many more rounds (Candy from an empty database, 2 cores: 776
# distinct kernels in 44 rounds, 202 s; with 256, all 916 in 8 rounds, 143 s).
measure_ahead: int = int(os.environ.get("KORCH_MEASURE_AHEAD", "256"))

# A measured search times every product and convolution alone before its rounds and bounds each kernel holding
# one by most of that time (cost/parts.py); 0 bounds them by their FLOPs at the peak only, to measure what the
# tighter floors save.
part_floors: bool = os.environ.get("KORCH_PART_FLOORS", "1") != "0"

# Largest candidate kernel, in primitive nodes (the enumeration grows fast with it).
max_kernel_nodes: int = int(os.environ.get("KORCH_MAX_KERNEL_NODES", "8"))

# Segments larger than this many primitive nodes are cut further, even where a
# cut drops candidate kernels that cross it (the report counts them). The zoo's
# whole models (<= 1000 primitives) solve as one exact program in seconds.
max_segment_nodes: int = int(os.environ.get("KORCH_MAX_SEGMENT_NODES", "2000"))

# Launch variants of a Triton GEMM, convolution or pointwise kernel that a measured search compiles and times
# (each one more compile and timing per candidate on a GPU): GEMMs and convolutions the best tiles by
# backends/triton/tiles.py's model, pointwise kernels the default block and the one that fills the GPU; 0: every
# fixed variant korch used before (eight tile shapes, four block sizes), to measure what the choice costs.
launch_variants: int = int(os.environ.get("KORCH_LAUNCH_VARIANTS", "2"))

# On a CPU, compile the whole plan into one AOTInductor package (runtime/unit.py) instead of running its
# kernels one Python call at a time. Off, `korch optimize` builds faster (no whole-plan compile) and the
# executable runs kernel by kernel; `--kernel-by-kernel` turns it off for one command.
compiled_unit: bool = os.environ.get("KORCH_COMPILED_UNIT", "1") != "0"

# A measured search that stops unproven (its time limit) has its plan's unit challenged by the unit of the plan
# the floors alone choose (``pipeline.py``): the two take turns and the faster plan is kept. A search of
# YOLOX-Nano's 9,632 signatures stops after measuring a tenth of them and takes the rest at their floors, and
# its plan ran 9.4-9.7 ms where the floors' plan ran 8.2 (BENCHMARKS.md). Off: the measured plan as it is.
plan_challenge: bool = os.environ.get("KORCH_PLAN_CHALLENGE", "1") != "0"

# A process that loads a CPU unit or measures CPU kernels keeps the memory a call frees for the next call
# (korch/heap.py: glibc's mmap off, as ONNX Runtime keeps an arena): EfficientViT's unit 1.83 -> 1.04 s a call.
# Off: the heap as it is.
keep_freed_memory: bool = os.environ.get("KORCH_KEEP_FREED_MEMORY", "1") != "0"

# How a compiled unit stores the 4-D values a convolution reads between kernels (runtime/unit.py): "measured"
# (channels-last and NCHW both compiled for graphs with convolutions, the faster kept), "nchw" or
# "channels-last"; `--unit-boundaries` sets it for one command.
UNIT_BOUNDARIES = ("measured", "nchw", "channels-last")
unit_boundaries: str = os.environ.get("KORCH_UNIT_BOUNDARIES", "measured")

# Whether a compiled unit's convolutions run in ONNX Runtime's blocked layout, their values kept blocked between
# kernels (backends/nchwc.py): "measured" (compiled both ways where some convolution can, the faster kept),
# "always" or "never"; `--blocked-convolutions` sets it for one command.
BLOCKED_CONVOLUTIONS = ("measured", "always", "never")
blocked_convolutions: str = os.environ.get("KORCH_BLOCKED_CONVOLUTIONS", "measured")


def checked_choice(value: str, known: tuple[str, ...], what: str) -> str:
    """``value`` if it is one of ``known``, else a one-line error naming ``what`` it chooses."""
    if value not in known:
        raise KorchError(f"unknown {what} {value!r}; known: {', '.join(known)}")
    return value


def checked_unit_boundaries(value: str) -> str:
    """``value`` if it is one of ``UNIT_BOUNDARIES``, else a one-line error."""
    return checked_choice(value, UNIT_BOUNDARIES, "unit boundary layout")


def checked_blocked_convolutions(value: str) -> str:
    """``value`` if it is one of ``BLOCKED_CONVOLUTIONS``, else a one-line error."""
    return checked_choice(value, BLOCKED_CONVOLUTIONS, "blocked-convolutions choice")

# Whether a measured plan for a CPU chooses each value's layout with its kernels (orchestrate/layouts.py): every
# candidate that reads or writes a 4-D activation is measured channels-last too, and the compiled unit stores
# each value as planned; `--no-layouts` (or KORCH_LAYOUTS=0) plans contiguous values only.
layouts: bool = os.environ.get("KORCH_LAYOUTS", "1") != "0"

# How many times a CPU kernel is timed while other processes take the cores its threads need
# (backends/timing.py): a timing they disturbed is taken again after a pause, the fastest kept if none is quiet.
# 0: the load is not looked at, nothing flagged (the test suite: it loads both cores on purpose and asserts no
# latency, and a flag would depend on its neighbours).
quiet_tries: int = int(os.environ.get("KORCH_QUIET_TRIES", "3"))

# How float32 matrix products are computed on a GPU: "fp32" (exact) or "tf32" (tensor cores); see precision.py.
precision: str = os.environ.get("KORCH_PRECISION", "fp32")

# On a GPU, capture the launch sequence in a CUDA graph and replay it; a capture that fails is an error.
# Off (`--no-cuda-graph`), the executable runs its kernels one launch at a time.
cuda_graph: bool = os.environ.get("KORCH_CUDA_GRAPH", "1") != "0"

# Seed of every random input korch makes (checks, shape probes, benchmarks).
seed: int = int(os.environ.get("KORCH_SEED", "0"))


@contextlib.contextmanager
def patch(**values) -> Iterator[None]:
    """Set module-level values for the duration of a ``with`` block."""
    module = globals()
    unknown = [k for k in values if k not in module or k.startswith("_")]
    if unknown:
        raise AttributeError(f"unknown korch config value(s): {', '.join(unknown)}")
    saved = {k: module[k] for k in values}
    module.update(values)
    try:
        yield
    finally:
        module.update(saved)
