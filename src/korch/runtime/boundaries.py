"""Keeping a plan's kernels apart while Inductor compiles the whole plan as one unit, and storing the values
between them as the plan says (``unit.py`` compiles; this module owns the patches it compiles under).

``kernel_boundaries`` patches Inductor's graph lowering and scheduler for the duration of a compile: a value
whose reader belongs to another kernel is realized (stored), loops of two kernels never fuse, and a 4-D value
stored at a boundary is laid out channels-last where Inductor's layout optimisation wants it, or, for a plan
that chose its layouts (``orchestrate/layouts.py``), in the layout of the kernel that writes it. The kernels
are told apart by the annotations ``PlanModule`` puts on every operation it traces (``TAG``, ``LAYOUT``).

How a compile freezes and packs weights is ``backends/freezing.py``'s (kernels measured alone compile so too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from korch.ir.graph import CHANNELS_LAST, CONTIGUOUS

TAG = "korch_kernel"
LAYOUT = "korch_layout"  # the layout the plan stores a kernel's values in (orchestrate/layouts.py)
_CAT = torch.ops.aten.cat.default
_BMM = torch.ops.aten.bmm.default


def _kernel_of(fx_node: torch.fx.Node):
    return fx_node.meta.get("custom", {}).get(TAG)


def _planned_layout(fx_node: torch.fx.Node) -> str:
    return fx_node.meta.get("custom", {}).get(LAYOUT, CONTIGUOUS)


@contextlib.contextmanager
def kernel_boundaries(channels_last: bool = True, planned: bool = False) -> Iterator[None]:
    """While active, Inductor keeps planned kernels apart (see the module docstring); with ``channels_last``,
    a 4-D value stored at a boundary is laid out as Inductor's layout optimization wants it
    (``_lay_out_channels_last``). With ``planned`` each value is stored in the layout of the kernel that
    writes it instead (the plan chose them, ``orchestrate/layouts.py``); inside a kernel Inductor's rule
    applies as when the kernel was measured alone, and every operation of a channels-last kernel prefers
    channels-last."""
    from torch._inductor import ir
    from torch._inductor.graph import GraphLowering
    from torch._inductor.scheduler import Scheduler
    from torch.utils._ordered_set import OrderedSet

    run_node, can_fuse = GraphLowering.run_node, Scheduler._can_fuse_impl
    find_preferred = GraphLowering.find_nodes_prefer_channels_last

    def preferring_pixel_rows(self):
        # Inductor's rule: a convolution's inputs and outputs, and what they are computed from; korch's
        # pointwise convolutions are products over [N, H, W, C] views (torch_ops._pointwise_conv), and want
        # what they read, and what that is computed from, channels-last as much (else a copy per call). Of
        # these, realizing_run_node stores channels-last at a boundary only what a convolution reads.
        graph = self.module.graph
        self.korch_read_as_images = _read_as_images(graph, by_convolutions=True)
        return find_preferred(self) | _read_as_images(graph, by_convolutions=False)

    def in_channels_last_kernels(self):
        # Inductor's own rule inside each kernel, as when the kernel was measured alone; every operation of a
        # channels-last kernel prefers channels-last too
        return _preferred_within_kernels(self.module.graph) | OrderedSet(
            n for n in self.module.graph.nodes if _planned_layout(n) == CHANNELS_LAST)

    def realizing_run_node(self, n):
        kernel = _kernel_of(n)
        for source in n.all_input_nodes:
            if _kernel_of(source) != kernel:
                value = self.env.get(source)
                if isinstance(value, ir.TensorBox):
                    value.realize()
        if planned:
            return _stored_as_planned(n, run_node(self, n), kernel)
        # none without Inductor's layout optimisation (a graph without convolutions)
        images = getattr(self, "korch_read_as_images", ())
        if not (channels_last and n in images):
            return run_node(self, n)
        with _channels_last_concatenation() if n.target is _CAT and _of_wide_inputs(n) else contextlib.nullcontext():
            result = run_node(self, n)
        readers = [user for user in n.users if _kernel_of(user) != kernel]
        # laid out here, as the value is made, before any reader has seen its layout (a reader's view of it
        # bakes in the strides it had then); a value only channels-last concatenations read is left to them:
        # they store it into their own buffer, where a value laid out already would be copied
        if isinstance(result, ir.TensorBox) and readers and \
                not all(user.target is _CAT and user in images for user in readers):
            result.realize()
            _lay_out_channels_last(result)
        return result

    def kernels(snode) -> set:
        return {_kernel_of(origin) for s in snode.get_nodes() if s.node is not None
                for origin in s.node.get_origins()} - {None}

    def same_kernel_fuse(self, a, b, *args, **kwargs):
        if len(kernels(a) | kernels(b)) > 1:
            return False
        return can_fuse(self, a, b, *args, **kwargs)

    GraphLowering.run_node, Scheduler._can_fuse_impl = realizing_run_node, same_kernel_fuse
    if planned:
        GraphLowering.find_nodes_prefer_channels_last = in_channels_last_kernels
    elif channels_last:
        GraphLowering.find_nodes_prefer_channels_last = preferring_pixel_rows
    try:
        # the compilers' caches (Inductor's FX graph cache, AOTAutograd's) key nothing of these patches: a
        # graph compiled without them, or with the other boundary layout, must not answer for this one
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            yield
    finally:
        GraphLowering.run_node, Scheduler._can_fuse_impl = run_node, can_fuse
        GraphLowering.find_nodes_prefer_channels_last = find_preferred


def _preferred_within_kernels(graph: torch.fx.Graph):
    """Inductor's rule of which operations prefer channels-last (``find_nodes_prefer_channels_last``: a
    convolution, what it is computed from, what is computed from it), followed only within each planned
    kernel: what Inductor did when it compiled the kernel alone and korch measured it."""
    from torch._inductor.graph import is_mkldnn_conv
    from torch.utils._ordered_set import OrderedSet

    def convolution(n) -> bool:
        return n.target is torch.ops.aten.convolution.default or is_mkldnn_conv(n)

    preferred = OrderedSet()
    for n in reversed(graph.nodes):
        if convolution(n) or (n.target is not _BMM and
                              any(u in preferred and _kernel_of(u) == _kernel_of(n) for u in n.users)):
            preferred.add(n)
    for n in graph.nodes:
        if n in preferred:
            preferred.update(u for u in n.users if u.target is not _BMM and _kernel_of(u) == _kernel_of(n))
    return preferred


def _read_as_images(graph: torch.fx.Graph, by_convolutions: bool):
    """The operations whose values pointwise convolutions' products read as pixel rows, and, ``by_convolutions``,
    the convolutions and the operations whose values they read, in both cases directly or through other
    operations (not through a ``bmm``). With convolutions it is Inductor's first rule of which operations prefer
    channels-last, without its second, which also takes in everything computed from a convolution up to the
    last one: stored channels-last at a boundary, a value of that second kind which is not an image
    (EfficientViT's attention heads, [1, 16, 16384, 16]) was laid out with its heads as channels, and every
    ``bmm`` reading it copied it first (7% of EfficientViT's unit)."""
    from torch._inductor.graph import is_mkldnn_conv
    from torch.utils._ordered_set import OrderedSet

    mkldnn = torch.ops.mkldnn
    # oneDNN's convolutions as frozen graphs call them (is_mkldnn_conv knows only Inductor's fusion patterns)
    convolutions = (torch.ops.aten.convolution.default, mkldnn._convolution_pointwise.default,
                    mkldnn._convolution_pointwise.binary, mkldnn._convolution_pointwise_.binary,
                    mkldnn._convolution_transpose_pointwise.default)
    read = OrderedSet()
    for n in reversed(graph.nodes):
        if (by_convolutions and (n.target in convolutions or is_mkldnn_conv(n))) or (
                n.target is not _BMM and any(u in read or _reads_pixel_rows(u) for u in n.users)):
            read.add(n)
    return read


def _stored_as_planned(fx_node: torch.fx.Node, result, kernel):
    """``result``, a value another kernel reads stored in its kernel's planned layout (where its layout is not
    fixed yet: a library call's output keeps the layout the library gave it, which the kernel's measurement
    saw too)."""
    from torch._inductor import ir

    if not isinstance(result, ir.TensorBox) or not any(_kernel_of(user) != kernel for user in fx_node.users):
        return result
    result.realize()
    if _planned_layout(fx_node) == CHANNELS_LAST:
        _lay_out_channels_last(result)
    elif len(result.get_size()) == 4 and ir.is_storage_and_layout(result) and \
            isinstance(result.get_layout(), ir.FlexibleLayout):
        ir.as_storage_and_layout(result, freeze=True, want_contiguous=True)
    return result


def _reads_pixel_rows(fx_node: torch.fx.Node) -> bool:
    """Whether ``fx_node`` views a 4-D NCHW value as [N, H, W, C], as a pointwise convolution's product does, or
    copies it channels-last, as the products in MLAS and the depthwise convolutions' taps ask of their inputs
    (``ort_gemm.pointwise_conv_function``, ``torch_ops._depthwise_conv``)."""
    if fx_node.target is torch.ops.aten.clone.default:
        return fx_node.kwargs.get("memory_format") == torch.channels_last
    return fx_node.target is torch.ops.aten.permute.default and tuple(fx_node.args[1]) == (0, 2, 3, 1)


@contextlib.contextmanager
def _channels_last_concatenation() -> Iterator[None]:
    """While a concatenation a convolution reads is lowered, its buffer is channels-last: Inductor lays one out
    NCHW unless an input is channels-last already, and then copies it for the convolution."""
    from unittest import mock

    from torch._inductor import ir

    contiguous = ir.FlexibleLayout.contiguous_strides

    def strides(sizes):
        return ir.FlexibleLayout.stride_ordered_for_memory_format(sizes, torch.channels_last) \
            if len(sizes) == 4 else contiguous(sizes)

    with mock.patch.object(ir.FlexibleLayout, "contiguous_strides", staticmethod(strides)):
        yield


def _of_wide_inputs(concatenation: torch.fx.Node) -> bool:
    """Whether every input of a concatenation along the channels has at least a vector's worth of them (16
    float32 values, AVX-512). Stored channels-last, the concatenation's copy writes each input's channels of a
    pixel as one run; YOLOX-Nano's stem concatenates four stride-2 slices of 3 channels each, whose copies
    wrote every 12th float one at a time (290-560 us a call; NCHW, then copied for the convolution, about
    160 us)."""
    inputs = concatenation.args[0]
    return all(len(x.meta["val"].shape) == 4 and x.meta["val"].shape[1] >= 16 for x in inputs
               if "val" in x.meta)


def _lay_out_channels_last(value) -> None:
    """Store a 4-D value just realized at a kernel boundary channels-last, where Inductor's layout
    optimization would have (it stores a value a convolution reads, directly or through other operations,
    channels-last where it realizes the value itself): kept in its default NCHW layout, the value was copied
    to channels-last before every convolution that read it (a third of Segformer-B0's unit, its decoder's
    1024-channel concatenation). Only a layout not yet fixed is set: this never adds a copy. Not every
    network gains (Candy's instance normalizations reduce over H and W), so ``choose_unit`` measures."""
    from torch._inductor import ir

    if len(value.get_size()) != 4 or not ir.is_storage_and_layout(value) or \
            not isinstance(value.get_layout(), ir.FlexibleLayout):
        return
    order = ir.get_stride_order(ir.FlexibleLayout.stride_ordered_for_memory_format(value.get_size(),
                                                                                    torch.channels_last))
    ir.as_storage_and_layout(value, freeze=True, want_contiguous=False, stride_order=order)
