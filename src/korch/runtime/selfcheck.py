"""Checking a whole executable against ONNX Runtime on the original model.

Both run on the same inputs (seeded random ones unless given); each output is
compared the way a built kernel is (``korch.backends.check.compare``: relative
norm within tolerance, NaN and infinity at the same places, integers exact),
and the report adds the largest absolute error and that error relative to the
output's largest magnitude.

The reference is not exact either: ONNX Runtime with its graph optimisations
and without them differ on the same inputs (fused kernels round differently;
a trained text detector's saturated sigmoid output by 2.7e-3 in relative
norm). Each output's tolerance is the larger of the precision policy's (or the
user's ``--tolerance``) and ``SPREAD_FACTOR`` times that spread, so a correct
executable is not thrown away for the reference's own noise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
import torch

from korch import config
from korch.backends.check import FLOAT_TOLERANCE, compare
from korch.errors import one_line
from korch.ir import ort


SPREAD_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    name: str
    ok: bool
    max_abs: float
    max_rel: float        # max |korch - ort| / max |ort|
    rel_norm: float       # ||korch - ort|| / ||ort||
    message: str = ""
    tolerance: float | None = None         # this output's, when not the model's
    reference_spread: float | None = None  # ONNX Runtime's optimised against unoptimised, relative norm


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    outputs: tuple[OutputCheck, ...]
    tolerance: float = FLOAT_TOLERANCE
    replayed: bool = False   # the checked call replayed the executable's CUDA graph

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    def summary(self) -> str:
        verdict = "matches ONNX Runtime" if self.ok else "DOES NOT match ONNX Runtime"
        text = (f"{verdict}: max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g} "
                f"over {len(self.outputs)} output(s) (tolerance: relative norm {self.tolerance:g})"
                + ("; CUDA graph replay checked" if self.replayed else ""))
        failed = [o.message for o in self.outputs if not o.ok]
        return text + (f"; {'; '.join(failed)}" if failed else "")

    def to_json(self) -> dict:
        return {"ok": self.ok, "max_abs": self.max_abs, "max_rel": self.max_rel, "tolerance": self.tolerance,
                "replayed": self.replayed,
                "outputs": [dataclasses.asdict(o) for o in self.outputs]}


def raised(output_names, exc: Exception, tolerance: float = FLOAT_TOLERANCE) -> ModelCheck:
    """The check of an executable whose run raised ``exc``: every output failed, with the error as its message."""
    message = f"the run raised {one_line(exc, 300)}"
    return ModelCheck(tuple(OutputCheck(name, False, math.inf, math.inf, math.inf, message) for name in output_names),
                      tolerance)


def seeded_inputs(specs: Mapping[str, tuple[tuple[int, ...], str]], seed: int | None = None) -> dict[str, np.ndarray]:
    return ort.random_inputs(specs, config.seed if seed is None else seed)


def given_at_build(executable) -> dict[str, np.ndarray]:
    """The input values given with ``--input-value`` when ``executable`` was built (they may steer control
    flow: runs and timings without the user's own values use them instead of random ones)."""
    return {name: np.asarray(value, dtype=executable.input_specs[name][1])
            for name, value in executable.manifest.get("input_values", {}).items()}


def check_outputs(actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                  tolerance: float = FLOAT_TOLERANCE, spreads: Mapping[str, float] | None = None) -> ModelCheck:
    """Each output of ``actual`` against ``expected`` within ``tolerance``, widened per output to
    ``SPREAD_FACTOR`` times the reference's own spread where ``spreads`` gives one."""
    results = []
    for name, want in expected.items():
        got = np.asarray(actual[name])
        spread = (spreads or {}).get(name)
        own = max(tolerance, SPREAD_FACTOR * spread) if spread is not None and np.isfinite(spread) else tolerance
        result = compare(torch.from_numpy(np.asarray(got, order="C")), np.asarray(want), name, own)
        scale = float(np.abs(want).max(initial=0.0)) if want.dtype.kind in "fc" and want.size else 0.0
        finite = np.isfinite(result.max_abs)
        max_rel = result.max_abs / scale if scale > 0 and finite else (result.max_abs if finite else float("inf"))
        results.append(OutputCheck(name, result.ok, result.max_abs, max_rel, result.rel_norm, result.message,
                                   own if own != tolerance else None, spread))
    return ModelCheck(tuple(results), tolerance)


def reference(model, feeds: Mapping[str, np.ndarray], outputs) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """ONNX Runtime's outputs on ``feeds`` (all graph optimisations), and each float output's spread: the
    relative norm between them and ONNX Runtime's without optimisations."""
    expected = ort.run_model(model, feeds, outputs)
    plain = ort.run_model(model, feeds, outputs, optimize=False)
    spreads = {}
    for name, want in expected.items():
        if want.dtype.kind == "f" and want.shape == plain[name].shape:
            spreads[name] = compare(torch.from_numpy(np.asarray(plain[name], order="C")), want, name).rel_norm
    return expected, spreads


def check_against_onnxruntime(executable, reference_model, feeds: Mapping[str, np.ndarray] | None = None,
                              seed: int | None = None, tolerance: float | None = None) -> ModelCheck:
    """Run ``executable`` and ONNX Runtime on ``reference_model`` (a path, bytes or ModelProto) and compare,
    within ``tolerance`` (default: that of the executable's precision policy) or the reference's own spread.
    Inputs not in ``feeds`` are seeded random. An executable that replays a CUDA graph is checked on a
    replayed call too (a capture that fails raises ``CudaGraphFailed``)."""
    specs = {name: (shape, dtype) for name, (shape, dtype) in executable.input_specs.items()}
    given = dict(feeds or {})
    feeds = {**seeded_inputs({n: s for n, s in specs.items() if n not in given}, seed), **given}
    expected, spreads = reference(reference_model, feeds, executable.output_names)
    tolerance = executable.precision.model_tolerance if tolerance is None else tolerance
    result = check_outputs(executable.run(feeds), expected, tolerance, spreads)
    if not result.ok or not executable.cuda_graph:
        return result
    for _ in range(executable.calls_until_replay):
        executable.run(feeds)
    replayed = check_outputs(executable.run(feeds), expected, tolerance, spreads)  # the captured graph's outputs
    return dataclasses.replace(replayed, replayed=True)
