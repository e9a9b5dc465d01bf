"""Regenerate BENCHMARKS.md: every zoo model optimized by korch and timed against its peers.

For each model: ``korch optimize`` (the time it took is recorded, next to the
Korch paper's tuning hours on a GPU), the self-check against ONNX Runtime, then
``korch bench`` against eager PyTorch, torch.compile and ONNX Runtime in one
process. Results go to ``benchmarks/results/zoo_<target>_<cost>.json`` and the
table for the target in ``BENCHMARKS.md`` is rewritten (other targets' tables
are kept).

    python benchmarks/zoo_bench.py --target cpu --cost measured --db /tmp/p.sqlite
    python benchmarks/zoo_bench.py --target h100 --models candy,yolov4 --against eager,compile,compile-max-autotune,ort
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The Korch paper's tuning time per model (hours; its evaluation table, batch 1, V100/A100).
PAPER_TUNING_HOURS = {"candy": 5.5, "efficientvit": 11.5, "yolov4": 12.2, "yolox_nano": 2.8, "segformer_b0": 9.2}


def run_model(model: str, target: str, cost: str, db: str | None, peers: list[str], budget: float, jobs,
              precision: str | None = None, torch_model=None, time_limit: float | None = None) -> dict:
    """``korch optimize`` of ``model`` (``zoo:NAME`` or an ONNX path), timed, loaded back, checked and benched;
    the PyTorch peers run ``torch_model`` (an ``nn.Module``; default: what ``model`` names)."""
    from korch import bench
    from korch.pipeline import optimize
    from korch.runtime.load import load

    with tempfile.TemporaryDirectory(prefix="korch-bench-") as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        compiled = optimize(model, output=out, target=target, cost=cost, db=db, jobs=jobs, precision=precision,
                            time_limit=time_limit)
        optimize_s = time.perf_counter() - start
        start = time.perf_counter()
        executable = load(out)
        load_s = time.perf_counter() - start
        result = bench.bench(executable, model=model if torch_model is None else torch_model,
                             reference_model=compiled.reference, peers=peers, target=target, budget_s=budget)
        in_place = kernels_in_place(executable, compiled.plan, compiled.graph)
    plan = compiled.plan
    gap = {"optimal": all(s.optimal for s in plan.segments), "gap": max((s.gap for s in plan.segments), default=0.0)}
    return {**result.to_json(), "optimize_s": optimize_s, "load_s": load_s, "kernels": len(plan.kernels),
            "plan": gap, "kernels_in_place": in_place,
            "cost": cost, "runs": compiled.manifest["runs"], "unit": compiled.manifest.get("unit"),
            "predicted_s": plan.predicted_latency_s,
            "check": compiled.executable.check.to_json(),
            "measurement": {k: v for k, v in plan.stats.get("measurement", {}).items() if k != "failures"}}


def kernels_in_place(executable, plan, graph, worst: int = 30) -> dict:
    """Each kernel's time as the executable runs it (``runtime/kernel_times.py``) beside the plan's cost for it:
    the totals (and the sum less the timing events' own time), the sums per backend, the ``worst`` kernels by
    how far the two differ, and the bytes each kernel reads and writes (``graph``: the primitive graph) and the
    rate at which the memory-bound ones move them (``memory_bound``). A compiled unit, or a failure (this runs
    on GPUs where nothing else tried it), is recorded as ``error``."""
    import torch

    from korch.errors import one_line
    from korch.runtime.kernel_times import kernel_times, stamp_cost_s
    from korch.runtime.selfcheck import seeded_inputs

    try:
        feeds = seeded_inputs(executable.input_specs)
        times = kernel_times(executable, [torch.from_numpy(feeds[n]) for n in executable.input_names])
        stamp_s = stamp_cost_s(executable.device)
    except Exception as exc:
        return {"error": one_line(exc)}
    rows = [{"name": k.name, "ops": k.ops[:80], "backend": k.backend, "launches": k.launches, "measured": k.measured,
             "predicted_s": k.cost_s, "bound_s": k.bound_s, "run_s": run,
             "bytes": sum(graph.tensors[t].nbytes for t in (*k.inputs, *k.outputs))}
            for k, run in zip(plan.kernels, times)]
    by_backend: dict[str, dict] = {}
    for r in rows:
        sums = by_backend.setdefault(r["backend"] or "-", {"kernels": 0, "predicted_s": 0.0, "run_s": 0.0})
        sums["kernels"] += 1
        sums["predicted_s"] += r["predicted_s"]
        sums["run_s"] += r["run_s"]
    # each kernel's run_s holds one event's time (stamp_s): the sum less those is what the kernels ran
    return {"predicted_s": sum(r["predicted_s"] for r in rows), "run_s": sum(times), "stamp_s": stamp_s,
            "run_less_stamps_s": max(sum(times) - stamp_s * len(times), 0.0), "by_backend": by_backend,
            "memory_bound": memory_bound(rows, stamp_s),
            "worst": sorted(rows, key=lambda r: -abs(r["run_s"] - r["predicted_s"]))[:worst]}


MATRIX_OPS = ("MatMul", "Conv", "Gemm")  # a kernel with one of these may be bound by arithmetic, not memory
LARGE_BYTES = 1 << 20  # under this a kernel's time is mostly its launch, not its bytes


def memory_bound(rows: list[dict], stamp_s: float) -> dict:
    """The kernels without a matrix product or convolution that move at least ``LARGE_BYTES``: how many, their
    bytes and seconds (less one timing event each), and the rate (issue 16: at least 80% of the copy bandwidth)."""
    large = [r for r in rows if r["bytes"] >= LARGE_BYTES and not any(op in r["ops"] for op in MATRIX_OPS)]
    seconds = sum(max(r["run_s"] - stamp_s, 0.0) for r in large)
    moved = sum(r["bytes"] for r in large)
    return {"kernels": len(large), "bytes": moved, "run_s": seconds, "Bps": moved / seconds if seconds else None}


def search_gap(row: dict) -> str:
    """`` (gap G%)`` after the optimize seconds of a plan its search did not prove optimal (a time limit)."""
    plan = row.get("plan", {})
    return "" if plan.get("optimal", True) else f" (gap {plan['gap']:.1%})"


def table(rows: list[dict], peers: list[str]) -> str:
    head = ["model", "korch ms", "predicted ms", *[f"{p} ms" for p in peers], *[f"vs {p}" for p in peers],
            "kernels", "runs as", "optimize s", "load s", "paper tuning h", "max rel err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model'].removeprefix('zoo:')} | failed: {r['error']} |")
            continue
        timings = {p["name"]: p["median_s"] for p in r["peers"]}
        k = r["korch"]["median_s"]
        predicted = f"{r['predicted_s'] * 1e3:.2f}" + ("" if r["cost"] == "measured" else " (floor)")
        cells = [r["model"].removeprefix("zoo:"), f"{k * 1e3:.2f}", predicted,
                 *[f"{timings[p] * 1e3:.2f}" if p in timings else "failed" for p in peers],
                 *[f"{timings[p] / k:.2f}x" if p in timings else "-" for p in peers],
                 str(r["kernels"]), r.get("runs", "kernel by kernel"), f"{r['optimize_s']:.0f}" + search_gap(r),
                 f"{r['load_s']:.2f}" if "load_s" in r else "-",
                 str(PAPER_TUNING_HOURS.get(r["model"].removeprefix("zoo:"), "-")), f"{r['check']['max_rel']:.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def update_benchmarks_md(target: str, cost: str, rows: list[dict], peers: list[str], command: str) -> Path:
    from korch.fsutil import atomic_write_bytes

    path = ROOT / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else (
        "# Benchmarks\n\nRegenerated by `benchmarks/zoo_bench.py`; raw results in `benchmarks/results/`. "
        "Latencies are medians after warm-up, every system in one process on the same inputs, the systems taking "
        "turns over 5 rounds (`korch bench`); `vs X` is X's latency over korch's (above 1: korch is faster).\n")
    done = [r for r in rows if "error" not in r]
    first = max(done, key=lambda r: r["date"])  # the newest run's machine and versions; older rows say their date
    dates = sorted({r["date"] for r in done})
    when = dates[0] if len(dates) == 1 else f"{dates[-1]} (rows from {', '.join(dates[:-1])} kept from earlier runs)"
    section = (f"## {target}, {cost} costs\n\n"
               f"- machine: {first['device']}; date {when}; versions: "
               + ", ".join(f"{k} {v}" for k, v in first["versions"].items())
               + f"\n- command: `{command}`\n\n{table(rows, peers)}\n")
    pattern = re.compile(rf"^## {re.escape(target)}, {re.escape(cost)} costs\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda m: section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    return atomic_write_bytes(path, text.encode())


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from korch import zoo
    from korch.fsutil import atomic_write_bytes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--cost", default="measured")
    parser.add_argument("--db")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--models", help="comma-separated zoo names (default: all)")
    parser.add_argument("--against", default="eager,compile,ort")
    parser.add_argument("--budget", type=float, default=2.0)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "tf32"))
    parser.add_argument("--time-limit", type=float, help="seconds for each model's search (default: none)")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else [m.name for m in zoo.list_models()]
    peers = args.against.split(",")
    suffix = "" if args.precision == "fp32" else f"_{args.precision}"
    out = ROOT / "benchmarks" / "results" / f"zoo_{args.target}_{args.cost}{suffix}.json"
    rows = json.loads(out.read_text()) if out.exists() else []
    for name in names:
        print(f"{name}: optimize ({args.cost}) and bench ...", flush=True)
        try:
            row = run_model(f"zoo:{name}", args.target, args.cost, args.db, peers, args.budget, args.jobs,
                            args.precision, time_limit=args.time_limit)
        except Exception as exc:  # a model that fails is recorded and the run goes on
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            row = {"model": f"zoo:{name}", "error": f"{type(exc).__name__}: {first}"}
        rows = [r for r in rows if r["model"] != row["model"]] + [row]
        atomic_write_bytes(out, json.dumps(rows, indent=1).encode())
        print(table([row], peers), flush=True)
    order = {f"zoo:{m.name}": i for i, m in enumerate(zoo.list_models())}
    rows.sort(key=lambda r: order.get(r["model"], 99))
    command = "python benchmarks/zoo_bench.py " + " ".join(sys.argv[1:])
    written = update_benchmarks_md(args.target, args.cost + suffix.replace("_", ", "), rows, peers, command)
    print(f"wrote {out} and {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
