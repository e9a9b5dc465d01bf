"""Worker processes that die with the process that started them.

korch builds and compiles kernels in spawned worker processes (``backends/measure.py``,
``backends/triton/ahead.py``). A ``concurrent.futures`` pool cleans its workers up
when its owner exits normally, but not when the owner is killed (SIGKILL from a
scheduler, an out-of-memory killer or an impatient user): its workers, about
500 MB each, would go on compiling for minutes. ``pool`` makes every worker ask
Linux to kill it when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), and
exit at once if the parent is already gone. Elsewhere the workers live as a plain
pool's do.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import importlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """In a child process: be killed when the parent ``parent_pid`` dies (Linux); exit now if it has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _initialize(parent_pid: int, then: tuple[str, str, tuple] | None) -> None:
    die_with_parent(parent_pid)
    if then is not None:
        module, name, args = then
        getattr(importlib.import_module(module), name)(*args)


def _by_name(initializer: Callable[[], None] | None) -> tuple[str, str, tuple] | None:
    """``initializer`` (a module's function, or a partial of one with positional arguments) as (module, name,
    arguments): a worker unpickles its initializer's arguments before it runs any of it, and unpickling a function
    imports its module (torch with it: seconds, in which a worker whose parent was killed lived on), so the
    module is imported by ``_initialize``, once the worker is set to die with its parent."""
    if initializer is None:
        return None
    args: tuple = ()
    if isinstance(initializer, functools.partial):
        assert not initializer.keywords, "a worker's initializer takes positional arguments"
        initializer, args = initializer.func, initializer.args
    return initializer.__module__, initializer.__qualname__, args


def pool(jobs: int, initializer: Callable[[], None] | None = None) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of ``jobs`` spawned workers (fresh interpreters: no inherited CUDA context or Triton interpreter
    patches) that die with this process; ``initializer`` runs in each after that (``_by_name``)."""
    return concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_initialize,
                                                  initargs=(os.getpid(), _by_name(initializer)))
