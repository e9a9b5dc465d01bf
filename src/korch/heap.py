"""The process heap CPU kernels run on: memory a call frees is kept for the next call, as ONNX Runtime keeps
its arena.

A compiled unit allocates its intermediate values on every call (ATen's CPU allocator, that is ``malloc``).
glibc serves a block over its mmap threshold (32 MiB at most) with a fresh ``mmap`` and returns it to the
system on ``free``: the next call faults in and zeroes every page again. EfficientViT's unit (values of
128 MiB) ran 1.83 s a call so and 1.04 s with mmap off; Segformer-B0's 185 ms and 139 ms; YOLOX-Nano's and
Candy's (values of a few MiB) within noise (``benchmarks/unit_loop.py``, 2-core AMD EPYC). Loading a unit
(``runtime/unit.py``) and measuring CPU kernels (``backends/measure.py``, its build workers too) call
``keep_freed_memory``, so that kernels are timed on the heap the unit runs on.

``keep_freed_memory`` turns glibc's mmap off for the calling process and raises its trim threshold to the
most ``mallopt`` takes (2 GiB): large blocks come from the heap and stay there once freed. The process keeps
its peak memory until it exits, as a process running ONNX Runtime does. ``config.keep_freed_memory``
(``KORCH_KEEP_FREED_MEMORY=0``) leaves the heap alone; so does a C library other than glibc. A thread other
than the main one allocates from an arena of its own, where blocks larger than an arena's 64 MiB still come
from ``mmap``.
"""

from __future__ import annotations

import ctypes
import functools
import platform

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1


_kept = False


@functools.cache
def _mallopt():
    """glibc's ``mallopt``, or None under another C library (``platform.libc_ver`` reads the interpreter's
    file: once per process)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """Have this process's heap keep what it frees (see the module docstring); whether it does."""
    global _kept
    from korch import config

    if _kept or not config.keep_freed_memory or _mallopt() is None:
        return _kept
    # mallopt returns 1 on success
    _kept = _mallopt()(_M_MMAP_MAX, 0) == 1 and _mallopt()(_M_TRIM_THRESHOLD, _INT_MAX) == 1
    return _kept


def release_freed_memory() -> bool:
    """Give the system back what this process's heap holds free (glibc's ``malloc_trim``); whether it could.
    A build worker calls it after each kernel it builds or checks and when it drops the kernels it timed: on a
    heap that keeps what it frees, a worker would otherwise hold its largest batch's memory to the end of the
    search (EfficientViT's, 10-12 GB each on a 24 GB host: killed for memory)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def given_back(result):
    """``result``, once the heap has given back what it holds free (``release_freed_memory``): a build worker's
    tracing, freezing and checking allocate a kernel's values several times over (48 of EfficientViT's kernels
    built and checked in one process peaked at 5.9 GB on a heap that keeps them, 0.85 GB given back after each)."""
    release_freed_memory()
    return result


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None under another C library."""
    if _mallopt() is None:
        return None
    trim = ctypes.CDLL(None).malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
