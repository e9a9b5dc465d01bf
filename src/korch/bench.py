"""``korch bench``: korch's executable and the systems a user would otherwise pick, timed side by side.

Every system runs in this process on the same inputs, is warmed up, and is
timed by the kernel timer (``backends.timing.time_kernel``: median of many
runs, CUDA events on a GPU), the systems taking turns over several rounds so
that a slow spell of a shared machine is not charged to one of them. The peers:

* ``eager``: the model in PyTorch, as written;
* ``eager-cuda-graph`` (GPU): the eager model captured in a CUDA graph and replayed, as korch's executable is;
* ``compile``: ``torch.compile`` of it (TorchInductor, default mode);
* ``compile-reduce-overhead``: ``torch.compile(mode="reduce-overhead")`` (CUDA graphs on a GPU);
* ``compile-max-autotune``: ``torch.compile(mode="max-autotune")``;
* ``ort``: ONNX Runtime on the ONNX model, all graph optimizations on; its CPU provider only, so on a GPU it
  is labelled "CPU provider" and its time includes copying the inputs to the host.

All of them run under the executable's precision policy (``korch/precision.py``): the same float32 products.

The PyTorch peers need the model as a torch module: a zoo model's own module,
the module given to the Python API, else (a plain ONNX file) the original ONNX
graph converted to torch by ``onnx2torch``, which the table marks
``(onnx2torch)``, taught the operator versions of opsets 18 to 20 it lacks
(``onnx2torch_opsets.py``). A model ``onnx2torch`` cannot convert has no PyTorch
peers: they are listed as failed with its reason, never replaced by korch's own
primitives (no user runs those).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from korch import precision
from korch.errors import KorchError, one_line

PEERS = ("eager", "eager-cuda-graph", "compile", "compile-reduce-overhead", "compile-max-autotune", "ort")
# torch.compile's mode per peer (None: its default)
COMPILE_MODES = {"compile": None, "compile-reduce-overhead": "reduce-overhead", "compile-max-autotune": "max-autotune"}
BUDGET_S = 2.0
MIN_RUNS = 10
ROUNDS = 5


@dataclasses.dataclass(frozen=True)
class SystemTiming:
    name: str
    median_s: float
    min_s: float
    runs: int
    note: str = ""


@dataclasses.dataclass
class BenchResult:
    model: str
    target: str
    device: str
    korch: SystemTiming
    peers: list[SystemTiming]
    failed: dict[str, str]
    versions: dict[str, str]
    precision: str = "fp32"   # the policy korch and every peer ran under (korch/precision.py)
    cost_model: str = ""      # the plan's: its predicted latency is a floor (roofline) or the objective (measured)
    predicted_s: float | None = None
    date: str = dataclasses.field(default_factory=lambda: datetime.date.today().isoformat())

    def to_json(self) -> dict:
        return {"model": self.model, "target": self.target, "device": self.device, "date": self.date,
                "precision": self.precision, "cost_model": self.cost_model, "predicted_s": self.predicted_s,
                "versions": self.versions, "korch": dataclasses.asdict(self.korch),
                "peers": [dataclasses.asdict(p) for p in self.peers], "failed": self.failed,
                "speedup": {p.name: p.median_s / self.korch.median_s for p in self.peers}}

    def ratios(self) -> dict:
        """For report.html: {"korch_s": s, "peers": {name: s}}."""
        return {"korch_s": self.korch.median_s, "peers": {p.name: p.median_s for p in self.peers}}


def parse_peers(spec: str) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise KorchError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    return names


def device_description(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    from korch.cost.probe import cpu_model

    from korch import threads

    return f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads ({threads.describe()})"


def torch_module_for(model, reference_model: bytes, device: str) -> tuple[torch.nn.Module, str]:
    """The model as a torch module on ``device``: its own module where korch has it, else the ONNX graph
    converted by onnx2torch (``KorchError`` when it cannot be)."""
    if isinstance(model, torch.nn.Module):
        return model.to(device).eval(), ""
    if isinstance(model, str) and model.startswith("zoo:"):
        from korch import zoo

        module, _ = zoo.build(model.removeprefix("zoo:"))
        return module.to(device).eval(), ""
    import onnx

    convert = _onnx2torch_convert()
    try:
        module = convert(onnx.load_from_string(reference_model))
    except Exception as exc:  # an operator or opset onnx2torch does not know
        raise KorchError(f"onnx2torch cannot convert the model: {one_line(exc)}") from None
    return module.to(device).eval(), "(onnx2torch)"


def _onnx2torch_convert():
    """``onnx2torch.convert``. onnx2torch imports torchvision for its NMS and RoIAlign converters only; where
    torchvision is missing or broken (its CUDA wheels do not load with the CPU torch), those two converters
    get a stand-in that fails when a model uses them, and every other operator converts."""
    import importlib
    import types

    try:
        import onnx2torch

        return _with_newer_opsets(onnx2torch.convert)
    except ModuleNotFoundError as exc:
        if exc.name == "onnx2torch":
            raise KorchError("the PyTorch peers of an ONNX file need onnx2torch: pip install --no-deps onnx2torch")
    except Exception:  # a torchvision that is installed but does not load
        pass
    for name in [m for m in sys.modules if m == "onnx2torch" or m.startswith("onnx2torch.")
                 or m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]

    def missing(*args, **kwargs):
        raise KorchError("this model needs torchvision (NMS or RoIAlign), which does not load here")

    ops = types.ModuleType("torchvision.ops")
    ops.nms = ops.roi_align = ops.box_convert = missing
    stand_in = types.ModuleType("torchvision")
    stand_in.ops = ops
    saved = {m: sys.modules.get(m) for m in ("torchvision", "torchvision.ops")}
    sys.modules.update({"torchvision": stand_in, "torchvision.ops": ops})
    try:
        return _with_newer_opsets(importlib.import_module("onnx2torch").convert)
    finally:  # nothing else in the process sees the stand-in
        for m, module in saved.items():
            if module is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = module


def _with_newer_opsets(convert):
    """``convert``, onnx2torch's, once it converts the operator versions of opsets 18 to 20 (``onnx2torch_opsets``)."""
    from korch import onnx2torch_opsets

    onnx2torch_opsets.register()
    return convert


