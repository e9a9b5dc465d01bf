"""``korch optimize`` in one function: a model in, its optimal plan and checked executable out.

``optimize`` reads as the list of its stages, each timed under its name for
the report: import and fission, candidate kernels, partition, lower bounds,
measure and solve, build, check, write. Stages talk through plain data: the
primitive ``Graph``, the ``CandidateSet``, per-segment ``Problem``s, the
``Plan``, the built kernels and the assembled executable. The CLI and the
Python API (``korch.optimize``) both call it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import onnx

from korch import plan_challenge
from korch.errors import KorchError, one_line
from korch.ir import Graph
from korch.orchestrate.plan import Plan
from korch.orchestrate.segments import measurement_stats, solve_segments

COST_MODELS = ("roofline", "measured")
ZOO_PREFIX = "zoo:"


@dataclasses.dataclass
class Progress:
    """Callbacks for long work (all optional): stage names, segments solved, kernels measured and built."""

    on_stage: Callable[[str], None] | None = None
    on_segment: Callable[[int, int], None] | None = None
    on_kernel: Callable[[str], None] | None = None
    on_build: Callable[[int, int, object], None] | None = None


@dataclasses.dataclass
class Optimized:
    """What ``optimize`` made: the primitive graph and its plan, and, when an output directory was given and
    the target's device is here, the checked executable and its manifest."""

    graph: Graph
    plan: Plan
    stage_seconds: dict[str, float]
    candidates: int
    rejected: dict[str, int]
    reference: bytes                  # the model's ONNX bytes as given: what ONNX Runtime checks against
    executable: object | None = None  # runtime.executable.Executable
    manifest: dict | None = None
    challenger: Plan | None = None    # the floors' plan an unproven measured plan's unit is timed against


class CheckFailed(KorchError):
    """The executable does not match ONNX Runtime: the command fails, the report says by how much."""

    exit_code = 1


class _Stages:
    """Times each named stage of the pipeline."""

    def __init__(self, on_stage: Callable[[str], None] | None):
        self.seconds: dict[str, float] = {}
        self.on_stage = on_stage

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.on_stage:
            self.on_stage(name)
        start = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - start


