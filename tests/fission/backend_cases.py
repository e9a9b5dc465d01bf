"""Runs the operator test cases shipped inside the ``onnx`` package through korch.

For each case whose operators korch claims: inputs a rule needs constant become
initializers, the model is imported and fissioned, the primitive graph runs in
the reference executor, and its outputs are compared with the case's expected
outputs. ``python -m tests.fission.backend_cases [OP ...]`` prints the tally.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections import Counter

import numpy as np
import onnx

from korch.fission import claimed_ops, find_rule, fission_with_report
from korch.frontend import load_onnx
from korch.ir import dtypes
from korch.ir import interpret

# Handled by the frontend (folded or removed), not by a fission rule.
FRONTEND_OPS = frozenset({"Constant", "Identity", "Dropout", "Shape", "Size", "ConstantOfShape"})
# Cases whose expected values the onnx package writes rounded: compared at the precision they are written in.
ROUNDED_EXPECTATIONS = {
    "test_averagepool_2d_ceil_last_window_starts_on_pad": (0.0, 1e-4),  # written with 4 decimals
}
TOLERANCE = {"float32": (1e-4, 1e-5), "float16": (1e-3, 1e-3), "float64": (1e-7, 1e-9)}


@dataclasses.dataclass
class Outcome:
    case: str
    op: str
    status: str  # passed | failed | skipped
    reason: str = ""


def _elem_type_name(value_info: onnx.ValueInfoProto) -> str | None:
    t = value_info.type
    if not t.HasField("tensor_type"):
        return None
    try:
        return dtypes.from_onnx(t.tensor_type.elem_type)
    except Exception:
        return None


def _as_array(value, value_info: onnx.ValueInfoProto) -> np.ndarray:
    """A case's data as the type its model declares (some cases store TensorProtos or object arrays)."""
    if isinstance(value, onnx.TensorProto):
        value = onnx.numpy_helper.to_array(value)
    return np.asarray(value, dtype=_elem_type_name(value_info))


def case_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")]


def is_claimed(model: onnx.ModelProto) -> bool:
    ops = case_ops(model)
    claimed = claimed_ops() | FRONTEND_OPS
    return bool(ops) and len(ops) == len(model.graph.node) and all(op in claimed for op in ops) \
        and any(op not in FRONTEND_OPS for op in ops)


def _pin_constant_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Turn graph inputs that feed a rule's constant-input slot into initializers."""
    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 1)
    pinned = set()
    for node in model.graph.node:
        rule = find_rule(node.op_type, opset)
        for i in rule.const_inputs if rule else ():
            if i < len(node.input) and node.input[i] in feeds:
                pinned.add(node.input[i])
    model = onnx.ModelProto.FromString(model.SerializeToString())
    keep = [i for i in model.graph.input if i.name not in pinned]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    for name in sorted(pinned):
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(feeds[name]), name))
    return model


def _compare(name: str, got: np.ndarray, want: np.ndarray, tolerance: tuple[float, float] | None = None) -> str | None:
    if got.shape != want.shape:
        return f"{name}: shape {got.shape} != {want.shape}"
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "fc":
        rtol, atol = tolerance or TOLERANCE.get(want.dtype.name, (1e-4, 1e-5))
        if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
            err = np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64)))
            return f"{name}: max abs error {err:.3g}"
    elif not np.array_equal(got, want):
        return f"{name}: values differ"
    return None


def run_case(case) -> list[Outcome]:
    model = case.model
    op = "+".join(dict.fromkeys(o for o in case_ops(model) if o not in FRONTEND_OPS))
    values = [*model.graph.input, *model.graph.output]
    bad = sorted({d or "non-tensor" for d in map(_elem_type_name, values) if d not in dtypes.SUPPORTED})
    if bad:
        return [Outcome(case.name, op, "skipped", f"dtype {', '.join(bad)} is not claimed by korch")]
    outcomes = []
    for index, (inputs, outputs) in enumerate(case.data_sets):
        label = f"{case.name}[{index}]"
        # some cases store their arrays with dtype object: read them as the type the model declares
        feeds = {vi.name: _as_array(v, vi) for vi, v in zip(model.graph.input, inputs)}
        pinned = _pin_constant_inputs(model, feeds)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imported = load_onnx(pinned)
                graph, report = fission_with_report(imported)
            if report.opaque:
                outcomes.append(Outcome(label, op, "skipped", "kept opaque: " + "; ".join(
                    f"{k}: {v}" for k, v in report.opaque.items())))
                continue
            got = interpret.run(graph, {k: v for k, v in feeds.items() if k in graph.inputs})
        except Exception as exc:  # a crash is a failure of the claimed rule
            outcomes.append(Outcome(label, op, "failed", f"{type(exc).__name__}: {exc}"))
            continue
        problems = [p for vi, want in zip(model.graph.output, outputs)
                    if (p := _compare(vi.name, got[vi.name], _as_array(want, vi), ROUNDED_EXPECTATIONS.get(case.name)))]
        outcomes.append(Outcome(label, op, "failed" if problems else "passed", "; ".join(problems)))
    return outcomes


def collect_claimed(ops: set[str] | None = None):
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    for case in cases:
        if is_claimed(case.model) and (not ops or set(case_ops(case.model)) & ops):
            yield case


def run_all(ops: set[str] | None = None) -> list[Outcome]:
    return [o for case in collect_claimed(ops) for o in run_case(case)]


def summary(outcomes: list[Outcome]) -> str:
    tally = Counter(o.status for o in outcomes)
    lines = [f"ONNX backend node cases claimed by korch: {len(outcomes)}; passed {tally['passed']}, "
             f"failed {tally['failed']}, skipped with a reason {tally['skipped']}"]
    for o in outcomes:
        if o.status != "passed":
            lines.append(f"  {o.status:7} {o.case} ({o.op}): {o.reason}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(run_all(set(sys.argv[1:]) or None)))
