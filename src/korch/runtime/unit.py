"""One compiled unit per executable: a whole plan compiled ahead of time by AOTInductor, kernel by kernel.

Calling each planned kernel from Python costs a Python call and a library
dispatch per kernel (tens of microseconds on a CPU), which the plan's costs do
not include. Here the plan becomes one torch module (``plan_module.py``: every planned kernel's
primitives, in plan order, each kernel's operations annotated with its index,
``torch.fx.traceback.annotate``), exported and compiled by AOTInductor into a
``.pt2`` package: one shared library whose C++ wrapper calls the kernels and
the vendor libraries (oneDNN, MKL through ATen) with no Python between them,
plus the weights. ``CompiledUnit`` (``unit_package.py``) opens it through the package loader,
without a compiler.

Inductor must compile the plan korch chose, not a plan of its own: while the
unit compiles, ``kernel_boundaries`` makes Inductor keep every kernel's
outputs in memory (it realizes a value where its reader belongs to another
kernel, as Inductor does at its own stream boundaries) and never fuse loops of
two kernels. Within a kernel Inductor fuses as it does when it builds that
kernel alone, so the unit runs what the plan priced.

The weights are frozen (Inductor's ``freezing``). How they reach the vendor
libraries is measured, not assumed: ``choose_unit`` compiles the unit in each
of ``VARIANTS`` and keeps the fastest: packed once, at compile time, in the
layouts oneDNN wants (its blocked convolution and GEMM weights; YOLOv4's
convolutions want it), left to ATen's MKL call, or with every float32 product
(by a constant weight, or of two activations as in attention) and every
softmax in ONNX Runtime's MLAS (``backends/ort_gemm.py``, C++ operators the
executable's directory carries as a library; on an AVX2 EPYC a BERT layer's
unit runs 12-13 ms this way against 16-19 ms through ATen), or with the
products by constant weights in MKL's packed GEMM, which the same library packs
when the unit first runs (an AVX-512 Xeon's ViT block: 11.1 ms against 12.5 in MLAS).
Two rewrites run fewer kernels than planned: freezing's own (a convolution and its activation into one oneDNN
call) may join a convolution with the pointwise kernel after it, and the MLAS variant computes products of one
activation by several weights (attention's projections) as one, where the first is planned.

With a ``SizeRange`` (``korch optimize --dynamic``) the module computes the
graph at the size of its inputs (``ir/sizes.py``) and is exported with that
dimension dynamic: one unit serves every size of the range.

Opaque primitives (they run in ONNX Runtime) and GPU targets (korch's Triton
kernels, CUDA graphs) keep the kernel-by-kernel executable.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import torch

from korch.backends import direct_conv, nchwc, ort_gemm, ort_steps
from korch.backends.freezing import frozen_compile
from korch.backends.inlining import raised_inline_limits
from korch.backends.torch_ops import is_pointwise_conv, narrow_conv_axis, runs_in_torch
from korch.backends.vector_exp import fast_vector_exp
from korch.errors import KorchError, one_line
from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.ir.sizes import SizeFunctions
from korch.orchestrate.plan import Plan
from korch.runtime.boundaries import kernel_boundaries
# the plan's module (unit.PlanModule, unit.mlas_kernels, ... as before it had a module of its own)
from korch.runtime.plan_module import (PlanModule, example_inputs, library_conv_kernels,  # noqa: F401
                                       mlas_kernels, ort_primitives)
from korch.runtime.unit_package import UNIT_FILE, CompiledUnit  # noqa: F401 (unit.CompiledUnit)

# a unit's boundaries where the plan chose each value's layout; its 1x1 convolutions where it chose each kernel's form
PLANNED = "as planned"

@dataclasses.dataclass(frozen=True)
class Variant:
    """How a unit's frozen weights reach the vendor libraries: ``prepack``, packed at compile time in
    oneDNN's layouts (else ATen's calls take them as they are); ``ort_kernels``, products and softmaxes run
    in ONNX Runtime's MLAS (``backends/ort_gemm.py``): ``ort_within`` "all" of them, "planned" only in the
    kernels the plan measured so (the MLAS backend's; elsewhere as Inductor's kernels were measured, packed for
    oneDNN: the unit that runs each kernel the way its plan priced it), "activations" only products of two
    activations and softmaxes (attention's; the weights' products by the other libraries);
    ``mkl_products``, with ``ort_kernels``: the products by constant weights run in MKL's packed GEMM instead
    (``ort_gemm.mkl_product_function``; Inductor packs for MKL only in process, so a unit never did);
    ``channels_last_boundaries``, values a convolution reads are stored channels-last between kernels
    (``kernel_boundaries``); ``pointwise_products``, 1x1 convolutions are products over the channels and
    depthwise ones over channels-last values their taps' sums, those of few output channels convolve their taps
    folded into channels (``torch_ops._pointwise_conv``, ``_depthwise_conv``, ``_narrow_conv``) but in the kernels the plan measured with the library's (``library_conv_kernels``),
    else the library's everywhere; ``nchwc``, convolutions in ONNX Runtime's blocked layout, their values kept
    blocked between kernels (``backends/nchwc.py``); ``direct_convolutions``, convolutions of images of few
    channels computed directly, with their bias and activation (``backends/direct_conv.py``)."""

    prepack: bool
    ort_kernels: bool = False
    ort_within: str = "all"
    mkl_products: bool = False
    channels_last_boundaries: bool = True  # see kernel_boundaries
    planned_layouts: bool = False  # each kernel's values stored in the plan's layout instead (kernel_boundaries)
    pointwise_products: bool = True  # see torch_ops._pointwise_conv
    nchwc: bool = False
    direct_convolutions: bool = False


# the variants choose_unit compiles and times
MKL_PACKED = "packed for MKL, the rest in MLAS"
VARIANTS = {"packed for oneDNN": Variant(prepack=True), "as given to ATen": Variant(prepack=False),
            "MLAS by ONNX Runtime": Variant(prepack=True, ort_kernels=True),
            "MLAS where planned": Variant(prepack=True, ort_kernels=True, ort_within="planned"),
            MKL_PACKED: Variant(prepack=True, ort_kernels=True, mkl_products=True)}
CHOICE_ROUNDS = 3
# a choice's key: where a unit whose weights' products run in oneDNN or ATen computes attention's
ACTIVATIONS = "products of activations"
# a choice's key: whether the convolutions run in ONNX Runtime's blocked layout ("yes"/"no", backends/nchwc.py)
BLOCKED_CONVOLUTIONS = "blocked convolutions"
# a choice's key: whether the convolutions of images of few channels run directly ("yes"/"no", backends/direct_conv.py)
DIRECT_CONVOLUTIONS = "direct first convolutions"
# the ONNX Runtime variant's name until its softmaxes and products of activations (2026-11-24)
_EARLIER_ORT_VARIANT = "GEMMs by ONNX Runtime"


def supports(graph: Graph, device: str) -> str | None:
    """None when ``graph`` can run as one compiled unit on ``device``, else why not."""
    if device != "cpu":
        return "compiled units are built for CPUs (GPU executables replay CUDA graphs of korch's kernels)"
    opaque = next((node for node in graph.nodes if not runs_in_torch(node)), None)
    if opaque is not None:
        return f"an opaque primitive ({opaque.name}) runs in ONNX Runtime"
    return None


@dataclasses.dataclass(frozen=True)
class SizeRange:
    """A unit serving every size from ``low`` to ``high`` of the dimension ``sizes`` follows (the plan's graph
    is at ``high``)."""

    sizes: SizeFunctions
    low: int
    high: int

    def dynamic_shapes(self, graph: Graph):
        """``torch.export``'s spec: the dimension's axes of each input as one ``Dim``, or None where the range
        holds one size. A range of several sizes starts at 2 or above (export specialises 0 and 1)."""
        if self.low == self.high:
            return None
        if self.low < 2:
            raise ValueError(f"korch bug: a dynamic unit's range starts at {self.low}")
        dim = torch.export.Dim(re.sub(r"\W", "_", self.sizes.dim), min=self.low, max=self.high)
        return (tuple({axis: dim for axis in self.sizes.input_axes.get(name, ())} or None for name in graph.inputs),)


def compile_unit(graph: Graph, plan: Plan, device: str = "cpu", variant: Variant = VARIANTS["packed for oneDNN"],
                 size_range: SizeRange | None = None) -> bytes:
    """The plan compiled into one AOTInductor package (the bytes of ``model.pt2``), its weights as ``variant``
    says; with ``size_range``, one that serves the range's sizes."""
    reason = supports(graph, device)
    if reason:
        raise KorchError(f"no compiled unit: {reason}")
    dynamic = size_range.dynamic_shapes(graph) if size_range else None
    module = plan_module(graph, plan, device, variant, size_range.sizes if dynamic else None)
    inputs = example_inputs(graph, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations inside export and AOTInductor
        with torch.inference_mode(False), torch.no_grad(), torch.fx.traceback.preserve_node_meta():
            exported = torch.export.export(module, inputs, dynamic_shapes=dynamic)
        # freezing: the weights are constants, so Inductor packs them once, at compile time, in the layout
        # oneDNN wants (blocked convolution weights), instead of on every call; it only applies without grad.
        # force_mmap_weights: the loader maps the weights where the package aligned them; by default it copies
        # them into one malloc'd block, whose alignment follows malloc's history (a ViT block's unit with
        # ATen's GEMMs: 20-21 ms mapped; 21-25 ms copied; 29.5 ms when malloc maps every large block itself)
        with tempfile.TemporaryDirectory(prefix="korch-unit-") as tmp, \
                kernel_boundaries(variant.channels_last_boundaries, variant.planned_layouts), \
                frozen_compile(variant.prepack), fast_vector_exp(), raised_inline_limits(), \
                torch._inductor.config.patch({"aot_inductor.force_mmap_weights": True,
                                              # Inductor lays values out channels-last only where a oneDNN
                                              # convolution is left (GraphLowering.decide_layout_opt): YOLOX-Nano's
                                              # unit with its stem direct stored them NCHW, 10.9 against 9.6 ms
                                              "force_layout_optimization": variant.direct_convolutions}):
            path = torch._inductor.aoti_compile_and_package(exported, package_path=os.path.join(tmp, UNIT_FILE))
            return Path(path).read_bytes()


def plan_module(graph: Graph, plan: Plan, device: str, variant: Variant, sizes=None) -> PlanModule:
    """The module a unit of ``variant`` compiles. With planned layouts each kernel computes as it was measured,
    in its own layout: channels-last boundaries made every kernel's depthwise convolutions taps, ConvNeXt's
    7x7 ones of NCHW-planned kernels 3.5x their oneDNN time, which the plan had priced."""
    return PlanModule(graph, plan, device, variant.ort_kernels, sizes,
                      variant.channels_last_boundaries and not variant.planned_layouts, variant.pointwise_products,
                      variant.ort_within, variant.mkl_products, variant.nchwc, variant.direct_convolutions).eval()


def own_variants(graph: Graph, plan: Plan) -> dict[str, Variant]:
    """The variants ``choose_unit`` compiles first, by name, as the run's configuration and the plan set them."""
    from korch import config

    boundaries = config.checked_unit_boundaries(config.unit_boundaries)
    planned = plan.stats.get("layouts") == "chosen"  # orchestrate/layouts.py
    return {name: dataclasses.replace(variant, channels_last_boundaries=boundaries != "nchw", planned_layouts=planned)
            for name, variant in VARIANTS.items() if _compiles_a_unit_of_its_own(variant, graph, plan)}


def choose_unit(graph: Graph, plan: Plan, device: str = "cpu", size_range: SizeRange | None = None,
                compiled: Mapping[str, Callable[[], bytes]] | None = None) -> tuple[bytes, dict]:
    """The fastest of the plan's units over ``VARIANTS``, and what was measured: the variants take turns
    (``CHOICE_ROUNDS`` rounds; each one's fastest call, ``_fastest_seconds``). A variant that fails to compile
    is left out; if all fail, the first failure is raised. A fastest unit without MLAS is compiled again with
    attention's products and softmaxes in MLAS (``ort_within="activations"``), and the two take turns; so is the
    fastest unit without MLAS where an all-MLAS one is fastest and it is close (``_attention_base``). A graph with
    convolutions then has the fastest also compiled with NCHW values between its kernels, and the two take turns
    again; ``config.unit_boundaries`` ("nchw", "channels-last") instead fixes that layout for every variant, and a
    plan that chose each value's layout (``plan.stats["layouts"] == "chosen"``) has every variant store them as
    planned. A graph with 1x1 convolutions then has the fastest compiled with the library's convolutions for all
    of them instead of products (but where the plan measured the library's), and the two take turns. A graph
    with a convolution of an image of few channels (``direct_conv.eligible``) has the fastest compiled with it
    computed directly (``Variant.direct_convolutions``), and the two take turns. A graph
    with convolutions ONNX Runtime's blocked layout takes (``nchwc.eligible``) last has the fastest compiled with
    them so, its values blocked between them (``Variant.nchwc``; its first convolution ONNX Runtime's too, not a
    direct one), and the two take turns (``config.blocked_convolutions`` "always" keeps it untimed, "never"
    compiles none).
    ``compiled[name]()``: an own variant's package compiled elsewhere (``unit_workers``)."""
    from korch import config

    boundaries = config.checked_unit_boundaries(config.unit_boundaries)
    convolutions = any(node.op in (Op.CONV, Op.CONV_TRANSPOSE) for node in graph.nodes)
    built: dict[str, _Built] = {}
    errors: dict[str, Exception] = {}

    def add(name: str, variant: Variant) -> None:
        try:
            data = compiled[name]() if name in (compiled or {}) else \
                compile_unit(graph, plan, device, variant, size_range)
            built[name] = _Built(data, CompiledUnit.from_bytes(data), variant)
        except Exception as exc:  # Inductor's failures are many: the other variant may compile
            errors[name] = exc

    def challenge(best: str, name: str, change: dict, label: str, base: str | None = None) -> bool:
        """Compile ``base`` (default ``best``) changed as ``change`` (as ``name``); it and ``best`` take turns;
        whether it is faster."""
        add(name, dataclasses.replace(built[base or best].variant, **change))
        if name not in built:
            return False
        again = _fastest_seconds({n: built[n].unit for n in (best, name)}, inputs, device)
        seconds.update({f"{best}, {label}": again[best], name: again[name]})
        return again[name] < again[best]

    planned = plan.stats.get("layouts") == "chosen"  # orchestrate/layouts.py
    for name, variant in own_variants(graph, plan).items():
        add(name, variant)
    if not built:
        raise next(iter(errors.values()), KorchError("no compiled unit: no variant applies to this graph"))
    inputs = example_inputs(graph, device)
    seconds = _fastest_seconds({name: b.unit for name, b in built.items()}, inputs, device)
    best = min(seconds, key=seconds.get) if seconds else next(iter(built))
    choice = {"weights": best}
    base = _attention_base(built, seconds, best) if ort_gemm.of_activations(graph) else None
    if base is not None:
        by_mlas, label = f"{base}, {ACTIVATIONS} in MLAS", "again"
        if base == best:  # the best itself, recorded with attention where it runs
            choice[ACTIVATIONS], label = "ATen", f"{ACTIVATIONS} in ATen"
        if challenge(best, by_mlas, {"ort_kernels": True, "ort_within": "activations"}, label, base):
            best, choice["weights"], choice[ACTIVATIONS] = by_mlas, base, "MLAS"
    if planned:
        choice["boundaries"] = PLANNED
    elif convolutions:
        choice["boundaries"] = "NCHW" if boundaries == "nchw" else "channels-last"
    if convolutions and boundaries == "measured" and not planned:
        nchw = f"{best}, NCHW between kernels"
        if challenge(best, nchw, {"channels_last_boundaries": False}, "channels-last between kernels"):
            best, choice["boundaries"] = nchw, "NCHW"
    if any(is_pointwise_conv(graph, node) or narrow_conv_axis(graph, node) is not None for node in graph.nodes):
        as_planned = bool(library_conv_kernels(plan))
        choice["pointwise convolutions"] = PLANNED if as_planned else "products"
        by_library = f"{best}, pointwise convolutions by the library"
        label = f"pointwise convolutions {PLANNED if as_planned else 'as products'}"
        if challenge(best, by_library, {"pointwise_products": False}, label):
            best, choice["pointwise convolutions"] = by_library, "library"
    if any(direct_conv.eligible(graph, node) for node in graph.nodes):
        choice[DIRECT_CONVOLUTIONS] = "no"
        direct = f"{best}, {DIRECT_CONVOLUTIONS}"
        if challenge(best, direct, {"direct_convolutions": True}, f"no {DIRECT_CONVOLUTIONS}"):
            best, choice[DIRECT_CONVOLUTIONS] = direct, "yes"
    blocking = config.checked_blocked_convolutions(config.blocked_convolutions)
    if blocking != "never" and any(nchwc.eligible(graph, node) for node in graph.nodes):
        choice[BLOCKED_CONVOLUTIONS] = "no"
        blocked = f"{best.removesuffix(f', {DIRECT_CONVOLUTIONS}')}, {BLOCKED_CONVOLUTIONS}"
        # a blocked unit's first convolution is ONNX Runtime's too, writing blocked values: a direct one wrote
        # channels-last values each reader converted (hf_resnet's unit 18% slower in turns)
        change = {"nchwc": True, "direct_convolutions": False}
        if blocking == "always":
            add(blocked, dataclasses.replace(built[best].variant, **change))
            kept = blocked in built
        else:
            kept = challenge(best, blocked, change, f"no {BLOCKED_CONVOLUTIONS}")
        if kept:
            best, choice[BLOCKED_CONVOLUTIONS] = blocked, "yes"
            if choice.get(DIRECT_CONVOLUTIONS) == "yes":
                choice[DIRECT_CONVOLUTIONS] = "no"
    choice["variant"] = best  # what the unit runs: the weights' variant as the challenges above changed it
    choice["measured_ms"] = {n: float(f"{s * 1e3:.4g}") for n, s in seconds.items()}
    if errors:  # recorded, so that a variant that never compiles is seen (the manifest, report.md)
        choice["failed"] = {n: one_line(e, 200) for n, e in errors.items()}
    if _calls_korch_ort(built[best].variant):
        choice["libraries"] = [ort_gemm.LIBRARY_FILE]
    return built[best].data, choice


def challenge_plan(graph: Graph, data: bytes, choice: dict, challenger: Plan, device: str = "cpu") \
        -> tuple[bytes | None, dict[str, float]]:
    """The ``challenger`` plan's unit compiled as ``choice`` (a ``choose_unit`` choice) chose for the unit
    ``data``; the two take turns (``_fastest_seconds``). The challenger's unit where it is the faster (``choice``
    then saying how it stores values), else None, and each one's fastest call ("plan", "challenger",
    milliseconds)."""
    variant, unplanned = chosen_variant(choice), challenger.stats.get("layouts") != "chosen"
    if variant.planned_layouts and unplanned:  # a plan without layouts: values channels-last between kernels
        variant = dataclasses.replace(variant, planned_layouts=False, channels_last_boundaries=True)
    theirs = compile_unit(graph, challenger, device, variant)
    units = {"plan": CompiledUnit.from_bytes(data), "challenger": CompiledUnit.from_bytes(theirs)}
    seconds = _fastest_seconds(units, example_inputs(graph, device), device)
    measured = {name: float(f"{s * 1e3:.4g}") for name, s in seconds.items()}
    if seconds["challenger"] >= seconds["plan"]:
        return None, measured
    if choice.get("boundaries") == PLANNED and unplanned:  # the manifest says what the kept unit does
        choice["boundaries"] = "channels-last"
    return theirs, measured


# an all-MLAS unit is challenged by oneDNN's (or ATen's) weights with attention in MLAS where that unit is within
# this factor of it: the ViT block's two read 6.94 and 6.91 ms at build, and the MLAS unit ran 7.1-7.8 ms a call
# where oneDNN's with attention in MLAS ran 6.6
ATTENTION_CHALLENGE_WITHIN = 1.15


def _attention_base(built: dict, seconds: dict[str, float], best: str) -> str | None:
    """The unit whose weights' products run in oneDNN or ATen to compile again with attention in MLAS: the
    fastest, or, where an all-MLAS unit is fastest, the fastest other one within ``ATTENTION_CHALLENGE_WITHIN``
    of it; None if there is none."""
    if not built[best].variant.ort_kernels:
        return best
    others = [n for n in built if not built[n].variant.ort_kernels and n in seconds]
    base = min(others, key=seconds.get, default=None)
    return base if base is not None and seconds[base] <= ATTENTION_CHALLENGE_WITHIN * seconds[best] else None


def _compiles_a_unit_of_its_own(variant: Variant, graph: Graph, plan: Plan) -> bool:
    """Whether ``variant`` gives ``plan`` a unit the other variants do not: an MLAS variant only where ONNX
    Runtime has something to run, "MLAS where planned" only where the plan measured some, not all, of it with
    MLAS (else it is "packed for oneDNN" or "MLAS by ONNX Runtime" again, and compiling it costs EfficientViT
    minutes)."""
    if not variant.ort_kernels:
        return True
    if not ort_gemm.any_eligible(graph):
        return False
    if variant.mkl_products:
        return ort_gemm.mkl_packed_faster(graph)
    if variant.ort_within != "planned":
        return True
    within = mlas_kernels(plan)
    return bool(within) and _ort_replaced(graph, plan, within) != _ort_replaced(graph, plan, None)


def _ort_replaced(graph: Graph, plan: Plan, within: frozenset[str] | None) -> set[str]:
    """The primitives a unit's MLAS steps compute or leave out (``ort_steps.replacements``), of those ``within``
    if given."""
    kernels = [k.nodes for k in plan.kernels]
    return set(ort_steps.replacements(graph, kernels, 0, lambda name, value: name, within))


class _Built(NamedTuple):
    """A compiled unit of ``choose_unit``: its package, loaded, and the variant it was compiled as."""

    data: bytes
    unit: CompiledUnit
    variant: Variant


def chosen_variant(choice: dict) -> Variant:
    """The variant a ``choose_unit`` choice (a manifest's ``unit``) names."""
    by_mlas = {"ort_kernels": True, "ort_within": "activations"} if choice.get(ACTIVATIONS) == "MLAS" else {}
    return dataclasses.replace(VARIANTS[choice["weights"]], **by_mlas,
                               channels_last_boundaries=choice.get("boundaries") != "NCHW",
                               planned_layouts=choice.get("boundaries") == PLANNED,
                               pointwise_products=choice.get("pointwise convolutions") != "library",
                               nchwc=choice.get(BLOCKED_CONVOLUTIONS) == "yes",
                               direct_convolutions=choice.get(DIRECT_CONVOLUTIONS) == "yes")


def _calls_korch_ort(variant: Variant) -> bool:
    """Whether a unit of ``variant`` calls korch's operators (``ort_gemm_op.cpp``), so carries their library."""
    return variant.ort_kernels or variant.nchwc or variant.direct_convolutions


def _fastest_seconds(units: dict, inputs, device: str) -> dict[str, float]:
    """Each unit's fastest call, the units taking turns (``CHOICE_ROUNDS`` rounds of turns of 0.3 s). A shared
    host only ever slows a call down: three copies of one YOLOX-Nano unit, 8 trials, differed by 10% on average
    (17% at most) by the median of the rounds' medians, by 2.8% (5.9%) by their fastest calls; Segformer-B0's
    6.9% (9.8%) and 4.3% (8.6%). The median let noise choose Segformer-B0's slower boundary layout."""
    from korch.backends.timing import take_turns, time_kernel

    def timing(name: str, round_: int):
        return time_kernel(lambda i: units[name](*inputs), device=device, budget_s=0.3, min_repeats=1,
                           warmup=1 if round_ == 0 else 0, warmup_s=0.0)

    with torch.inference_mode():
        timings = take_turns(list(units), timing, CHOICE_ROUNDS if len(units) > 1 else 0)
    return {name: min(t.min_s for t in ts) for name, ts in timings.items() if ts}


def library_files(choice: dict) -> dict[str, bytes]:
    """The operator library a unit ``choose_unit`` chose calls (korch_ort's, the only one), by its file name."""
    return {name: ort_gemm.library().read_bytes() for name in choice.get("libraries", ())}


def unit_manifest(device: str = "cpu") -> dict:
    """What a unit was built for: a unit runs only with the same torch and CPU instruction set."""
    return {"file": UNIT_FILE, "compiler": "AOTInductor", "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "device": device}


def check_compatible(recorded: dict, where: str) -> None:
    """A one-line error when the unit ``recorded`` in a manifest cannot run here (see ``unit_manifest``)."""
    here = unit_manifest(recorded.get("device", "cpu"))
    for key, what in (("torch", "torch"), ("cpu_capability", "CPU instruction set")):
        if recorded.get(key) != here[key]:
            raise KorchError(f"{where}: its compiled unit was built for {what} {recorded.get(key)}, this machine "
                             f"has {here[key]}: run korch optimize again here")
    calls_ort = recorded.get("weights") == _EARLIER_ORT_VARIANT or (
        recorded.get("weights") in VARIANTS and _calls_korch_ort(chosen_variant(recorded)))
    if calls_ort and not recorded.get("libraries"):
        # units of korch before 2026-11-24 called a Python operator (korch::ort_matmul) that is gone
        raise KorchError(f"{where}: its compiled unit calls an ONNX Runtime GEMM operator of an earlier korch: "
                         "run korch optimize again")