def optimize(model, *, output: str | os.PathLike | None = None, target: str | None = None,
             cost: str = "measured", db: str | os.PathLike | None = None, jobs: int | None = None,
             input_shapes: Mapping[str, Sequence[int]] | None = None, time_limit: float | None = None,
             cut_points: str | None = None, max_kernel_nodes: int | None = None, plan_only: bool = False,
             compiled_unit: bool | None = None, progress: Progress | None = None,
             precision: str | None = None, cuda_graph: bool | None = None, tolerance: float | None = None,
             check_inputs: Mapping | None = None, input_values: Mapping | None = None,
             unit_boundaries: str | None = None, layouts: bool | None = None,
             measure_ahead: int | None = None, blocked_convolutions: str | None = None) -> Optimized:
    """The optimal plan of ``model`` (a path, ``zoo:NAME`` or a ModelProto) for ``target``, and with
    ``output`` its executable, built, checked against ONNX Runtime and written there.

    ``target``: default the GPU present, else the CPU. ``cost="roofline"`` prices every
    candidate at its lower bound; ``"measured"`` builds, checks and times the candidates an
    optimal plan could use (lazily), remembering them in the profile database ``db``.
    Without ``output`` nothing is built or written. Without the target's device (planning
    for a GPU on a CPU-only machine), or with ``plan_only``, only the plan and the reports
    are written. A mismatch with ONNX Runtime raises ``CheckFailed`` after the executable and the reports
    are written (its manifest says it failed: loading it then needs ``allow_unchecked``); the check runs on
    ``check_inputs`` (inputs not given are seeded random) within ``tolerance`` (default: the precision
    policy's; ``runtime/selfcheck.py``). ``input_values`` (input name -> value, broadcast to its shape):
    what shape probing and the check run on, for inputs that steer control flow. ``compiled_unit`` (default
    ``config.compiled_unit``): on a CPU, the executable is the whole plan compiled into one package
    (``runtime/unit.py``) where it can be. ``precision`` (default ``config.precision``): how a GPU computes
    float32 products, korch's kernels and the libraries alike (``korch/precision.py``). ``cuda_graph``
    (default ``config.cuda_graph``): a GPU executable replays a CUDA graph; a capture that fails is an error.
    ``unit_boundaries`` (default ``config.unit_boundaries``): how a compiled unit lays out the values a
    convolution reads between kernels, "measured", "nchw" or "channels-last" (``runtime/unit.py``); a plan
    that chose its values' layouts (``layouts``, default ``config.layouts``: measured plans for CPUs,
    ``orchestrate/layouts.py``) stores them as planned instead. ``blocked_convolutions`` (default
    ``config.blocked_convolutions``): whether the unit's convolutions run in ONNX Runtime's blocked layout,
    "measured", "always" or "never" (``backends/nchwc.py``). ``measure_ahead`` (default
    ``config.measure_ahead``): columns a round of the measured search may measure beside its plan's
    (``orchestrate/lazy.py``; 0: only what each round's plan selects).
    """
    from korch import config
    from korch import precision as policies
    from korch.cost import get_device

    policy = policies.get(precision or config.precision)
    target = target or detect_target()
    if policy.tf32 and get_device(target).name == "cpu":
        raise KorchError(f"--precision {policy.name} is for GPU targets: a CPU computes float32 products exactly")
    if tolerance is not None and not 0 < tolerance < 1:
        raise KorchError(f"--tolerance is a relative norm between 0 and 1, got {tolerance:g}")
    check = _Check(tolerance, dict(check_inputs) if check_inputs is not None else None, input_values)
    boundaries = config.checked_unit_boundaries(unit_boundaries or config.unit_boundaries)
    blocked = config.checked_blocked_convolutions(blocked_convolutions or config.blocked_convolutions)
    if measure_ahead is not None and measure_ahead < 0:
        raise KorchError(f"--measure-ahead is a number of candidate kernels, 0 or more, got {measure_ahead}")
    with policies.use(policy), config.patch(cuda_graph=config.cuda_graph if cuda_graph is None else cuda_graph,
                                            unit_boundaries=boundaries, blocked_convolutions=blocked,
                                            layouts=config.layouts if layouts is None else layouts,
                                            measure_ahead=config.measure_ahead if measure_ahead is None
                                            else measure_ahead):
        return _optimize(model, output=output, target=target, cost=cost, db=db, jobs=jobs, input_shapes=input_shapes,
                         time_limit=time_limit, cut_points=cut_points, max_kernel_nodes=max_kernel_nodes,
                         plan_only=plan_only, compiled_unit=compiled_unit, progress=progress, check=check)


@dataclasses.dataclass(frozen=True)
class _Check:
    """How the executable is checked against ONNX Runtime: within ``tolerance`` (None: the policy's), on
    ``inputs`` (None, or those not given: seeded random)."""

    tolerance: float | None = None
    inputs: dict | None = None
    values: Mapping | None = None  # --input-value: also for shape probing; check_inputs win where both give one


