"""ONNX Runtime's blocked-layout convolutions called directly: a model that names its ``com.microsoft.nchwc``
operators runs them, given weights in the blocked order ONNX Runtime's own graph rewrite would give them.

ONNX Runtime keeps convolution networks in its NCHWc layout between layers (``ReorderInput`` once, then
``nchwc.Conv`` with bias, activation and residual sum inside each call). A korch kernel could call those
operators itself on values kept blocked between kernels (issue 13's third layout). This checks, for each block
size a CPU might use (8 on AVX2, 16 on AVX-512), whether a depthwise and a pointwise convolution written with
the nchwc operators match torch's, then times, over MobileNetV2's and a ResNet's convolution shapes (bias and
ReLU6 inside every call): the matching block's one-node session on blocked values (inputs and outputs bound once,
no reorder); the same convolution between channels-last values (the session reorders in and out, as a kernel
in korch's channels-last boundaries would); and oneDNN's convolution over channels-last values with packed
weights and the activation as post-op (what Inductor's freezing calls). A one-value ``Identity`` session gives
what a ``Run`` call from Python costs.

    python benchmarks/ort_nchwc_direct.py [--threads 2] [--calls 200] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

NCHWC = "com.microsoft.nchwc"
# (input channels, output channels, size, groups, kernel, stride): MobileNetV2's (224x224; depthwise when groups
# == channels) and the 3x3 convolutions of transformers' small ResNet (zoo:hf_resnet)
SHAPES = [(16, 96, 112, 1, 1, 1), (32, 144, 56, 1, 1, 1), (144, 32, 56, 1, 1, 1), (96, 576, 14, 1, 1, 1),
          (576, 96, 14, 1, 1, 1), (320, 1280, 7, 1, 1, 1), (96, 96, 112, 96, 3, 2), (144, 144, 56, 144, 3, 1),
          (576, 576, 14, 576, 3, 1), (960, 960, 7, 960, 3, 1),
          (64, 64, 56, 1, 3, 1), (64, 128, 56, 1, 3, 2), (128, 128, 28, 1, 3, 1), (256, 256, 14, 1, 3, 1),
          (256, 512, 14, 1, 3, 2), (512, 512, 7, 1, 3, 1)]


def blocked_weight(weight: np.ndarray, block: int, depthwise: bool) -> np.ndarray:
    """``weight`` (O, I, kh, kw) in the order nchwc.Conv reads: OIHWBo for depthwise, OIHWBiBo otherwise."""
    o, i, kh, kw = weight.shape
    if depthwise:
        return weight.reshape(o // block, block, i, kh, kw).transpose(0, 2, 3, 4, 1).reshape(o, i, kh, kw).copy()
    return weight.reshape(o // block, block, i // block, block, kh, kw).transpose(0, 2, 4, 5, 3, 1) \
        .reshape(o, i, kh, kw).copy()


def session(nodes, inputs, outputs, initializers, threads: int):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "nchwc", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              [onnx.numpy_helper.from_array(v, k) for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(NCHWC, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def conv_node(c_in, c_out, groups, kernel, stride, block, blocked_in: str, blocked_out: str, rng):
    """An nchwc.Conv with bias and ReLU6 (padding kernel // 2), its initializers, and its weight and bias."""
    from onnx import helper

    weight = (rng.standard_normal((c_out, c_in // groups, kernel, kernel)) * 0.1).astype(np.float32)
    bias = rng.standard_normal(c_out).astype(np.float32)
    node = helper.make_node("Conv", [blocked_in, "w", "b"], [blocked_out], domain=NCHWC, group=groups,
                            kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[kernel // 2] * 4,
                            activation="Clip", activation_params=[0.0, 6.0])
    return node, {"w": blocked_weight(weight, block, groups == c_in > 1), "b": bias}, weight, bias


def reference(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, groups: int, stride: int) -> np.ndarray:
    import torch

    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias),
                                   stride=stride, padding=weight.shape[-1] // 2, groups=groups)
    return y.clamp(0, 6).numpy()


def matches(block: int, threads: int) -> dict:
    """Max abs error of a depthwise and a pointwise nchwc.Conv (with reorders) against torch, for ``block``."""
    from onnx import helper

    rng = np.random.default_rng(0)
    errors = {}
    for name, (c, c_out, groups) in {"depthwise": (96, 96, 96), "pointwise": (32, 144, 1)}.items():
        kernel = 3 if groups > 1 else 1
        node, inits, weight, bias = conv_node(c, c_out, groups, kernel, 1, block, "xb", "yb", rng)
        nodes = [helper.make_node("ReorderInput", ["x"], ["xb"], domain=NCHWC), node,
                 helper.make_node("ReorderOutput", ["yb"], ["y"], domain=NCHWC, channels=c_out)]
        x = rng.standard_normal((1, c, 28, 28)).astype(np.float32)
        got = session(nodes, [("x", [1, c, 28, 28])], [("y", [1, c_out, 28, 28])], inits, threads).run(None, {"x": x})[0]
        errors[name] = float(np.abs(got - reference(x, weight, bias, groups, 1)).max())
    return errors


def median_us(run, calls: int) -> float:
    for _ in range(20):
        run()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1e6


def bound(sess, x_shape, y_shape, rng):
    """A call of ``sess`` on input and output arrays bound once (no copies, no allocation per call)."""
    import onnxruntime as ort

    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(
        rng.standard_normal(x_shape).astype(np.float32)))
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(np.empty(y_shape, np.float32)))
    return lambda: sess.run_with_iobinding(binding)


def timed(block: int, threads: int, calls: int) -> list[dict]:
    """Each shape's nchwc.Conv on blocked values, between channels-last values, and oneDNN's, in microseconds."""
    import torch
    from onnx import helper

    torch.set_num_threads(threads)
    rng = np.random.default_rng(1)
    rows = []
    for c_in, c_out, size, groups, kernel, stride in SHAPES:
        out = (size - 1) // stride + 1
        node, inits, weight, bias = conv_node(c_in, c_out, groups, kernel, stride, block, "x", "y", rng)
        blocked = session([node], [("x", [1, c_in, size, size])], [("y", [1, c_out, out, out])], inits, threads)
        node, inits, _, _ = conv_node(c_in, c_out, groups, kernel, stride, block, "xb", "yb", rng)
        reordered = session([helper.make_node("ReorderInput", ["x"], ["xb"], domain=NCHWC, channels_last=1), node,
                             helper.make_node("ReorderOutput", ["yb"], ["y"], domain=NCHWC, channels=c_out,
                                              channels_last=1)],
                            [("x", [1, size, size, c_in])], [("y", [1, out, out, c_out])], inits, threads)
        x = torch.randn(1, c_in, size, size).contiguous(memory_format=torch.channels_last)
        pads, strides = [kernel // 2] * 2, [stride] * 2
        packed = torch.ops.mkldnn._reorder_convolution_weight(torch.from_numpy(weight), pads, strides, [1, 1],
                                                               groups, x.size())
        b = torch.from_numpy(bias)
        with torch.no_grad():
            onednn = median_us(lambda: torch.ops.mkldnn._convolution_pointwise(
                x, packed, b, pads, strides, [1, 1], groups, "hardtanh", [0.0, 6.0], ""), calls)
        rows.append({"shape": f"{c_in}->{c_out} {kernel}x{kernel}" + (" depthwise" if groups > 1 else "")
                     + (f" stride {stride}" if stride > 1 else "") + f" at {size}x{size}",
                     "nchwc_blocked_us": round(median_us(bound(blocked, (1, c_in, size, size), (1, c_out, out, out),
                                                              rng), calls), 1),
                     "nchwc_channels_last_us": round(median_us(bound(reordered, (1, size, size, c_in),
                                                                    (1, out, out, c_out), rng), calls), 1),
                     "onednn_channels_last_us": round(onednn, 1)})
        print(rows[-1], flush=True)
    identity = session([helper.make_node("Identity", ["x"], ["y"])], [("x", [1])], [("y", [1])], {}, threads)
    rows.append({"shape": "Identity of one value", "run_us": round(median_us(bound(identity, (1,), (1,), rng), calls), 1)})
    print(rows[-1])
    return rows


def main(argv=None) -> int:
    import korch  # noqa: F401  (before torch: korch settles OpenMP's waiting)

    from korch import bench

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    errors = {block: matches(block, args.threads) for block in (8, 16)}
    print(errors)
    block = next((b for b, e in errors.items() if max(e.values()) < 1e-3), None)
    rows = timed(block, args.threads, args.calls) if block else []
    bench.write_record(bench.record("ONNX Runtime's nchwc convolutions named directly", "benchmarks/ort_nchwc_direct.py",
                                    argv, errors_by_block=errors, block=block, rows=rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
