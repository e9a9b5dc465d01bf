"""A measured plan's costliest Inductor kernels timed on NCHW tensors (as korch measures them) and on channels-last
ones (as a compiled unit stores the values convolutions read between kernels): what layout is worth per kernel.

    python benchmarks/kernel_layouts.py OUTDIR --top 5 --out benchmarks/results/kernel_layouts_cpu.json

OUTDIR is written by ``korch optimize --cost measured``. Each kernel is compiled by Inductor twice, from the
same primitives, with every 4-D floating-point input and output in one layout or the other; the latency is the median of
``korch.backends.timing.time_kernel``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path



def time_in_layout(kernel) -> float:
    from korch.backends.base import stored_as
    from korch.backends.check import random_inputs
    from korch.backends.inductor import InductorKernel
    from korch.backends.timing import time_kernel

    built = InductorKernel(kernel, "cpu")
    inputs = [stored_as(x, kernel.tensors[name].layout) for x, name in zip(random_inputs(kernel), kernel.inputs)]
    outputs = built(*inputs)
    return time_kernel(lambda i: built(*inputs, out=outputs), device="cpu").median_s


def main(argv=None) -> int:
    from korch import bench
    from korch.ir.graph import CHANNELS_LAST
    from korch.ir.subgraph import extract
    from korch.pipeline import load_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    plan = json.loads((args.outdir / "plan.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(args.outdir / "reference.onnx")
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    kernels = [k for k in plan["kernels"] if k["backend"] == "inductor"]
    rows = []
    for k in sorted(kernels, key=lambda k: -k["cost_s"])[:args.top]:
        nodes = frozenset(index[n] for n in k["nodes"])
        nchw = time_in_layout(extract(graph, nodes, k["inputs"], k["outputs"], name=k["name"]))
        last = time_in_layout(extract(graph, nodes, k["inputs"], k["outputs"], name=k["name"], layout=CHANNELS_LAST))
        rows.append({"kernel": k["name"], "ops": k["ops"], "planned_ms": round(k["cost_s"] * 1e3, 3),
                     "nchw_ms": round(nchw * 1e3, 3), "channels_last_ms": round(last * 1e3, 3),
                     "speedup": round(nchw / last, 2)})
        print(json.dumps(rows[-1]), flush=True)
    bench.write_record(bench.record("kernel layouts", "benchmarks/kernel_layouts.py", argv, model=plan["model"],
                                    rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
