"""How korch's CPU compiles freeze a kernel's constants and pack its weights for the vendor libraries.

Inductor's ``freezing`` treats a graph's parameters and buffers as constants: it folds what is computed from
them alone, packs convolution and product weights once, at compile time, in the blocked layouts oneDNN wants
(``cpp.weight_prepack``), and joins an activation, a bias or a residual sum with the library call before it
(oneDNN's post-ops). A compiled unit (``runtime/unit.py``) compiles every kernel so; a kernel measured alone
(``inductor.py``) must compile so too, or its measured latency prices a kernel the unit never runs
(EfficientViT's roofline plan: its kernels measured alone summed 1351 ms, its unit ran 806-823 ms).

``frozen_compile`` is the configuration both compile under; ``as_buffers`` turns the constants ``make_fx``
binds into a traced graph (plain attributes, which freezing leaves alone) into the buffers it freezes;
``weight_packing`` makes ``cpp.weight_prepack`` mean what it says whatever the process compiled before;
``packed_as_ahead_of_time`` has a kernel's float32 products packed as the unit's ahead-of-time compile packs them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def frozen_compile(prepack: bool = True) -> Iterator[None]:
    """While active, Inductor compiles for inference with its constants frozen, its weights packed for oneDNN
    if and only if ``prepack`` (freezing only applies without grad)."""
    with weight_packing(prepack), packed_as_ahead_of_time(), torch.no_grad(), \
            torch._inductor.config.patch({"freezing": True, "cpp.weight_prepack": prepack}):
        yield


@contextlib.contextmanager
def packed_as_ahead_of_time() -> Iterator[None]:
    """While active, freezing packs a float32 product's weight as an ahead-of-time compile (a unit) does.

    Inductor packs it for MKL (``mkl._mkl_linear``) when it compiles a Python module, and for oneDNN
    (``mkldnn._linear_pointwise``) when it compiles ahead of time, since an MKL-packed weight cannot move
    (``V.aot_compilation`` decides, in ``mkldnn_fusion``). Only oneDNN's product takes an activation after it
    as a post-op, so a product and its GELU measured alone were MKL's product and an erf loop, where the unit
    runs one oneDNN call with the GELU in its epilogue; and on an AMD EPYC MKL's packed product runs at under
    half oneDNN's rate on the zoo's shapes (``benchmarks/results/gemm_paths_zen5_cpu.json``): every kernel with
    a product was priced for a library the unit never calls. The freeze runs as ahead of time, the rest of the
    compile as it was (a Python module)."""
    from torch._inductor import freezing
    from torch._inductor.virtualized import V

    freeze = freezing.freeze  # compile_fx imports it from the module at each compile

    def freeze_ahead_of_time(*args, **kwargs):
        with V.set_aot_compilation(True):
            return freeze(*args, **kwargs)

    freezing.freeze = freeze_ahead_of_time
    try:
        yield
    finally:
        freezing.freeze = freeze


def as_buffers(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``graph_module`` with every tensor it reads through ``get_attr`` registered as a buffer, in place."""
    targets = {node.target for node in graph_module.graph.nodes if node.op == "get_attr"}
    for target in targets - set(graph_module._buffers):
        value = getattr(graph_module, target)
        if isinstance(value, torch.Tensor):
            delattr(graph_module, target)
            graph_module.register_buffer(target, value)
    return graph_module


@contextlib.contextmanager
def weight_packing(prepack: bool) -> Iterator[None]:
    """While active, a frozen compile packs its weights for oneDNN if and only if ``prepack``.

    Inductor registers its weight-packing patterns on the first frozen compile of a process, and only if
    ``cpp.weight_prepack`` is set then; every later compile applies what was registered, whatever its own
    setting. So a process's first unit decided for all: ``choose_unit`` compiled "packed for oneDNN" first, and
    its "as given to ATen" units packed their convolutions too (YOLOX-Nano's, compiled alone in a fresh process,
    runs 12.7 ms with ATen's convolutions against 11.1 ms packed, so the label was wrong). Here the patterns
    are registered always, and left out of a compile that does not pack."""
    from torch._guards import tracing
    from torch._inductor.fx_passes import freezing_patterns, mkldnn_fusion
    from torch._inductor.pattern_matcher import PatternMatcherPass
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    with torch._inductor.config.patch({"cpp.weight_prepack": True}):
        freezing_patterns.lazy_init()  # once per process: all of Inductor's patterns, before any are left out
    register = getattr(mkldnn_fusion, "_mkldnn_weight_pack_init", None)  # absent without oneDNN
    if register is not None:  # lazy_init ran before, not packing
        with tracing(None), unset_fake_temporarily(), FakeTensorMode():  # as Inductor's lazy_init calls it
            register()
    passes = freezing_patterns.pass_patterns
    kept = list(passes)
    if not prepack:  # the packing patterns are mkldnn_fusion's (convolutions in pass 0, products in 1 and 2)
        passes[:] = [_without_handlers_of(p, mkldnn_fusion.__name__, PatternMatcherPass) for p in passes]
    try:
        yield
    finally:
        passes[:] = kept


def _without_handlers_of(patterns, module: str, new_pass):
    """A copy of the pattern pass ``patterns`` less the patterns whose handlers ``module`` defines."""
    kept = new_pass(pass_name=patterns.pass_name, subsystem=patterns.subsystem)
    for key, entries in patterns.patterns.items():
        entries = [e for e in entries if getattr(getattr(e, "handler", None), "__module__", None) != module]
        if entries:
            kept.patterns[key] = entries
    return kept
