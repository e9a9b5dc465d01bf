"""How long torch's OpenMP workers spin between parallel loops: ``GOMP_SPINCOUNT=SPIN_COUNT``.

GNU OpenMP (torch's CPU threads) keeps its workers spinning after each
parallel region, by default for 300,000 rounds (milliseconds), so that the
next loop starts at once; a worker that has gone to sleep must be woken, which
costs the convolution networks' many small loops. Spinning that long holds the
cores after the executable returns, from whatever runs next in the process
(ONNX Runtime, when a benchmark takes turns). Measured on two cores
(``benchmarks/openmp_spin.py``, ``benchmarks/results/openmp_spin_cpu.json``;
libgomp's default / 10,000 rounds / 1,000 rounds / passive): YOLOX-Nano's unit
(120 small loops) 15.8 / 15.8 / 17.2 / 20.0 ms; the BERT layer's and ViT
block's units, whose GEMMs run in ONNX Runtime's MLAS on torch's own threads
(``backends/ort_gemm.py``), within 4% of each other under every setting.
``SPIN_COUNT`` rounds keeps what the default gives and returns the cores
within a fraction of a millisecond.

OpenMP reads its settings once, when torch is imported, so ``korch`` asks for
``GOMP_SPINCOUNT=SPIN_COUNT`` as its first act (unless the user set either
variable), which works when korch is imported before torch.
"""

from __future__ import annotations

import os
import sys

SPIN_COUNT = 10_000
_POLICY, _SPIN = "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"


def settle() -> None:
    """Ask for ``SPIN_COUNT`` rounds of spinning if torch is not loaded yet and the user chose no policy.
    Called once, by ``korch/__init__.py``."""
    if "torch" not in sys.modules and _POLICY not in os.environ:
        os.environ.setdefault(_SPIN, str(SPIN_COUNT))


def describe() -> str:
    """The OpenMP waiting in this process, for benchmark records."""
    policy = os.environ.get(_POLICY)
    if policy:
        return f"{_POLICY}={policy}"
    return f"{_SPIN}={os.environ.get(_SPIN, 'default')}"