def _optimize(model, *, output, target: str, cost: str, db, jobs, input_shapes, time_limit, cut_points,
              max_kernel_nodes, plan_only: bool, compiled_unit: bool | None, progress: Progress | None,
              check: _Check) -> Optimized:
    from korch import config
    from korch.backends.registry import device_for
    from korch.cost import candidate_bounds
    from korch.orchestrate.partition import load_cut_points, partition, partition_at

    progress = progress or Progress()
    device = floor_device(target)  # an unknown target fails here, before any work
    if cost not in COST_MODELS:
        raise KorchError(f"unknown cost model {cost!r}; known: {', '.join(COST_MODELS)}")
    if time_limit is not None and time_limit <= 0:
        raise KorchError(f"time limit must be positive, got {time_limit}")
    present = device_present(target)
    if cost == "measured" and not present:
        raise KorchError(f"--target {target} needs its GPU to measure kernels, and none is present: "
                         "use --cost roofline to plan from lower bounds")
    cuts = load_cut_points(cut_points) if cut_points else None
    stage = _Stages(progress.on_stage)

    with stage("import and fission"):
        reference = model_bytes(model)
        imported, graph, _ = load_model(model, input_shapes, check.values)
        if imported.input_values:
            check = dataclasses.replace(check, inputs={**imported.input_values, **(check.inputs or {})},
                                        values=imported.input_values)
    with stage("candidate kernels"):
        candidates = candidate_kernels(graph, target, cost, max_kernel_nodes)
        layouts = chooses_layouts(target, cost)
    with stage("partition"):
        segments = partition_at(graph, candidates, cuts) if cuts else partition(
            graph, candidates, max_segment_nodes=config.max_segment_nodes)
    with stage("lower bounds"):
        bounds = candidate_bounds(graph, candidates.candidates, device)
    measurer = in_place = None
    if cost == "measured":
        from korch.backends.db import ProfileDB
        from korch.backends.measure import KernelMeasurer

        measurer = KernelMeasurer(graph, candidates.candidates, bounds, target=target,
                                  db=ProfileDB(str(db) if db else None), jobs=jobs, on_kernel=progress.on_kernel)
        in_place = _in_place_timer(measurer, graph, candidates.candidates, device)
    try:
        if measurer is not None and config.part_floors:
            with stage("products alone"):
                started = time.perf_counter()
                bounds = _bounds_with_parts(graph, candidates.candidates, device, measurer)
                if time_limit is not None:  # the limit is the search's, these measurements included
                    time_limit = max(time_limit - (time.perf_counter() - started), MIN_SEARCH_S)
        with stage("measure and solve" if measurer else "solve"):
            kernels, segment_reports, conversions = solve_segments(
                graph, candidates, segments, bounds, time_limit, progress.on_segment, measurer,
                conversion_cost=_conversion_cost(graph, device, measurer), in_place=in_place,
                measure_ahead=config.measure_ahead)
    finally:
        if measurer is not None:
            measurer.close()
    stats = {"primitive_nodes": len(graph.nodes), "candidates": len(candidates.candidates),
             "stage_seconds": dict(stage.seconds)}  # the planning stages
    if imported.rewrites:
        stats["rewrites"] = list(imported.rewrites)
    if measurer is not None:
        stats["measurement"] = measurement_stats(measurer) | {
            "solves": sum(r.solves for r in segment_reports), "proofs": sum(r.proofs for r in segment_reports),
            "solve_s": math.fsum(r.solve_s for r in segment_reports),
            "dominated": sum(r.dominated for r in segment_reports), "measure_ahead": config.measure_ahead}
        if in_place is not None:
            stats["measurement"]["in_place"] = {
                "sequences": in_place.sequences, "kernels_timed": in_place.timed, "seconds": in_place.seconds,
                "kernels_built": in_place.built, "build_s": in_place.build_s, "failure": in_place.failure,
                "from_database": in_place.from_database,
                "planned_kernels": sum(r.timed_in_place for r in segment_reports)}
            in_place.close()  # before the unit compiles: the kernels built here and their values are done with
        _warn_about_timings(stats["measurement"])
    if layouts:
        stats["layouts"] = "chosen"
    plan = Plan(model=graph.name, target=device.name, cost_model=cost, kernels=tuple(kernels),
                segments=tuple(segment_reports), stats=stats, conversions=tuple(conversions))
    result = Optimized(graph=graph, plan=plan, stage_seconds=stage.seconds, candidates=len(candidates.candidates),
                       rejected=dict(candidates.rejected), reference=reference)
    if output is None:
        return result
    unit_asked = config.compiled_unit if compiled_unit is None else compiled_unit
    if plan_challenge.wanted(cost, target, segment_reports) and present and unit_asked and not plan_only:
        with stage("the floors' plan"):
            result.challenger = plan_challenge.floors_plan(graph, target, device, max_kernel_nodes, cuts)
    if plan_only or not present:
        from korch.runtime.write import write_plan

        with stage("write"):
            write_plan(output, plan, reports(result, None))
        return result
    return _build_check_write(result, target, device_for(target), Path(output), stage, progress, unit_asked, check)


