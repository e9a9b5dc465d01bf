"""How korch's CPU threads share the cores with ONNX Runtime's: torch's OpenMP threads spin briefly.

GNU OpenMP (torch's CPU threads) keeps its workers spinning after each
parallel region, by default for 300,000 rounds (milliseconds). A compiled unit
that calls ONNX Runtime's GEMMs (``backends/ort_gemm.py``) runs MLAS's threads
right after Inductor's loops, and spinning OpenMP workers hold the cores MLAS
needs; not spinning at all (``OMP_WAIT_POLICY=PASSIVE``) makes every parallel
region wake its workers, which costs convolution networks of many small loops.
Measured on two cores (``benchmarks/openmp_spin.py``,
``benchmarks/results/openmp_spin_cpu.json``; libgomp's default / 10,000 rounds
/ passive): a BERT layer's unit with ONNX Runtime GEMMs 27.1 / 17.5 / 15.1 ms,
a ViT block's 47.3 / 30.7 / 25.9 ms, YOLOX-Nano's (no GEMMs for ONNX Runtime,
120 small loops) 33.2 / 28.6 / 35.6 ms: ``SPIN_COUNT`` rounds is the
compromise.

OpenMP reads its settings once, when torch is imported, so ``korch`` asks for
``GOMP_SPINCOUNT=SPIN_COUNT`` as its first act (unless the user set either
variable), which works when korch is imported before torch.
``openmp_yields`` says whether OpenMP's workers leave the cores quickly in
this process.
"""

from __future__ import annotations

import os
import sys

SPIN_COUNT = 10_000
_POLICY, _SPIN = "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"
_YIELDS: bool | None = None


def settle() -> bool:
    """Ask for briefly spinning OpenMP workers if torch is not loaded yet; whether they are (see
    ``openmp_yields``). Called once, by ``korch/__init__.py``."""
    global _YIELDS
    if "torch" not in sys.modules and _POLICY not in os.environ:
        os.environ.setdefault(_SPIN, str(SPIN_COUNT))
    _YIELDS = _yields(os.environ)
    return _YIELDS


def _yields(env) -> bool:
    policy = env.get(_POLICY, "").strip().upper()
    if policy in ("PASSIVE", "ACTIVE"):
        return policy == "PASSIVE"
    try:
        return int(env.get(_SPIN, "")) <= SPIN_COUNT
    except ValueError:
        return False


def openmp_yields() -> bool:
    """Whether torch's OpenMP workers stop spinning within ``SPIN_COUNT`` rounds in this process."""
    return _YIELDS if _YIELDS is not None else _yields(os.environ)


def describe() -> str:
    """The OpenMP waiting in this process, for benchmark records."""
    policy = os.environ.get(_POLICY)
    if policy:
        return f"{_POLICY}={policy}"
    return f"{_SPIN}={os.environ.get(_SPIN, 'default')}"


def why_spinning() -> str:
    return (f"torch's OpenMP workers spin for milliseconds in this process ({_SPIN} above {SPIN_COUNT} when torch "
            f"was imported): import korch before torch, or set {_SPIN}={SPIN_COUNT}")