def _peer(name: str, module: torch.nn.Module, reference_model: bytes) -> Callable[[Sequence[torch.Tensor]], object]:
    if name == "ort":
        import onnx

        from korch.ir import ort

        session = ort.session(onnx.load_from_string(reference_model))
        names = [i.name for i in session.get_inputs()]
        return lambda xs: session.run(None, {n: x.cpu().numpy() for n, x in zip(names, xs)})
    if name == "eager":
        fn = module
    elif name == "eager-cuda-graph":
        return _graphed(module)
    else:
        torch._dynamo.reset()
        fn = torch.compile(module, mode=COMPILE_MODES[name])
    return lambda xs: fn(*xs)


def _graphed(module: torch.nn.Module) -> Callable[[Sequence[torch.Tensor]], object]:
    """Eager ``module`` captured in a CUDA graph on its first call (after a warm-up on a side stream, as torch's
    CUDA graph notes prescribe) and replayed with the inputs copied into the captured ones: korch's own
    executable's scheme, applied to the eager model."""
    if not torch.cuda.is_available():
        raise KorchError("eager-cuda-graph needs a GPU")
    state: dict = {}

    def run(xs):
        if not state:
            static = [x.clone() for x in xs]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    module(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = module(*static)
            state.update(graph=graph, static=static, outputs=outputs)
        for captured, x in zip(state["static"], xs):
            captured.copy_(x)
        state["graph"].replay()
        return state["outputs"]

    return run


def time_system(name: str, fn: Callable[[Sequence[torch.Tensor]], object], inputs: Sequence[torch.Tensor],
                device: str, budget_s: float, note: str = "", warmup: int = 3, min_runs: int = MIN_RUNS):
    from korch.backends.timing import time_kernel

    with torch.inference_mode():
        t = time_kernel(lambda i: fn(inputs), device=device, budget_s=budget_s, min_repeats=min_runs, warmup=warmup)
    return SystemTiming(name, t.median_s, t.min_s, t.runs, note)


def _combined(rounds: Sequence[SystemTiming]) -> SystemTiming:
    """One system's rounds as one timing: the median of the rounds' medians, the fastest run, all runs."""
    first = rounds[0]
    return SystemTiming(first.name, float(np.median([r.median_s for r in rounds])), min(r.min_s for r in rounds),
                        sum(r.runs for r in rounds), first.note)


def bench(executable, *, model, reference_model: bytes, peers: Sequence[str], target: str,
          feeds: Mapping[str, np.ndarray] | None = None, budget_s: float = BUDGET_S, rounds: int = ROUNDS,
          on_system: Callable[[str], None] | None = None, plan=None) -> BenchResult:
    """Time ``executable`` and each peer on the same (seeded) inputs; a peer that fails is named, not fatal.
    ``plan`` (the executable's ``Plan``), when given, puts its predicted latency beside korch's.

    The systems take turns: ``rounds`` rounds, each timing every system for ``budget_s / rounds``, so a
    slow spell of a shared machine lands on all of them alike; a system's latency is the median of its
    rounds' medians.
    """
    from korch.backends.timing import take_turns
    from korch.runtime import bundle
    from korch.runtime.selfcheck import given_at_build, seeded_inputs

    device = executable.device.type
    feeds = feeds or {**seeded_inputs(executable.input_specs), **given_at_build(executable)}
    inputs = [torch.from_numpy(np.asarray(feeds[n], order="C")).to(device) for n in executable.input_names]
    module, note, module_error = None, "", None
    if not set(peers) <= {"ort"}:
        try:
            module, note = torch_module_for(model, reference_model, device)
        except KorchError as exc:
            module_error = str(exc)
    calls, failed = {"korch": (lambda xs: executable(*xs), "")}, {}  # name -> (function of the inputs, note)
    for name in peers:
        if name != "ort" and module is None:
            failed[name] = module_error
            continue
        try:
            calls[name] = (_peer(name, module, reference_model),
                           note if name != "ort" else ("CPU" if device == "cpu" else "CPU provider"))
        except Exception as exc:  # a peer that cannot be set up for this model is reported, the benchmark goes on
            failed[name] = one_line(exc)

    def time_one(name: str, round_: int) -> SystemTiming:
        if on_system and round_ == 0:
            on_system(name)
        fn, system_note = calls[name]
        return time_system(name, fn, inputs, device, budget_s / rounds, system_note, warmup=3 if round_ == 0 else 1,
                           min_runs=max(2, -(-MIN_RUNS // rounds)))

    def peer_failed(name: str, exc: Exception) -> None:  # a peer that cannot run is named, the benchmark goes on
        if name == "korch":
            raise exc
        failed[name] = one_line(exc)

    with precision.applied(executable.precision):  # the peers' products are computed as korch's are
        timings = take_turns(list(calls), time_one, rounds, on_error=peer_failed)
    results = [_combined(timings[name]) for name in calls if name in timings]
    return BenchResult(model=str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__,
                       target=target, device=device_description(device), korch=results[0], peers=results[1:],
                       failed=failed, versions=bundle.versions(), precision=executable.precision.name,
                       cost_model=plan.cost_model if plan else "",
                       predicted_s=plan.predicted_latency_s if plan else None)


def write_json(result: BenchResult, path: str | os.PathLike) -> Path:
    return write_record(result.to_json(), path)


def record(benchmark: str, script: str, argv: Sequence[str] | None, device: str = "cpu", **fields) -> dict:
    """A benchmark script's result with what makes it reproducible: date, device, versions and the command
    (``script`` run with ``argv``, default this process's arguments)."""
    from korch.runtime import bundle

    args = list(argv) if argv is not None else sys.argv[1:]
    return {"benchmark": benchmark, "date": datetime.date.today().isoformat(), "device": device_description(device),
            "versions": bundle.versions(), "command": " ".join(["python", script, *args]), **fields}


def write_record(report: dict, path: str | os.PathLike | None) -> Path | None:
    """``report`` as JSON at ``path`` (written whole or not at all); nothing without a path."""
    if path is None:
        return None
    from korch.fsutil import atomic_write_bytes

    return atomic_write_bytes(path, json.dumps(report, indent=1).encode())
