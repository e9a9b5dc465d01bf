"""What a blocked convolution costs a compiled unit beyond its arithmetic: a chain of small 1x1 convolutions with
ReLUs, compiled as korch's unit with its convolutions blocked (``backends/nchwc.py``), against ONNX Runtime
running the same ONNX model (which blocks them as well), both on one thread.

The convolutions are small (``--channels`` channels at ``--size`` x ``--size`` pixels), so each call's time is
almost all fixed cost: in korch's unit AOTInductor's proxy executor calling ``korch_ort::nchwc_conv`` and the
operator's ``Run`` of a one-node session; in ONNX Runtime its executor stepping to the next node of one session.

    python benchmarks/nchwc_call_overhead.py [--convs 50] [--channels 32] [--size 2] [--calls 300] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def chain_model(convs: int, channels: int, size: int):
    """``convs`` 1x1 convolutions of ``channels`` channels, each followed by a ReLU."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(convs):
        weights.append(onnx.numpy_helper.from_array(
            (rng.standard_normal((channels, channels, 1, 1)) * 0.2).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"]), helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    shape = (1, channels, size, size)
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mean_us(call, calls: int) -> float:
    for _ in range(20):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv=None) -> int:
    import korch  # noqa: F401  (before torch: korch settles OpenMP's waiting)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--convs", type=int, default=50)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--size", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    import onnxruntime as ort
    import torch

    from korch import bench
    from korch.pipeline import optimize
    from korch.runtime import unit

    torch.set_num_threads(1)
    model = chain_model(args.convs, args.channels, args.size)
    result = optimize(model, target="cpu", cost="roofline")
    variant = dataclasses.replace(unit.VARIANTS["packed for oneDNN"], nchwc=True)
    compiled = unit.CompiledUnit.from_bytes(unit.compile_unit(result.graph, result.plan, "cpu", variant))
    x = torch.randn(1, args.channels, args.size, args.size)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {"x": x.numpy()}
    with torch.inference_mode():
        korch_us = mean_us(lambda: compiled(x), args.calls)
    ort_us = mean_us(lambda: session.run(None, feeds), args.calls)
    row = {"convolutions": args.convs, "channels": args.channels, "size": args.size,
           "korch_unit_us": round(korch_us, 1), "onnxruntime_us": round(ort_us, 1),
           "korch_us_per_convolution": round(korch_us / args.convs, 2),
           "onnxruntime_us_per_convolution": round(ort_us / args.convs, 2)}
    print(row)
    bench.write_record(bench.record("a blocked convolution's fixed cost in a unit and in ONNX Runtime",
                                    "benchmarks/nchwc_call_overhead.py", argv, row=row), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
