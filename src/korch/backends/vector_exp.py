"""Which ``exp`` Inductor's CPU vector code computes float32 exponentials with, in korch's compiles.

Inductor writes ``x.exp()`` (Sleef's ``expf``, within 1 ULP) for every vectorised exponential, sigmoid
included. ATen's ``Vectorized<float>::exp_u20`` (a degree-5 polynomial, within 20 ULP, what Inductor's own
flex attention uses) computes a SiLU over 692k floats in 112 us where Sleef's takes 189 us (2 threads,
AVX-512), and YOLOX-Nano's unit, 123 SiLUs, ran 5-10% faster with it in every one of 8 turns. Its error
(3e-7 relative on SiLU) is far below any tolerance korch checks against.

``fast_vector_exp`` has korch's compiles use it, with IEEE semantics kept where it departs from them:

* NaN: ``exp_u20`` clamps its input first, and the clamp turns NaN into the largest finite input (``inf``
  out); the result is blended back to the NaN.
* results under 2^-125 (2.4e-38, inputs under about -86.6) come out 0: an absolute error below 2.4e-38.
* float64 and other dtypes keep ``exp()``.

The compilers' caches key nothing of a patch to code generation, so the context also installs a post-grad
pass that does nothing but name the choice (``uuid``): a kernel compiled with Sleef's exp never answers for
one compiled with this, nor the other way round.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

# what the cache key says of this module's code generation; change it with the code below
CODEGEN = "korch-vector-exp-u20-nan-1"


def _is_float32(x) -> bool:
    return getattr(x, "dtype", None) is torch.float32


def exp_u20(x: str) -> str:
    """C++ of ``exp`` of the float32 vector expression ``x`` by ``exp_u20``, NaN kept NaN."""
    return f"decltype({x})::blendv(({x}).exp_u20(), ({x}), ({x}).isnan())"


@functools.cache
def _names_the_codegen():
    """A post-grad pass that changes nothing: its ``uuid`` puts ``CODEGEN`` in the FX graph cache's key (made on
    first use: importing Inductor takes a second, which ``korch.load`` does not spend)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class NamesTheCodegen(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            pass

        def uuid(self) -> str:
            return CODEGEN

    return NamesTheCodegen()


@contextlib.contextmanager
def fast_vector_exp() -> Iterator[None]:
    """While active, Inductor's CPU vector code computes float32 ``exp`` and ``sigmoid`` with ``exp_u20``."""
    from torch._inductor.codegen.cpp import CppVecOverrides

    exp, sigmoid = CppVecOverrides.exp, CppVecOverrides.sigmoid

    def fast_exp(x):
        return exp_u20(x) if _is_float32(x) else exp(x)

    def fast_sigmoid(x):
        if not _is_float32(x):
            return sigmoid(x)
        return f"decltype({x})(1)/(decltype({x})(1) + {exp_u20(f'{x}.neg()')})"

    CppVecOverrides.exp, CppVecOverrides.sigmoid = staticmethod(fast_exp), staticmethod(fast_sigmoid)
    try:
        with torch._inductor.config.patch(post_grad_custom_post_pass=_names_the_codegen()):
            yield
    finally:
        CppVecOverrides.exp, CppVecOverrides.sigmoid = staticmethod(exp), staticmethod(sigmoid)
