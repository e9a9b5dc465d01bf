"""How far each precision policy's own arithmetic moves every zoo model's outputs: the tolerances' evidence.

For each zoo model, on the self-check's seeded inputs, the relative norm of
the difference (``backends.check.compare``, what the check computes) between:

* korch's reference executor on the primitive graph in float32 and ONNX
  Runtime on the model (all graph optimisations): what an exact fp32 run
  differs by;
* ONNX Runtime with all graph optimisations and with none: the spread ONNX
  Runtime itself allows between two of its own float32 runs;
* each of those and the original torch module in float64;
* the reference executor with TF32 operands (``precision.emulated("tf32")``:
  every matrix product and convolution rounds its float32 operands to TF32, as
  a GPU's tensor cores do) against ONNX Runtime: what a GPU run under the
  ``tf32`` policy differs by, hence the floor of that policy's tolerance.

    python benchmarks/precision_spread.py --out benchmarks/results/precision_spread_cpu.json
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np


def _rel_norm(actual: dict, expected: dict) -> float:
    """The worst output's relative norm of the difference."""
    import torch

    from korch.backends.check import compare

    return max(compare(torch.from_numpy(np.ascontiguousarray(actual[name])), np.asarray(want), name).rel_norm
               for name, want in expected.items())


def _float64(name: str, feeds: dict, output_names: list[str]) -> dict | None:
    """The torch module of zoo model ``name`` in float64 on ``feeds`` (None where the module refuses float64)."""
    import torch

    from korch import zoo

    module, _ = zoo.build(name)
    inputs = [torch.from_numpy(feeds[key]) for key in zoo.get(name).input_shapes]
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    try:
        with torch.no_grad():
            outputs = module.double().eval()(*inputs)
    except Exception:
        return None
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return {out: value.numpy() for out, value in zip(output_names, outputs)}


def spread(name: str) -> dict:
    from korch import precision, zoo
    from korch.ir import interpret, ort
    from korch.pipeline import load_model

    path = zoo.export(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(str(path))
    specs = {n: (graph.tensors[n].shape, graph.tensors[n].dtype) for n in graph.inputs}
    from korch.runtime.selfcheck import seeded_inputs

    feeds = seeded_inputs(specs)
    outputs = list(graph.outputs)
    ort_all = ort.run_model(str(path), feeds, outputs)
    plain = ort.session(str(path), optimize=False)
    ort_none = dict(zip(outputs, plain.run(outputs, feeds)))
    fp32 = interpret.run(graph, feeds)
    with precision.emulated("tf32"):
        tf32 = interpret.run(graph, feeds)
    row = {"model": name, "fp32 vs onnxruntime": _rel_norm(fp32, ort_all),
           "onnxruntime all vs no optimisations": _rel_norm(ort_none, ort_all),
           "tf32 vs onnxruntime": _rel_norm(tf32, ort_all)}
    exact = _float64(name, feeds, outputs)
    if exact is not None:
        for label, values in (("fp32", fp32), ("onnxruntime", ort_all), ("tf32", tf32)):
            row[f"{label} vs float64"] = _rel_norm(values, exact)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo models (default: all)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from korch import bench, precision, zoo

    names = args.models.split(",") if args.models else [m.name for m in zoo.list_models()]
    rows = []
    for name in names:
        rows.append(spread(name))
        print("  ".join(f"{k} {v:.2e}" if isinstance(v, float) else str(v) for k, v in rows[-1].items()), flush=True)
    report = bench.record("precision spread of the zoo", "benchmarks/precision_spread.py", argv,
                          tolerances={p.name: p.model_tolerance for p in precision.POLICIES.values()}, rows=rows)
    bench.write_record(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
