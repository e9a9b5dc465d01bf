"""ONNX Runtime as a kernel backend: a model cut into runs of K nodes, each its own session, against the whole.

The Korch paper times candidate kernels with TensorRT beside its own; on a CPU the analogue is ONNX Runtime
running a candidate as a session of its own. Whether that could make korch faster than ONNX Runtime is
measured here: the model's nodes (topological order) are cut into consecutive runs of ``--nodes`` K, each run
becomes a session (its inputs the values it reads from outside, its outputs those read outside it) with all
graph optimisations on, so a run of convolutions still gets the blocked NCHWc layout inside, converted at the
session's edges. The sum of the runs' median times is set against the whole model's, in turns. The operators
ONNX Runtime runs after its optimisations are counted too (``optimized_ops``).

Each session call from Python costs more than a call from a compiled unit would: the cost of calling a one-
element Identity session (``call_us``) is measured and subtracted per run in ``sum_less_calls_ms``.

    python benchmarks/ort_segments.py OUTDIR/reference.onnx --nodes 3 8 1000 --threads 2 --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def _median_ms(session, feeds: dict, calls: int) -> float:
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _options(threads: int, optimize: bool = True):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    return options


def _all_values(model, feeds: dict, threads: int) -> dict[str, np.ndarray]:
    """Every value the model computes at ``feeds`` (its nodes' outputs made graph outputs, no optimisation)."""
    import onnx
    import onnxruntime as ort

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    names = [o for node in exposed.graph.node for o in node.output if o]
    del exposed.graph.output[:]
    exposed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    session = ort.InferenceSession(exposed.SerializeToString(), _options(threads, optimize=False))
    return {**feeds, **dict(zip(names, session.run(None, feeds)))}


def _runs(model, nodes_per_run: int, values: dict[str, np.ndarray]):
    """(sub-model, its feeds) for each run of ``nodes_per_run`` consecutive nodes."""
    from onnx import helper

    graph = model.graph
    constants = {i.name: i for i in graph.initializer}
    nodes = list(graph.node)
    readers: dict[str, set[int]] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, set()).add(index)
    graph_outputs = {o.name for o in graph.output}

    def info(name):
        value = values[name]
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)

    for start in range(0, len(nodes), nodes_per_run):
        members = range(start, min(start + nodes_per_run, len(nodes)))
        part = [nodes[i] for i in members]
        made = {o for node in part for o in node.output}
        inputs = list(dict.fromkeys(n for node in part for n in node.input
                                    if n and n not in made and n not in constants))
        outputs = [o for o in made if o in graph_outputs or readers.get(o, set()) - set(members)]
        used = [constants[n] for n in dict.fromkeys(n for node in part for n in node.input) if n in constants]
        sub = helper.make_graph(part, f"run{start}", [info(n) for n in inputs], [info(n) for n in outputs], used)
        sub_model = helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version)
        yield sub_model, {n: values[n] for n in inputs}


def _call_us(threads: int, calls: int) -> float:
    """One call of a one-element Identity session from Python, in microseconds."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "call",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), _options(threads))
    return _median_ms(session, {"x": np.ones(1, np.float32)}, calls * 10) * 1e3


def optimized_ops(path: str, threads: int) -> dict[str, int]:
    """The operators ONNX Runtime runs after its graph optimisations (its optimized model, saved and read back):
    on a CPU with AVX2 or AVX-512, convolution chains become ``com.microsoft.nchwc`` operators on blocked values."""
    import collections
    import os
    import tempfile

    import onnx
    import onnxruntime as ort

    options = _options(threads)
    with tempfile.TemporaryDirectory(prefix="korch-ort-optimized-") as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        ort.set_default_logger_severity(3)  # its warning: the saved model is for this machine only
        ort.InferenceSession(path, options)
        model = onnx.load(options.optimized_model_filepath)
    counts = collections.Counter(f"{n.domain + ':' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    return dict(counts.most_common())


def measure(path: str, sizes: list[int], threads: int, calls: int, rounds: int) -> dict:
    import onnx
    import onnxruntime as ort

    model = onnx.shape_inference.infer_shapes(onnx.load(path))
    constants = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input if i.name not in constants}
    values = _all_values(model, feeds, threads)
    whole = ort.InferenceSession(model.SerializeToString(), _options(threads))
    cut = {k: [(ort.InferenceSession(m.SerializeToString(), _options(threads)), f) for m, f in _runs(model, k, values)]
           for k in sizes}
    call_us = _call_us(threads, calls)
    whole_ms, sums = [], {k: [] for k in sizes}
    for _ in range(rounds):  # turns: a slow spell of the host hits every row alike
        whole_ms.append(_median_ms(whole, feeds, calls))
        for k, sessions in cut.items():
            sums[k].append(sum(_median_ms(s, f, calls) for s, f in sessions))
    whole_median = statistics.median(whole_ms)
    rows = []
    for k, sessions in cut.items():
        total = statistics.median(sums[k])
        less_calls = total - len(sessions) * call_us / 1e3
        rows.append({"nodes_per_run": k, "runs": len(sessions), "sum_ms": round(total, 3),
                     "sum_less_calls_ms": round(less_calls, 3), "over_whole": round(less_calls / whole_median, 3)})
    return {"model": path, "nodes": len(model.graph.node), "threads": threads, "onnxruntime": ort.__version__,
            "whole_ms": round(whole_median, 3), "call_us": round(call_us, 2), "rows": rows,
            "optimized_ops": optimized_ops(path, threads)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an ONNX file (an OUTDIR's reference.onnx)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[3, 8, 1000], help="nodes per run (K)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per session and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write the result as JSON here too")
    args = parser.parse_args(argv)
    result = measure(args.model, args.nodes, args.threads, args.calls, args.rounds)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
