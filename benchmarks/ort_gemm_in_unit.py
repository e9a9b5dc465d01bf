"""Can ONNX Runtime's GEMMs (MLAS) serve inside korch's compiled unit? A ViT-B block's six GEMMs, both ways.

ONNX Runtime's MatMul is the fastest float32 GEMM on an AVX2 CPU (``gemm_paths.py``).
This asks whether korch could call it from its compiled unit: a chain shaped
like a ViT-B block (197 tokens; four 768x768 GEMMs, 768x3072, 3072x768, with
pointwise work between) is compiled by AOTInductor twice: GEMMs as ATen calls,
and GEMMs as a ``torch.library`` operator that runs a one-MatMul ONNX Runtime
session (weights prepacked by MLAS, outputs written in place through I/O
binding, its threads not spinning). Each way runs in its own process under each OpenMP wait policy
(``OMP_WAIT_POLICY``: the default spins, which competes with ONNX Runtime's
threads), with the six sessions alone for the floor. Medians of interleaved rounds, 2 threads.

    python benchmarks/ort_gemm_in_unit.py --out benchmarks/results/ort_gemm_in_unit_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOKENS = 197
WEIGHT_SHAPES = ((768, 768),) * 4 + ((768, 3072), (3072, 768))
WAYS = ("aten", "onnxruntime", "onnxruntime sessions alone")
WAIT_POLICIES = ("default", "PASSIVE")


def median_ms(fn, runs: int = 30) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples)) * 1e3


def _matmul_session(weight: np.ndarray):
    """A one-MatMul session on 2 threads that do not spin between runs (six pools share two cores)."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (TOKENS, weight.shape[0]))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (TOKENS, weight.shape[1]))],
                              [onnx.numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _measure(way: str) -> float:
    """One way's median ms, in this process (a child of ``main``)."""
    import torch

    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(shape).astype(np.float32) * 0.03 for shape in WEIGHT_SHAPES]
    sessions = [_matmul_session(w) for w in weights]
    x = torch.from_numpy(rng.standard_normal((TOKENS, 768)).astype(np.float32))
    if way == "onnxruntime sessions alone":
        feeds = [rng.standard_normal((TOKENS, w.shape[0])).astype(np.float32) for w in weights]
        return median_ms(lambda: [s.run(None, {"x": f}) for s, f in zip(sessions, feeds)])

    def ort_mm(a, index):
        out = a.new_empty(a.shape[0], weights[index].shape[1])
        binding = sessions[index].io_binding()
        a = a.contiguous()
        binding.bind_input("x", "cpu", 0, np.float32, list(a.shape), a.data_ptr())
        binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.data_ptr())
        sessions[index].run_with_iobinding(binding)
        return out

    # annotations are strings under ``from __future__ import annotations``: the schema is given explicitly
    ort_mm = torch.library.custom_op("korch_bench::ort_matmul", ort_mm, mutates_args=(),
                                     schema="(Tensor a, int index) -> Tensor")
    ort_mm.register_fake(lambda a, index: a.new_empty(a.shape[0], weights[index].shape[1]))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for i, w in enumerate(weights):
                self.register_buffer(f"w{i}", torch.from_numpy(w))

        def mm(self, h, i):
            return torch.ops.korch_bench.ort_matmul(h, i) if way == "onnxruntime" else h @ getattr(self, f"w{i}")

        def forward(self, x):
            h = x
            for i in range(4):
                h = torch.relu(self.mm(h, i)) + x
            return self.mm(torch.nn.functional.gelu(self.mm(h, 4)), 5) + x

    with torch.no_grad():
        exported = torch.export.export(Block().eval(), (x,))
        with torch._inductor.config.patch(freezing=True), tempfile.TemporaryDirectory() as tmp:
            package = torch._inductor.aoti_compile_and_package(exported, package_path=os.path.join(tmp, "m.pt2"))
            unit = torch._inductor.aoti_load_package(package)
    return median_ms(lambda: unit(x))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.child)))
        return 0

    from korch import bench

    environments = {}
    for policy in WAIT_POLICIES:
        env = dict(os.environ)
        env.pop("OMP_WAIT_POLICY", None)
        if policy != "default":
            env["OMP_WAIT_POLICY"] = policy
        environments[policy] = env
    samples = {(policy, way): [] for policy in WAIT_POLICIES for way in WAYS}
    for _ in range(args.rounds):  # rounds interleave every (policy, way): a slow spell lands on all alike
        for policy, way in samples:
            done = subprocess.run([sys.executable, __file__, "--child", way], env=environments[policy],
                                  check=True, capture_output=True, text=True)
            samples[policy, way].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = [{"omp_wait_policy": policy,
             "median_ms": {way: float(np.median(samples[policy, way])) for way in WAYS},
             "rounds_ms": {way: samples[policy, way] for way in WAYS}} for policy in WAIT_POLICIES]
    for row in rows:
        print(row["omp_wait_policy"], {way: round(ms, 2) for way, ms in row["median_ms"].items()})
    report = bench.record("ONNX Runtime GEMMs inside a compiled unit (ViT-B block's GEMM chain)",
                          "benchmarks/ort_gemm_in_unit.py", argv, rows=rows)
    bench.write_record(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
