"""GPU micro-benchmarks of korch's Triton kernels (needs a CUDA GPU; run on a lent H100/H200).

* fused softmax and layer norm at large sizes: achieved bandwidth (bytes read
  once + written once over the median time) against the device's peak, measured
  here as a large device-to-device copy;
* matmul with a fused epilogue (bias + GELU + residual) against torch's matmul
  followed by the same epilogue in eager torch.

Every kernel is checked against the reference executor before it is timed.
Prints a Markdown table and writes it (with device, date and versions) to
``benchmarks/results/kernel_microbench_<gpu>.md``.

    PYTHONPATH=src python3 benchmarks/kernel_microbench.py
"""

from __future__ import annotations

import datetime
import sys

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from korch.backends.check import check, random_inputs
from korch.backends.timing import time_kernel
from korch.backends.triton.backend import TritonBackend
from korch.fission import fission
from korch.frontend import load_onnx
from korch.fsutil import atomic_write_bytes


def _kernel(nodes, inputs, outputs, inits=None):
    graph = helper.make_graph(nodes, "bench",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
                              [onnx.numpy_helper.from_array(v, n) for n, v in (inits or {}).items()])
    return fission(load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])))


def _copy_bandwidth() -> float:
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = time_kernel(lambda i: y.copy_(x), device="cuda").median_s
    return 2 * x.numel() / t


def _time(fn, sets) -> float:
    return time_kernel(lambda i: fn(*sets[i]), device="cuda", rotate=len(sets)).median_s


def _sets(kernel, n=4):
    return [[x.cuda() for x in random_inputs(kernel, seed=i)] for i in range(n)]


def memory_bound_rows(peak: float) -> list[str]:
    rows = []
    for rows_, cols in ((4096, 4096), (16384, 1024), (2048, 32768)):
        for name, graph in (
            ("softmax", _kernel([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                                {"x": (rows_, cols)}, {"y": (rows_, cols)})),
            ("layer norm", _kernel([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                                   {"x": (rows_, cols)}, {"y": (rows_, cols)},
                                   {"g": np.ones(cols, np.float32), "b": np.zeros(cols, np.float32)})),
        ):
            built = TritonBackend().build(graph, "cuda")
            result = check(built, graph, device="cuda")
            sets = _sets(graph)
            built.tune(lambda call: time_kernel(call, device="cuda").median_s, sets[:1])
            seconds = _time(built, sets)
            nbytes = sum(graph.tensors[n].nbytes for n in (*graph.inputs, *graph.outputs))
            rows.append(f"| {name} {rows_}x{cols} | {result.ok} | {seconds * 1e6:.1f} | {nbytes / seconds / 1e9:.0f} "
                        f"| {nbytes / seconds / peak:.0%} | {built.variant.describe()} |")
    return rows


def matmul_rows() -> list[str]:
    rows = []
    rng = np.random.default_rng(0)
    for m, k, n in ((4096, 4096, 4096), (8192, 1024, 4096), (16384, 768, 3072)):
        w = rng.standard_normal((k, n)).astype(np.float32) * 0.02
        b = rng.standard_normal(n).astype(np.float32)
        graph = _kernel([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["a"]),
                         helper.make_node("Gelu", ["a"], ["g"]), helper.make_node("Add", ["g", "r"], ["y"])],
                        {"x": (m, k), "r": (m, n)}, {"y": (m, n)}, {"w": w, "b": b})
        built = TritonBackend().build(graph, "cuda")
        result = check(built, graph, device="cuda")
        sets = _sets(graph)
        built.tune(lambda call: time_kernel(call, device="cuda").median_s, sets[:1])
        ours = _time(built, sets)
        wt, bt = torch.from_numpy(w).cuda(), torch.from_numpy(b).cuda()

        def eager(*xs):
            named = dict(zip(graph.inputs, xs))
            x, r = (named[t] for t in sorted(named, key=lambda t: graph.tensors[t].shape != (m, k)))
            return torch.nn.functional.gelu(x @ wt + bt) + r
        theirs = _time(eager, sets)
        flops = 2 * m * k * n
        rows.append(f"| {m}x{k}x{n} | {result.ok} | {ours * 1e6:.0f} | {theirs * 1e6:.0f} | {theirs / ours:.2f} "
                    f"| {flops / ours / 1e12:.0f} | {built.variant.describe()} |")
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("kernel_microbench needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    gpu = torch.cuda.get_device_name()
    peak = _copy_bandwidth()
    lines = [f"# Triton kernel micro-benchmarks on {gpu}", "",
             f"- date {datetime.date.today()}, torch {torch.__version__}, triton {triton.__version__}",
             f"- measured copy bandwidth (read + write): {peak / 1e9:.0f} GB/s", "",
             "| kernel | checked | median µs | GB/s | of copy bandwidth | variant |",
             "| --- | --- | ---: | ---: | ---: | --- |", *memory_bound_rows(peak), "",
             "| matmul + bias + GELU + residual (M x K x N) | checked | korch µs | torch matmul + eager epilogue µs "
             "| speed-up | TFLOP/s | variant |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |", *matmul_rows()]
    text = "\n".join(lines) + "\n"
    print(text)
    name = gpu.lower().replace(" ", "_")
    atomic_write_bytes(f"benchmarks/results/kernel_microbench_{name}.md", text.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
