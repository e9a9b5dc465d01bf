"""What one kernel costs an executable beyond its own work: plans of N tiny kernels, timed per kernel.

A chain of N elementwise operators on a small tensor, planned with one
primitive per kernel (``max_kernel_nodes=1``), so the executable runs N
kernels that do almost nothing. The per-kernel overhead is the slope between
two chain lengths, ``(t(N) - t(n)) / (N - n)``: what calling one more kernel
costs, whatever the call itself costs once. Measured for the compiled unit
(the default on a CPU), the kernel-by-kernel executable, and ONNX Runtime on
the same chains, in one process, interleaved.

    python benchmarks/kernel_overhead.py --lengths 8,128 --out benchmarks/results/kernel_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ELEMENTS = 64
OPS = ("Neg", "Relu", "Abs", "Sigmoid")


def chain(n: int) -> onnx.ModelProto:
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["y"]
    nodes = [helper.make_node(OPS[i % len(OPS)], [names[i]], [names[i + 1]]) for i in range(n)]
    graph = helper.make_graph(nodes, f"chain{n}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (ELEMENTS,))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (ELEMENTS,))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8,128", help="two chain lengths, short,long")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timed runs per system and length")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    short, long = (int(v) for v in args.lengths.split(","))

    import torch

    from korch import bench
    from korch.ir import ort
    from korch.pipeline import optimize

    x = torch.from_numpy(np.random.default_rng(0).standard_normal(ELEMENTS).astype(np.float32))
    seconds: dict[str, dict[int, float]] = {"compiled unit": {}, "kernel by kernel": {}, "onnxruntime": {}}
    kernels = {}
    with tempfile.TemporaryDirectory(prefix="korch-overhead-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (short, long):
            model = chain(n)
            systems = {}
            for name, unit in (("compiled unit", True), ("kernel by kernel", False)):
                result = optimize(model, output=Path(tmp) / f"{n}-{unit}", target="cpu", cost="roofline",
                                  max_kernel_nodes=1, compiled_unit=unit)
                assert result.manifest["runs"] == name, result.manifest["unit"]
                kernels[n] = len(result.plan.kernels)
                systems[name] = result.executable
            session = ort.session(model)
            systems["onnxruntime"] = lambda v, s=session: s.run(None, {"x": v.numpy()})
            for name, fn in systems.items():
                seconds[name][n] = bench.time_system(name, lambda xs, f=fn: f(*xs), [x], "cpu", args.budget).median_s
    per_kernel = {name: (t[long] - t[short]) / (kernels[long] - kernels[short]) for name, t in seconds.items()}
    report = bench.record("per-kernel overhead", "benchmarks/kernel_overhead.py", argv, kernels=kernels,
                          median_s={k: {str(n): v for n, v in t.items()} for k, t in seconds.items()},
                          per_kernel_s=per_kernel)
    for name, s in per_kernel.items():
        print(f"{name:>17}: {s * 1e6:7.2f} us per kernel "
              f"({seconds[name][short] * 1e6:.1f} us for {kernels[short]}, {seconds[name][long] * 1e6:.1f} us "
              f"for {kernels[long]} kernels)")
    bench.write_record(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
