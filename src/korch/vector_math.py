"""torch's vectorized CPU math, started on one thread before korch runs an operation eagerly on two.

torch 2.13's float32 ``erf`` and ``tanh``, called for the first time in a process on a few thousand values
(enough for torch to split them between its threads), returned wrong values in one thread's share: ``erf``
gave 1.0 for erf(2.595), off by 2.4e-4, in 4 of 12 fresh processes here, ``tanh`` was off by 5e-5 in 1 of 12;
the second call was exact. Called first on 16 values (one thread), every later call was exact in 24 of 24
processes, ``tanh`` too after an ``erf``. ``start`` makes those first calls, once per process, when the
interpreter (``ir/interpret.py``, the reference every kernel is checked against) is imported, as the backends
and ``korch.load`` import it. A compiled unit's loops are Inductor's own code and were never affected.
"""

from __future__ import annotations

import functools

# torch's functions with a vectorized CPU kernel that the interpreter and the library backend call
_FUNCTIONS = ("erf", "erfc", "tanh", "exp", "expm1", "log", "log1p", "sigmoid", "sin", "cos", "sqrt", "rsqrt")


@functools.cache
def start() -> None:
    """Run each of ``_FUNCTIONS`` once on 16 float32 values, on the calling thread alone."""
    import torch

    values = torch.linspace(0.5, 1.5, 16)
    for name in _FUNCTIONS:
        getattr(torch, name)(values)
