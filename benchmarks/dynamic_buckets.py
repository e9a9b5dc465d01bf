"""What serving a range of sizes costs: one ``--dynamic seq=LOW..HIGH`` executable against executables built
for one size each, and ONNX Runtime, on the zoo's ``hf_bert`` (BertModel, BERT-mini size) exported with a
symbolic sequence length.

For each size asked: the dynamic executable's largest error against ONNX Runtime, then korch dynamic, korch
built for exactly that size, and ONNX Runtime (2 threads, all graph optimisations) timed in turns in this
one process (medians of rounds). The bucket overhead is dynamic / static. Also the build's seconds per
bucket. Writes ``benchmarks/results/dynamic_buckets_cpu.json`` and prints a table.

    python benchmarks/dynamic_buckets.py --range 1..512 --sizes 1,37,128,512
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import korch  # noqa: E402  (before torch: korch settles OpenMP's waiting)
import numpy as np  # noqa: E402
import torch  # noqa: E402


def export_dynamic_bert(path: Path, high: int) -> Path:
    from korch.frontend.torch_module import export_module
    from korch.zoo import hf

    torch.manual_seed(0)
    model = hf.bert().eval()
    ids = torch.randint(0, hf.VOCAB, (1, min(16, high)))
    seq = torch.export.Dim("seq", min=1, max=high)
    return export_module(model, (ids,), path, input_names=["input_ids"], dynamic_shapes={"x": {1: seq}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--range", default="1..512", help="LOW..HIGH of the sequence length")
    parser.add_argument("--sizes", default="1,37,128,512", help="sizes checked and timed")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.4, help="seconds per system per round")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dynamic_buckets_cpu.json")
    args = parser.parse_args()
    low, high = (int(x) for x in args.range.split(".."))
    sizes = [int(s) for s in args.sizes.split(",")]

    import onnxruntime as ort

    from korch.backends.timing import take_turns, time_kernel
    from korch.dynamic import optimize_dynamic
    from korch.ir import ort as korch_ort
    from korch.pipeline import Progress, optimize

    work = Path(tempfile.mkdtemp(prefix="korch-dynamic-bench-"))
    model = export_dynamic_bert(work / "bert_dynamic.onnx", high)
    stages: list[tuple[str, float]] = []
    start = time.perf_counter()

    def stage(name: str) -> None:
        stages.append((name, time.perf_counter() - start))
        print(f"{time.perf_counter() - start:7.1f} s  {name}", flush=True)

    built = optimize_dynamic(str(model), ("seq", low, high), output=work / "dynamic", cost="roofline",
                             progress=Progress(on_stage=stage))
    build_s = time.perf_counter() - start
    dynamic = built.executable
    session = korch_ort.session(model.read_bytes(), True, threads=2)  # as the zoo table's peer runs it
    rows = []
    for size in sizes:
        ids = np.random.default_rng(size).integers(0, 8192, (1, size)).astype(np.int64)
        expected = session.run(None, {"input_ids": ids})[0]
        got = dynamic.run({"input_ids": ids})["output"]
        max_rel = float(np.abs(got - expected).max() / np.abs(expected).max())
        t0 = time.perf_counter()
        static = optimize(str(model), output=work / f"static_{size}", target="cpu", cost="roofline",
                          input_shapes={"seq": size}).executable
        static_build_s = time.perf_counter() - t0
        x = torch.from_numpy(ids)
        systems = {"korch dynamic": lambda: dynamic(x), "korch static": lambda: static(x),
                   "onnxruntime": lambda: session.run(None, {"input_ids": ids})}

        def median_s(name: str, round_: int) -> float:
            fn = systems[name]
            return time_kernel(lambda i: fn(), device="cpu", budget_s=args.budget, min_repeats=3,
                               warmup=2 if round_ == 0 else 0, warmup_s=0.0).median_s

        with torch.inference_mode():
            medians = take_turns(list(systems), median_s, args.rounds)
        ms = {name: float(np.median(m)) * 1e3 for name, m in medians.items()}
        bucket = next(b for b in built.manifest["buckets"] if b["low"] <= size <= b["high"])
        row = {"seq": size, "bucket": f"{bucket['low']}..{bucket['high']}", "max_rel_vs_ort": max_rel,
               "ms": {k: round(v, 4) for k, v in ms.items()},
               "dynamic_over_static": round(ms["korch dynamic"] / ms["korch static"], 3),
               "ort_over_dynamic": round(ms["onnxruntime"] / ms["korch dynamic"], 3),
               "static_build_s": round(static_build_s, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "benchmark": "dynamic_buckets", "model": "zoo hf_bert (BertModel, hidden 256, 4 layers), seq symbolic",
        "range": [low, high], "date": datetime.date.today().isoformat(),
        "device": f"{platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}",
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "onnxruntime": ort.__version__,
                     "korch": korch.__version__},
        "command": "python benchmarks/dynamic_buckets.py " + " ".join(sys.argv[1:]),
        "build_s": round(build_s, 1), "stages": [[n, round(s, 1)] for n, s in stages],
        "buckets": [{k: b[k] for k in ("low", "high", "kernels", "predicted_ms", "unit")} | {
            "max_rel": b["check"]["max_rel"]} for b in built.manifest["buckets"]],
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n| seq | bucket | max rel vs ORT | korch dynamic ms | korch static ms | ORT ms | dynamic/static |")
    for r in rows:
        print(f"| {r['seq']} | {r['bucket']} | {r['max_rel_vs_ort']:.2g} | {r['ms']['korch dynamic']:.3f} | "
              f"{r['ms']['korch static']:.3f} | {r['ms']['onnxruntime']:.3f} | {r['dynamic_over_static']:.2f} |")
    print(f"wrote {args.out}; build {build_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
