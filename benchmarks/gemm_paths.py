"""GFLOP/s of each float32 GEMM path korch can call on this CPU, against ONNX Runtime's, on the zoo's shapes.

For each (M, K, N) with a constant K x N weight: ATen's ``matmul`` (MKL or oneDNN,
as ATen dispatches) and oneDNN with the weight packed once
(``mkldnn._reorder_linear_weight`` + ``mkldnn._linear_pointwise``), as the CPU probe times them
(``cost.probe.matmul_paths``), MKL's
packed path (``mkl._mkl_reorder_linear_weight`` + ``mkl._mkl_linear``; the
compiled unit's frozen GEMMs take one of these), and ONNX Runtime's MatMul
(MLAS), Inductor's C++ GEMM template (its own AVX2/AVX-512 micro-kernel, the weight packed at
freeze time; what ``max_autotune`` on a CPU can pick), and korch's ``korch_ort::matmul`` (MLAS
on torch's threads: what a unit's "MLAS by ONNX Runtime" variant calls). Medians, interleaved, in one
process, with the torch and ONNX Runtime thread counts equal.

    python benchmarks/gemm_paths.py --out benchmarks/results/gemm_paths_cpu.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

# (M, K, N): BERT-base layer at 128 tokens (QKV/projection, FFN in, FFN out), ViT-B block at 197 tokens
SHAPES = ((128, 768, 768), (128, 768, 3072), (128, 3072, 768), (197, 768, 2304), (197, 768, 3072))
# --small: the zoo's BERT-mini (hf_bert) at 1 token and at 128, where a call's fixed cost and a GEMV's
# memory-bound weight read decide (each path's call overhead included: ONNX Runtime's run() is the largest)
SMALL_SHAPES = ((1, 256, 256), (1, 256, 1024), (1, 1024, 256), (128, 256, 256), (128, 256, 1024))


def median_s(fn, budget_s: float) -> float:
    for _ in range(3):
        fn()
    samples, start = [], time.perf_counter()
    while len(samples) < 10 or time.perf_counter() - start < budget_s:
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return float(np.median(samples))


def ort_matmul(m: int, k: int, weight: np.ndarray):
    import onnx
    from onnx import TensorProto, helper

    from korch.ir import ort

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (m, k))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (m, weight.shape[1]))],
                              [onnx.numpy_helper.from_array(weight, "w")])
    return ort.session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def inductor_cpp_template(weight):
    """``x @ weight`` compiled by Inductor with only its C++ GEMM template allowed (weights frozen)."""
    import torch

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(weight, requires_grad=False)

        def forward(self, x):
            return x @ self.weight

    torch._dynamo.reset()
    with torch._inductor.config.patch(freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP"):
        return torch.compile(Linear().eval())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of timed runs per path and shape")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--small", action="store_true", help="BERT-mini's shapes, M = 1 and 128")
    parser.add_argument("--shapes", metavar="MxKxN,...", help="these shapes instead (Whisper-tiny's encoder: "
                        "128x384x384,128x384x1536,128x1536x384)")
    args = parser.parse_args(argv)
    shapes = ([tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")] if args.shapes
              else SMALL_SHAPES if args.small else SHAPES)

    import torch

    from korch import bench
    from korch.backends import ort_gemm
    from korch.cost import probe

    ort_gemm.open_library()
    rows = []
    for slot, (m, k, n) in enumerate(shapes):
        rng = np.random.default_rng(0)
        x_np = rng.standard_normal((m, k)).astype(np.float32)
        w_np = rng.standard_normal((k, n)).astype(np.float32)
        x, w = torch.from_numpy(x_np), torch.from_numpy(w_np)
        w_t = w.t().contiguous()  # linear layout: N x K
        probed = probe.matmul_paths(x, w)  # ATen's and oneDNN's packed product, as the CPU probe times them
        packed_mkl = torch.ops.mkl._mkl_reorder_linear_weight(w_t, m)
        session = ort_matmul(m, k, w_np)
        template = inductor_cpp_template(w)
        with torch.no_grad():
            template(x)  # compiles now, not inside the timed runs
        paths = {
            "torch.mm": probed["matmul"],
            "oneDNN packed": probed["oneDNN packed"],
            "MKL packed": lambda: torch.ops.mkl._mkl_linear(x, packed_mkl, w_t, None, m),
            "Inductor C++ template": lambda: template(x),
            "onnxruntime": lambda: session.run(None, {"x": x_np}),
            "korch_ort::matmul": lambda: ort_gemm.ops().matmul(x, w, 0, slot),
        }
        seconds = {name: [] for name in paths}
        with torch.inference_mode():
            for _ in range(3):  # interleaved rounds; the best round's median is kept
                for name, fn in paths.items():
                    seconds[name].append(median_s(fn, args.budget))
        flops = 2 * m * k * n
        gflops = {name: flops / min(s) / 1e9 for name, s in seconds.items()}
        rows.append({"shape": [m, k, n], "gflops": gflops, "median_s": {k_: min(s) for k_, s in seconds.items()}})
        print(f"{m}x{k}x{n}: " + "  ".join(f"{name} {g:.0f}" for name, g in gflops.items()) + " GFLOP/s")
    report = bench.record("float32 GEMM paths", "benchmarks/gemm_paths.py", argv,
                          cpu_capability=torch.backends.cpu.get_cpu_capability(), rows=rows)
    bench.write_record(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