# Seconds a time-limited search keeps for its rounds however long its products took alone
MIN_SEARCH_S = 1.0


def _bounds_with_parts(graph, candidates, device, measurer) -> list[float]:
    """Every candidate's floor once each product and convolution has been measured alone, in every layout
    column (``cost/parts.py``): the measurer compares its kernels with these floors from then on."""
    from korch.cost import candidate_bounds, measured_parts
    from korch.cost.parts import PART_ROUNDS

    parts = measured_parts(graph, candidates, functools.partial(measurer.measure, rounds=PART_ROUNDS))
    bounds = candidate_bounds(graph, candidates, device, parts=parts)
    measurer.bounds = bounds
    return bounds


# How many last-level caches a candidate's values must exceed for ``auto`` to price kernels in place. On the AMD
# EPYC (34 MiB): Segformer-B0's largest candidates, 128 MiB, predicted 0.988 of the unit priced in place (0.67
# alone); YOLOv4's, 63 MiB, 1.193 in place against 1.03-1.14 alone (its convolutions' time hardly depends on where
# their values are); hf_segformer's, 32 MiB, 1.35 in place. BENCHMARKS.md, "costs measured in place".
IN_PLACE_CACHES = 2


def _in_place_timer(measurer, graph, candidates, device):
    """The timer that prices an optimum's kernels in sequence (``backends/in_place.py``), on a CPU (a GPU
    executable replays a CUDA graph, timed otherwise): always with ``KORCH_IN_PLACE=on``; by default (``auto``)
    where some candidate's values overflow the last-level cache ``IN_PLACE_CACHES`` times. Where they fit, a
    kernel alone on warm inputs runs as it does in the executable (YOLOX-Nano's, Candy's and the BERT layer's
    plans), and the sequence, Python calling each kernel, overstates small ones; where they overflow it far, a
    kernel runs faster alone than in the unit (Segformer-B0's 128 MiB candidates)."""
    from korch import config
    from korch.backends.in_place import InPlaceTimer, StoredPrices

    if measurer.device != "cpu" or config.in_place == "off":
        return None
    if config.in_place != "on" and not _overflows_cache(graph, candidates, IN_PLACE_CACHES * device.cache_bytes):
        return None
    return InPlaceTimer(measurer, StoredPrices(measurer))


def _overflows_cache(graph, candidates, cache_bytes: int) -> bool:
    """Whether some candidate reads and writes more bytes of values (not constants) than the cache holds."""
    def values(c) -> int:
        return sum(graph.tensors[t].nbytes for t in {*c.inputs, *c.outputs} if t not in graph.constants)
    return cache_bytes > 0 and any(values(c) > cache_bytes for c in candidates)


def _warn_about_timings(measurement: dict) -> None:
    """Say so when kernel timings found other processes on the cores however often they were taken, and when
    kernels ran faster than their floors: the search priced them at the floor, and a floor that does not hold
    weakens the proof of the plan's optimality."""
    from korch import config

    if measurement["disturbed"]:
        warnings.warn(f"{measurement['disturbed']} of {measurement['kernels_measured']} kernel timings found other "
                      f"processes on the CPU cores in each of {config.quiet_tries} tries: their latencies may read "
                      "slow, and the next search on this database measures them again", stacklevel=2)
    if measurement["below_bound"]:
        warnings.warn(f"{measurement['below_bound']} kernel latencies came out below their floors and were priced "
                      "at them: `korch db check` names the kernels and their floors", stacklevel=2)


def floor_device(target: str):
    """The device whose ceilings price ``target``'s floors under the run's precision policy: exact float32
    products (TF32 off) run at a GPU's FMA rate (``cost.get_device``)."""
    from korch import precision
    from korch.cost import get_device

    return get_device(target, exact_float32=not precision.current().tf32)


