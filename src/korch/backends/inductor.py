"""The Inductor backend: a candidate's primitives as a torch function compiled by TorchInductor.

On CPUs Inductor writes C++/OpenMP loops, so it is korch's fused-kernel
generator for ``--target cpu``; on GPUs it writes Triton, a second opinion next
to korch's own generator (the faster correct kernel wins). The function is
traced to an FX graph (``make_fx``, on fake tensors) and handed to ``compile_fx`` directly:
no dynamo, so thousands of kernels compile in one process without hitting its
recompilation limits. Inductor may split a candidate into several kernels;
``launches`` records how many it produced (fused kernels plus library calls).

On a GPU the compiled function takes the output buffers as extra arguments and
writes them (``out.copy_(result)``, which Inductor fuses into the kernel that
computes the result), so an executable's planned buffers are written in place.
On a CPU it is compiled as the compiled unit compiles it (``freezing.py``: its
constants frozen, its weights packed for oneDNN, an activation or a bias after a
convolution or product as the library's post-op), and returns its outputs,
each in its planned layout: there the
executable is one compiled unit, where a kernel's output is whatever buffer
computes it, and a copy into a buffer passed in cannot fuse into a library
call (a convolution), so every kernel ending in one would be timed with a pass
over its output the unit never makes (YOLOX-Nano's roofline plan: its
kernels summed 24.4 ms that way, 16.5 ms returning their outputs).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence

import torch

from korch.backends import kernel_store
from korch.backends.base import BuildError, stored_as
from korch.backends.check import random_inputs
from korch.backends.freezing import as_buffers, frozen_compile
from korch.backends.torch_ops import is_depthwise_conv, is_pointwise_conv, kernel_function, narrow_conv_axis
from korch.backends.vector_exp import fast_vector_exp
from korch.errors import one_line
from korch.ir import dtypes
from korch.ir.analysis import node_flops
from korch.ir.graph import CHANNELS_LAST, Graph
from korch.ir.ops import Op

VERSION = "13"  # 3: CPU kernels return their outputs; 4: their float32 exp is ATen's exp_u20 (vector_exp.py);
# 5: CPU kernels timed on warm inputs (timing.timing_inputs); 6: activations and biased products as torch's ops
# (torch_ops.rewritten_steps); 7: CPU kernels compiled frozen, weights packed for oneDNN (freezing.py); 8: 1-D
# convolutions as 2-D ones (torch_ops._conv1d_as_2d); 9: kernels with channels-last boundaries compute
# depthwise convolutions as their taps' sum (torch_ops._depthwise_conv) and 1x1 ones over channels-last rows,
# and inductor-libconv builds such depthwise convolutions by the library; 10: kernels compiled in batches inline
# ATen's vector helpers (inlining.py); 11: float32 products packed for oneDNN as in a unit, an activation after
# one its post-op (freezing.packed_as_ahead_of_time); 12: convolutions of few output channels with one axis's
# taps folded into channels (torch_ops._narrow_conv), and inductor-libconv builds them by the library; 13: a
# kernel built afresh called as one loaded from the store (kernel_store.direct_call)

# The least work (FLOPs: two a multiply-add) of a 1x1 convolution, and of a depthwise one over channels-last values,
# the library-convolution backend builds a kernel for: below it oneDNN's set-up decides, and korch's form (a
# product, the taps' sum) was the faster of the two in every kernel measured. Zen 4, 2 threads (2026-11-30): of
# YOLOX-Nano's 1994 kernels the library's convolutions were built for, 1377 hold none of this size, and korch's
# form won in all but one (0.999 of it); where one is this size, the library won 23 of Segformer-B0's 31 kernels
# with a 1x1 convolution of 2^30 FLOPs, and 30 of its 59 with depthwise ones of 2^22-2^25 (the smallest, 2^22:
# 2 of 14; Zen 5: 512 channels at 32x32, 2^23.2, by the library, 1024 at 16x16, 2^22.2, as taps). Every kernel
# of YOLOv4 (610), Segformer-B0 (90) and EfficientViT (250) the library's convolutions were built for holds one.
LIBRARY_POINTWISE_MIN_FLOPS = 1 << 24
LIBRARY_DEPTHWISE_MIN_FLOPS = 1 << 22
_KERNEL_DEFINITIONS = re.compile(r"async_compile\.(cpp_pybinding|cpp|triton)\(")
_LIBRARY_CALLS = re.compile(r"\b(extern_kernels\.\w+|torch\.ops\.\w+\.\w+(?:\.\w+)?)\(")


def count_launches(code: str) -> int:
    """Kernels one call of Inductor's output ``code`` launches: its generated kernels plus library calls."""
    generated = len(_KERNEL_DEFINITIONS.findall(code))
    body = code.split("def call(", 1)[-1]
    return generated + len(_LIBRARY_CALLS.findall(body.split("def benchmark_compiled_module", 1)[0]))


