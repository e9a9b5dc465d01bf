"""``korch bench``: korch's executable and the systems a user would otherwise pick, timed side by side.

Every system runs in this process on the same inputs, is warmed up, and is
timed by the kernel timer (``backends.timing.time_kernel``: median of many
runs, CUDA events on a GPU). The peers:

* ``eager``: the model in PyTorch, as written;
* ``compile``: ``torch.compile`` of it (TorchInductor, default mode);
* ``compile-max-autotune``: ``torch.compile(mode="max-autotune")``;
* ``ort``: ONNX Runtime on the ONNX model, all graph optimizations on.

The PyTorch peers need the model as a torch module: a zoo model's own module,
the module given to the Python API, else (a plain ONNX file) the primitive
graph as a torch function, which the table marks ``(primitives)``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from korch.errors import KorchError

PEERS = ("eager", "compile", "compile-max-autotune", "ort")
BUDGET_S = 2.0
MIN_RUNS = 10


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
    date: str = dataclasses.field(default_factory=lambda: datetime.date.today().isoformat())

    def to_json(self) -> dict:
        return {"model": self.model, "target": self.target, "device": self.device, "date": self.date,
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

    return f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def torch_module_for(model, graph, device: str) -> tuple[torch.nn.Module, str]:
    """The model as a torch module on ``device``: its own module where korch has it, else the primitive graph."""
    if isinstance(model, torch.nn.Module):
        return model.to(device).eval(), ""
    if isinstance(model, str) and model.startswith("zoo:"):
        from korch import zoo

        module, _ = zoo.build(model.removeprefix("zoo:"))
        return module.to(device).eval(), ""
    from korch.backends.torch_ops import kernel_function

    class Primitives(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fn = kernel_function(graph, device)

        def forward(self, *xs):
            out = self.fn(*xs)
            return out[0] if len(out) == 1 else tuple(out)

    return Primitives(), "(primitives)"


def _peer(name: str, module: torch.nn.Module, reference_model: bytes) -> Callable[[Sequence[torch.Tensor]], object]:
    if name == "ort":
        import onnx

        from korch.ir import ort

        session = ort.session(onnx.load_from_string(reference_model))
        names = [i.name for i in session.get_inputs()]
        return lambda xs: session.run(None, {n: x.cpu().numpy() for n, x in zip(names, xs)})
    if name == "eager":
        fn = module
    else:
        torch._dynamo.reset()
        fn = torch.compile(module, mode="max-autotune" if name == "compile-max-autotune" else None)
    return lambda xs: fn(*xs)


def time_system(name: str, fn: Callable[[Sequence[torch.Tensor]], object], inputs: Sequence[torch.Tensor],
                device: str, budget_s: float, note: str = "") -> SystemTiming:
    from korch.backends.timing import time_kernel

    with torch.inference_mode():
        t = time_kernel(lambda i: fn(inputs), device=device, budget_s=budget_s, min_repeats=MIN_RUNS, warmup=3)
    return SystemTiming(name, t.median_s, t.min_s, t.runs, note)


def bench(executable, *, model, graph, reference_model: bytes, peers: Sequence[str], target: str,
          feeds: Mapping[str, np.ndarray] | None = None, budget_s: float = BUDGET_S,
          on_system: Callable[[str], None] | None = None) -> BenchResult:
    """Time ``executable`` and each peer on the same (seeded) inputs; a peer that fails is named, not fatal."""
    from korch.runtime import bundle
    from korch.runtime.selfcheck import seeded_inputs

    device = executable.device.type
    feeds = feeds or seeded_inputs(executable.input_specs)
    inputs = [torch.from_numpy(np.ascontiguousarray(feeds[n])).to(device) for n in executable.input_names]
    if on_system:
        on_system("korch")
    korch = time_system("korch", lambda xs: executable(*xs), inputs, device, budget_s)
    module, note = (None, "") if set(peers) <= {"ort"} else torch_module_for(model, graph, device)
    timings, failed = [], {}
    for name in peers:
        if on_system:
            on_system(name)
        try:
            fn = _peer(name, module, reference_model)
            timings.append(time_system(name, fn, inputs, device, budget_s,
                                       note if name != "ort" else ("CPU" if device == "cpu" else "CPU provider")))
        except Exception as exc:  # a peer that cannot run this model is reported, the benchmark goes on
            failed[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return BenchResult(model=str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__,
                       target=target, device=device_description(device), korch=korch, peers=timings,
                       failed=failed, versions=bundle.versions())


def write_json(result: BenchResult, path: str | os.PathLike) -> Path:
    from korch.fsutil import atomic_write_bytes

    return atomic_write_bytes(path, json.dumps(result.to_json(), indent=1).encode())