def candidate_kernels(graph, target: str, cost: str, max_kernel_nodes: int | None = None):
    """The search's candidate kernels of ``graph`` (a ``CandidateSet``): those the target's backends claim, each
    also with its layouts where the program chooses them (``chooses_layouts``)."""
    from korch import config
    from korch.backends.registry import BackendPredicate, backends_for
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.orchestrate.layouts import with_layouts

    candidates = enumerate_candidates(graph, max_nodes=max_kernel_nodes or config.max_kernel_nodes,
                                      predicate=BackendPredicate(backends_for(target)))
    return with_layouts(graph, candidates) if chooses_layouts(target, cost) else candidates


def chooses_layouts(target: str, cost: str) -> bool:
    """Whether the program chooses values' layouts (``orchestrate/layouts.py``): for measured plans on a CPU,
    where the compiled unit stores values as planned and measured kernels tell the layouts apart (floors do
    not); GPU executables read and write contiguous values so far."""
    from korch import config

    return config.layouts and target == "cpu" and cost == "measured"


def _conversion_cost(graph, device, measurer):
    """What a layout conversion costs the program: its floor, or its measured time where kernels are measured."""
    from korch.orchestrate.layouts import conversion_floor

    def cost(conversion) -> float:
        floor = conversion_floor(graph, conversion, device)
        if measurer is None:
            return floor
        return max(floor, measurer.conversion_s(graph.tensors[conversion.tensor], conversion.to))

    return cost


def _compile_unit(graph, plan, device: str) -> tuple[bytes | None, str, dict]:
    """The plan as one compiled unit (the faster of its variants, and what was measured), or None and why
    not (a unit that fails to compile is not fatal). Its own variants compile in workers where the plan is
    large enough (``unit_workers.start``)."""
    from korch.runtime import unit, unit_workers

    reason = unit.supports(graph, device)
    if reason:
        return None, reason, {}
    started = unit_workers.start(graph, plan, device)
    try:
        data, choice = unit.choose_unit(graph, plan, device, compiled=started.compiled() if started else None)
        return data, "", choice
    except Exception as exc:  # Inductor's failures are many: the kernel-by-kernel executable still runs
        return None, f"AOTInductor failed: {one_line(exc)}", {}
    finally:
        if started is not None:
            started.close()


def _build_check_write(result: Optimized, target: str, device: str, output: Path, stage: _Stages,
                       progress: Progress, compiled_unit: bool = True, how: _Check = _Check()) -> Optimized:
    from korch.runtime.assemble import assemble
    from korch.runtime.build import build_plan, recheck, unit_steps
    from korch.runtime.selfcheck import check_against_onnxruntime, raised
    from korch.runtime.write import write_executable

    graph, plan = result.graph, result.plan
    reference_model = onnx.load_from_string(result.reference)

    def checked(executable):
        try:
            return check_against_onnxruntime(executable, reference_model, how.inputs, tolerance=how.tolerance)
        except KorchError:
            raise
        except Exception as exc:  # an executable that raises fails its check: the steps after it apply, and the
            return raised(executable.output_names, exc)  # plan is written, not lost in a traceback

    def built_steps():
        with stage("build"):
            return build_plan(graph, plan, target, device, progress.on_build, check_kernels=False)

    unit, unit_note, unit_choice = None, "not asked for (kernel by kernel)", {}
    if compiled_unit:
        with stage("compile unit"):
            unit, unit_note, unit_choice = _compile_unit(graph, plan, device)
            if unit is not None and result.challenger is not None:  # the floors' plan, compiled as chosen here
                unit, plan = plan_challenge.challenged(result, unit_choice, unit, device)
    # the kernels are built one by one only where there is no unit or it fails its check: a unit runs none of them
    steps = built_steps() if unit is None else unit_steps(graph, plan, target, device)
    assembled = assemble(graph, plan, steps, target=target, device=device, reference_model=result.reference,
                         unit=unit, unit_note=unit_note, unit_choice=unit_choice)
    with stage("check"):
        check = checked(assembled.executable)
        if not check.ok and unit is not None:  # the unit is wrong: the kernels alone may be right
            steps = built_steps()
            assembled = assemble(graph, plan, steps, target=target, device=device,
                                 reference_model=result.reference, unit_note=f"the unit {check.summary()}")
            check = checked(assembled.executable)
        if not check.ok:  # find the kernels that are wrong, rebuild them with the next backend, check again
            if progress.on_stage:
                progress.on_stage("check each kernel against the reference executor")
            steps, rebuilt = recheck(assembled.steps, target, device)
            if rebuilt:
                assembled = assemble(graph, plan, steps, target=target, device=device,
                                     reference_model=result.reference, unit_note="kernels rebuilt after a check")
                check = checked(assembled.executable)
    assembled.manifest["check"] = check.to_json()
    if how.values:  # korch run feeds them where its user gives none (they may steer control flow)
        assembled.manifest["input_values"] = {name: value.tolist() for name, value in how.values.items()}
    assembled.executable.check = check
    with stage("write"):
        write_executable(output, assembled, reports(result, assembled.manifest))
    if not check.ok:
        raise CheckFailed(f"the executable in {output} {check.summary()}; see {output / 'report.md'}; it is kept, "
                          f"marked as failing its check: korch run {output} --allow-unchecked runs it")
    result.executable, result.manifest = assembled.executable, assembled.manifest
    return result


