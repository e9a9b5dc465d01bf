"""A model's 1x1 convolutions through each product a CPU executable could call, summed over the model.

Each distinct pointwise convolution (1x1, stride 1, one group) of an ONNX model is timed, alone, as:
``bmm NCHW`` (``W @ X`` over an NCHW value, korch's product for NCHW values: MKL), ``bmm NHWC`` (``X @ W^T``
over a channels-last value, korch's product for channels-last values: MKL), ``oneDNN linear`` (the weight
packed once, ``torch.ops.mkldnn._linear_pointwise``, channels-last), ``MLAS`` (ONNX Runtime's product,
``backends/ort_gemm.py``, channels-last) and, where torch has MKL, ``MKL packed`` (``korch_ort::mkl_matmul``, the
weight packed for MKL on its first call, channels-last). Medians of calls from Python, so each includes a few microseconds
of dispatch; the sums weigh each shape by how often the model has it.

    python benchmarks/pointwise_conv_paths.py MODEL.onnx [--threads 2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def pointwise_shapes(path: str) -> collections.Counter:
    """(batch, C_in, C_out, height, width) of each 1x1 convolution, with its count."""
    import onnx
    from onnx import helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(path))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*model.graph.value_info, *model.graph.input)}
    weights = {i.name: list(i.dims) for i in model.graph.initializer}
    found = collections.Counter()
    for node in model.graph.node:
        if node.op_type != "Conv" or node.input[1] not in weights or node.input[0] not in shapes:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        w, x = weights[node.input[1]], shapes[node.input[0]]
        if w[2:] == [1, 1] and attrs.get("group", 1) == 1 and set(attrs.get("strides", [1])) == {1} \
                and not any(attrs.get("pads", [0])):
            found[(x[0], w[1], w[0], x[2], x[3])] += 1
    return found


def median_s(fn, calls: int = 100) -> float:
    from interleaved_ort import round_median_s  # beside this script

    round_median_s(fn, 10)  # warm-up
    return round_median_s(fn, calls)


def paths(batch: int, c_in: int, c_out: int, height: int, width: int, slot: int, unit: int) -> dict[str, float]:
    import torch

    from korch.backends import ort_gemm

    x = torch.randn(batch, c_in, height, width)
    w = torch.randn(c_out, c_in)
    pixels = x.contiguous(memory_format=torch.channels_last).movedim(1, -1).reshape(batch, -1, c_in)
    columns = w.t().contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, pixels.shape[1] * batch)
    rows = pixels.reshape(-1, c_in)
    reference = torch.bmm(pixels, w.t().expand(batch, c_in, c_out))
    got = ort_gemm.ops().matmul(pixels, columns, unit, slot)
    if not torch.allclose(got, reference, rtol=1e-4, atol=1e-3):
        raise AssertionError(f"MLAS's product differs for {c_in}->{c_out} at {height}x{width}")
    times = {
        "bmm NCHW": median_s(lambda: torch.bmm(w.expand(batch, c_out, c_in), x.reshape(batch, c_in, -1))),
        "bmm NHWC": median_s(lambda: torch.bmm(pixels, w.t().expand(batch, c_in, c_out))),
        "oneDNN linear": median_s(lambda: torch.ops.mkldnn._linear_pointwise(rows, packed, None, "none", [], "")),
        "MLAS": median_s(lambda: ort_gemm.ops().matmul(pixels, columns, unit, slot)),
    }
    if torch._C.has_mkl:  # its own slot: a slot keeps the first weight it was called with
        if not torch.allclose(ort_gemm.ops().mkl_matmul(pixels, columns, unit + 1, slot), reference, rtol=1e-4,
                              atol=1e-3):
            raise AssertionError(f"MKL's packed product differs for {c_in}->{c_out} at {height}x{width}")
        times["MKL packed"] = median_s(lambda: ort_gemm.ops().mkl_matmul(pixels, columns, unit + 1, slot))
    return times


def main(argv=None) -> int:
    import torch

    from korch.backends import ort_gemm
    from korch.runtime import bundle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    ort_gemm.open_library()
    unit = random.getrandbits(62)
    rows, totals = [], collections.Counter()
    for slot, (shape, count) in enumerate(sorted(pointwise_shapes(args.model).items())):
        times = paths(*shape, slot=slot, unit=unit)
        rows.append({"shape": dict(zip(("batch", "c_in", "c_out", "height", "width"), shape)), "count": count,
                     "us": {k: v * 1e6 for k, v in times.items()}})
        totals.update({k: v * count * 1e3 for k, v in times.items()})
        print(f"{shape[1]}->{shape[2]} at {shape[3]}x{shape[4]} x{count}: "
              + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in times.items()), flush=True)
    print(f"{sum(r['count'] for r in rows)} pointwise convolutions, summed: "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in totals.items()))
    if args.out:
        result = {"benchmark": "pointwise convolutions through each product", "model": args.model,
                  "threads": args.threads, "date": time.strftime("%Y-%m-%d"), "versions": bundle.versions(),
                  "command": " ".join(["python", "benchmarks/pointwise_conv_paths.py", *sys.argv[1:]]),
                  "total_ms": dict(totals), "rows": rows}
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
