"""GCC's inliner limits, raised for the translation units that hold many of Inductor's CPU kernels.

GCC stops inlining within a translation unit once the unit has grown by ``inline-unit-growth`` (40%) beyond
``large-unit-insns`` (10,000 instructions). An AOTInductor unit puts every loop of a plan in one file
(YOLOX-Nano's: 52 parallel loops, 7,086 lines) and ``cpp_batch`` many candidates in one library, so their loops
call ATen's vector helpers instead of inlining them: the 16x16 transpose a channels-last conversion goes
through (``transpose_block``, with a ``memset`` of its scratch tile each call) and ``exp_u20``. A 3-channel
416x416 image converted channels-last took 300 us in a batch library and 47 us compiled alone (2 threads, Zen 5),
and YOLOX-Nano's unit ran 5% faster with the limits raised (``BENCHMARKS.md``). A kernel Inductor compiles alone
is far below the limits: its command, and so its cache key, is left as it is.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator

FLAGS = ("--param=inline-unit-growth=1000", "--param=large-unit-insns=1000000")


def _is_gcc(compiler: str) -> bool:
    from torch._inductor.cpp_builder import _is_gcc

    return _is_gcc(compiler)


def with_raised_limits(command: str) -> str:
    """A compiler command line with GCC's inliner limits raised (as given for another compiler)."""
    words = shlex.split(command)
    if not words or not _is_gcc(words[0]) or any(flag in words for flag in FLAGS):
        return command
    return shlex.join([words[0], *FLAGS, *words[1:]])


@contextlib.contextmanager
def raised_inline_limits() -> Iterator[None]:
    """While active, Inductor's optimised C++ compiles by GCC (not its -O1 wrappers) raise the inliner limits."""
    from torch._inductor import cpp_builder

    original = cpp_builder._get_optimization_cflags

    def raised(cpp_compiler: str, min_optimize: bool = False):
        cflags, ldflags = original(cpp_compiler, min_optimize)
        if not min_optimize and _is_gcc(cpp_compiler):
            cflags = [*cflags, *(flag[1:] for flag in FLAGS)]  # Inductor writes each cflag after a "-"
        return cflags, ldflags

    cpp_builder._get_optimization_cflags = raised
    try:
        yield
    finally:
        cpp_builder._get_optimization_cflags = original