def reports(result: Optimized, manifest: dict | None) -> dict[str, bytes]:
    """report.md and report.html of a plan (and of its executable, given its manifest)."""
    from korch.report.html_page import render_html
    from korch.report.markdown import render_markdown

    return {"report.md": render_markdown(result.plan, result.rejected, manifest).encode(),
            "report.html": render_html(result.graph, result.plan, executable=manifest).encode()}


# -- the stages' inputs ------------------------------------------------------------------------------


def resolve_model(model: str | os.PathLike | onnx.ModelProto) -> str | Path | onnx.ModelProto:
    """``zoo:NAME`` -> the path of the exported zoo model; anything else unchanged."""
    if isinstance(model, str) and model.startswith(ZOO_PREFIX):
        from korch import zoo

        return zoo.export(model[len(ZOO_PREFIX):])
    return model


def load_model(model: str | os.PathLike | onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None,
               input_values: Mapping | None = None):
    """Import and fission: ``model`` -> (``ImportedModel``, primitive ``Graph``, ``FissionReport``); the one way
    the CLI, the API and the tests turn a model reference into primitives. Opaque operators warn."""
    from korch.fission import fission_with_report
    from korch.frontend import load_onnx

    imported = load_onnx(resolve_model(model), input_shapes, input_values)
    name = Path(model).stem if isinstance(model, (str, os.PathLike)) else None
    graph, report = fission_with_report(imported, name=name.removeprefix(ZOO_PREFIX) if name else None)
    report.warn()
    return imported, graph, report


def model_bytes(model) -> bytes:
    """The ONNX bytes of a model reference (path, ``zoo:NAME`` or ModelProto), as given."""
    resolved = resolve_model(model)
    if isinstance(resolved, onnx.ModelProto):
        return resolved.SerializeToString()
    try:
        return onnx.load(str(resolved)).SerializeToString()
    except FileNotFoundError:
        raise KorchError(f"no such model file: {resolved}") from None
    except Exception as exc:
        raise KorchError(f"cannot read {resolved} as an ONNX model: {type(exc).__name__}") from None


def detect_target() -> str:
    """The GPU present (its kind, when korch knows it), else the CPU."""
    import torch

    from korch.cost.devices import GPUS

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    return next((kind for kind in GPUS if kind in name), "h100")


def device_present(target: str) -> bool:
    import torch

    from korch.backends.registry import device_for

    return device_for(target) == "cpu" or torch.cuda.is_available()