def _returning_outputs(fn, layouts: Sequence[str]):
    """``fn`` returning each output stored in its layout, and never a view of an input: a kernel-by-kernel
    executable's next kernel may overwrite that input's buffer while the output lives."""
    from torch.multiprocessing.reductions import StorageWeakRef  # compares fake tensors' storages too

    def run(*args):
        results = []
        for value, layout in zip(fn(*args), layouts):
            value = stored_as(value, layout)
            if any(StorageWeakRef(value.untyped_storage()) == StorageWeakRef(x.untyped_storage()) for x in args):
                value = value.clone()  # keeps the layout stored_as gave it
            results.append(value)
        return results
    return run


def _writing_outputs(fn, inputs: int):
    """``fn(*inputs) -> outputs`` as ``g(*inputs, *outputs)`` writing its results into the given outputs."""
    def write(*args):
        for buffer, value in zip(args[inputs:], fn(*args[:inputs])):
            buffer.copy_(value)
        return []
    return write


@contextlib.contextmanager
def _cacheable(examples: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Fake copies of ``examples`` (static shapes), in a tracing context whose fake mode has a shape environment:
    Inductor's FX graph cache keeps only graphs compiled so (without it bypasses the cache: "No shape env").
    Cached, a kernel another process built (a build worker) loads in 10 ms instead of being lowered again
    (0.3 s on a CPU)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = [fake_mode.from_tensor(x, static_shapes=True) for x in examples]
    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
        yield fakes


class InductorKernel:
    backend = "inductor"
    pointwise_products = True  # kernel_function's choice for a product of a 1x1 convolution
    token: int | None = None  # a number the kernel's code names that each build draws afresh (mlas.py)

    def __init__(self, kernel: Graph, device: str, function=None):
        """``kernel`` compiled for ``device``; ``function`` computes it (``kernel_function``'s by default). Each
        input and output is stored in its tensor's layout (``stored_as``), and must be passed so. A CPU kernel
        computed by its backend's function (``_function``) is kept in korch's kernel store and loaded from it
        when built again."""
        self._outputs = [kernel.tensors[name] for name in kernel.outputs]
        self._input_layouts = [kernel.tensors[name].layout for name in kernel.inputs]
        self.device = device
        self.in_place = device != "cpu"  # writes out= buffers on a GPU; returns its outputs on a CPU
        if self.in_place or function is not None or not kernel_store.enabled():
            self._compile(kernel, function)
            return
        stored = kernel_store.key(kernel, self.backend, VERSION)
        kept = kernel_store.load(stored, self.token)
        if kept:
            self.fn, self.source, self.launches = kept
            return
        modules = kernel_store.modules_loaded()
        with kernel_store.recorded_packs() as packed:
            self._compile(kernel, None)
        module = kernel_store.new_module(modules)
        # called as a later build loads it, so that its timings do not depend on what the caches held
        if module is not None and kernel_store.save(stored, module, self.source, self.launches, packed, self.token):
            self.fn = kernel_store.direct_call(module)

    def _compile(self, kernel: Graph, function) -> None:
        from torch._inductor.compile_fx import compile_fx
        from torch._inductor.utils import run_and_get_code
        from torch.fx.experimental.proxy_tensor import make_fx

        device = self.device
        examples = [stored_as(x.to(device), kernel.tensors[name].layout)
                    for x, name in zip(random_inputs(kernel), kernel.inputs)]
        examples += self._allocate() if self.in_place else []
        try:
            function = function or self._function(kernel)
            traced = _writing_outputs(function, len(kernel.inputs)) if self.in_place else \
                _returning_outputs(function, [t.layout for t in self._outputs])
            # traced on fake tensors: nothing computed (a Candy kernel: 11 ms against 66 ms traced on real ones);
            # the weights, real, become the graph's constants as they would
            graph_module = make_fx(traced, tracing_mode="fake", _allow_non_fake_inputs=True)(*examples)
            # on a CPU, compiled as the unit compiles it (freezing.py): its constants frozen, its weights packed
            frozen = contextlib.nullcontext() if self.in_place else frozen_compile()
            if not self.in_place:
                as_buffers(graph_module)
            # compiled, not run: a build worker compiles its kernels' C++ together before any runs (cpp_batch.py)
            with _cacheable(examples) as fakes, fast_vector_exp(), frozen:
                self.fn, codes = run_and_get_code(compile_fx, graph_module, fakes)
        except Exception as exc:  # Inductor's failures are many and varied; the kernel is dropped, not the run
            raise BuildError(f"{self.backend}: {one_line(exc)}") from exc
        self.source = "\n".join(codes)
        self.launches = sum(count_launches(code) for code in codes)

    def _function(self, kernel: Graph):
        """The torch function this backend compiles for ``kernel``."""
        return kernel_function(kernel, self.device, pointwise_products=self.pointwise_products)

    def _allocate(self) -> list[torch.Tensor]:
        return [stored_as(torch.empty(t.shape, dtype=dtypes.torch_dtype(t.dtype), device=self.device), t.layout)
                for t in self._outputs]

    def __call__(self, *inputs: torch.Tensor, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        if not self.in_place:
            # a kernel-by-kernel CPU executable passes the library's views as they are (a slice of a larger
            # value): the compiled code asserts the strides it was compiled for
            results = list(self.fn(*(stored_as(x, layout) for x, layout in zip(inputs, self._input_layouts))))
            for buffer, value in zip(out or (), results):
                buffer.copy_(value)
            return list(out) if out is not None else results
        results = list(out) if out is not None else self._allocate()
        self.fn(*inputs, *results)
        return results


class InductorBackend:
    name = "inductor"

    @property
    def version(self) -> str:
        return f"{VERSION}+torch{torch.__version__}"

    def supports_device(self, device: str) -> bool:
        return device == "cpu" or device.startswith("cuda")

    def claims(self, kernel: Graph) -> str | None:
        if any(node.op is Op.OPAQUE for node in kernel.nodes):
            return f"{self.name}: opaque primitive"
        return None

    def build(self, kernel: Graph, device: str) -> InductorKernel:
        return InductorKernel(kernel, device)


class LibraryConvKernel(InductorKernel):
    backend = "inductor-libconv"
    pointwise_products = False


class LibraryConvBackend(InductorBackend):
    """Inductor on a CPU with a kernel's 1x1 convolutions, and its depthwise ones over channels-last values, as the
    library's convolutions (oneDNN's, weights packed, an activation after one as its post-op), where the Inductor
    backend computes them as products and as their taps (``torch_ops._pointwise_conv``, ``_depthwise_conv``):
    which is faster depends on the convolution (korch's forms skip oneDNN's set-up of 15-25 us a call, which
    decides small ones; packed weights decide large ones), so both are measured where a convolution is large
    enough for the library's to win (``LIBRARY_POINTWISE_MIN_FLOPS``, ``LIBRARY_DEPTHWISE_MIN_FLOPS``), and
    wherever a convolution of few output channels has its taps folded into channels (``_narrow_conv``), the
    faster priced, and a compiled unit computes each kernel's as its plan measured it (``runtime/unit.py``).
    EfficientViT's unit: 973 ms with every 1x1 convolution by the library, 1838 ms as products; YOLOX-Nano's:
    11.4 and 9.9 ms."""

    name = LibraryConvKernel.backend

    def supports_device(self, device: str) -> bool:
        return device == "cpu"

    def claims(self, kernel: Graph) -> str | None:
        if reason := super().claims(kernel):
            return reason
        channels_last = CHANNELS_LAST in kernel.boundary_layouts()

        def large(node, min_flops: int) -> bool:
            return node_flops(kernel, node) >= min_flops

        if not any((is_pointwise_conv(kernel, node) and large(node, LIBRARY_POINTWISE_MIN_FLOPS))
                   or (channels_last and is_depthwise_conv(kernel, node) and large(node, LIBRARY_DEPTHWISE_MIN_FLOPS))
                   or narrow_conv_axis(kernel, node) is not None for node in kernel.nodes):
            return (f"{self.name}: no 1x1 convolution of {LIBRARY_POINTWISE_MIN_FLOPS} FLOPs or more, nor a "
                    f"depthwise one of {LIBRARY_DEPTHWISE_MIN_FLOPS} over channels-last values, nor one of few "
                    "output channels")
        return None

    def build(self, kernel: Graph, device: str) -> LibraryConvKernel:
        return LibraryConvKernel(kernel, device)
