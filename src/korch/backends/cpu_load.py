"""How much of this machine's CPUs other processes took while a kernel was timed (Linux's ``/proc/stat``).

A CPU kernel runs on a team of threads that meet at barriers, so when another
process holds a core one of them needs, each call waits for a scheduler slice:
on the 2-core AMD EPYC, with two busy processes beside it, a 0.1 ms depthwise
convolution timed 40 ms. A measured search run beside other work (a test
suite, a second search) writes such timings into the profile database, where
they stay: a third of YOLOX-Nano's convolution kernels read 2-4 ms there
against 0.1-0.4 ms timed again on the quiet machine, and the program chose
its layouts from them. The timer (``timing.py``) opens a ``Window`` around
each timing and times again when ``disturbed`` says the others took cores
the kernel's threads needed.

The machine's busy time comes from ``/proc/stat`` (all cores, in clock
ticks; a virtual machine's stolen time counts as busy); this process's own
from ``time.process_time`` (all its threads). Where ``/proc/stat`` cannot be
read, nothing is known and no timing counts as disturbed.
"""

from __future__ import annotations

import os
import time

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
# Cores' worth of others' work a timing tolerates beyond the cores its threads leave free: a machine's own
# housekeeping (a fraction of a percent of a core here) must not count
TOLERATED_CORES = 0.25


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _busy_s() -> float | None:
    """Seconds all cores spent busy since boot (user, nice, system, irq, softirq, steal), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) * TICK_S


class Window:
    """A stretch of time from its creation: what other processes ran on the machine's cores during it."""

    def __init__(self):
        self._busy, self._own, self._start = _busy_s(), time.process_time(), time.perf_counter()
        self._cores = usable_cores()

    def others_cores(self) -> float | None:
        """Cores' worth of other processes' work since the window opened (None where unknown). Each core's
        busy time is counted in ticks, so a tick per core is given back for the rounding."""
        busy = _busy_s()
        wall = time.perf_counter() - self._start
        if busy is None or self._busy is None or wall <= 0:
            return None
        others = (busy - self._busy) - (time.process_time() - self._own) - self._cores * TICK_S
        return max(others, 0.0) / wall

    def disturbed(self, threads: int) -> bool:
        """Whether others took cores a kernel running on ``threads`` threads needed."""
        others = self.others_cores()
        spare = max(self._cores - threads, 0)
        return others is not None and others > spare + TOLERATED_CORES
