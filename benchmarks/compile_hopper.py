"""Compile every Triton-claimed candidate of the paper's models for Hopper, without a GPU.

For each model: enumerate the candidate kernels of the H100 target, ask korch's
Triton generator which it claims, generate each distinct kernel (by signature)
and compile it for sm_90 (``triton.compile(..., target=GPUTarget("cuda", 90, 32))``).
Reports candidates, claimed (share), compiled (share of claimed), by kernel
class, and the main refusal and failure reasons, as Markdown and JSON.

    python benchmarks/compile_hopper.py                    # all five paper models
    python benchmarks/compile_hopper.py --models candy --sample 50
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import random
import sys
import time

PAPER_MODELS = ["candy", "efficientvit", "yolov4", "yolox_nano", "segformer_b0"]


def survey(model: str, sample: int | None, jobs: int, seed: int = 0) -> dict:
    from korch.backends.registry import BackendPredicate, backends_for
    from korch.backends.triton.ahead import compile_many
    from korch.backends.triton.backend import TritonBackend
    from korch.ir.subgraph import extract
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.pipeline import load_model

    _, graph, _ = load_model(f"zoo:{model}")
    candidates = enumerate_candidates(graph, predicate=BackendPredicate(backends_for("h100"))).candidates
    triton = TritonBackend()
    claimed, refusals = {}, collections.Counter()
    count_by_signature = collections.Counter(c.signature for c in candidates)
    for c in candidates:
        if c.signature in claimed:
            continue
        kernel = extract(graph, c.nodes, c.inputs, c.outputs)
        reason = triton.claims(kernel)
        if reason is None:
            claimed[c.signature] = kernel
        else:
            refusals[reason] += count_by_signature[c.signature]
    signatures = sorted(claimed)
    if sample is not None and sample < len(signatures):
        signatures = random.Random(seed).sample(signatures, sample)
    results = compile_many([claimed[s] for s in signatures], jobs=jobs)
    by_class = collections.defaultdict(collections.Counter)
    failures = collections.Counter()
    for r in results:
        by_class[r.kernel_class][r.status] += 1
        if r.status != "compiled":
            failures[r.reason] += 1
    return {
        "model": model, "candidates": len(candidates),
        "claimed": sum(count_by_signature[s] for s in claimed), "distinct_claimed": len(claimed),
        "tried": len(signatures), "compiled": sum(1 for r in results if r.status == "compiled"),
        "compile_seconds": sum(r.seconds for r in results),
        "by_class": {k: dict(v) for k, v in by_class.items()},
        "refusals": dict(refusals.most_common(8)), "failures": dict(failures.most_common(8)),
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# Triton kernels compiled for Hopper (sm_90) without a GPU", "",
             f"- date {meta['date']}, host {meta['host']}, triton {meta['triton']}, torch {meta['torch']}",
             f"- command: `{meta['command']}`", "",
             "| model | candidates | claimed by Triton | share | distinct kernels claimed | compiled | tried | "
             "share compiled |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['candidates']} | {r['claimed']} | {r['claimed'] / max(r['candidates'], 1):.0%} "
                     f"| {r['distinct_claimed']} | {r['compiled']} | {r['tried']} | "
                     f"{r['compiled'] / max(r['tried'], 1):.0%} |")
    for r in rows:
        lines += ["", f"## {r['model']}", "", "| class | compiled | failed |", "| --- | ---: | ---: |"]
        for cls, counts in sorted(r["by_class"].items()):
            lines.append(f"| {cls} | {counts.get('compiled', 0)} | {sum(v for k, v in counts.items() if k != 'compiled')} |")
        if r["refusals"]:
            lines += ["", "Refused (candidates): " + "; ".join(f"{k} ({v})" for k, v in r["refusals"].items())]
        if r["failures"]:
            lines += ["", "Failures: " + "; ".join(f"{k} ({v})" for k, v in r["failures"].items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(PAPER_MODELS))
    parser.add_argument("--sample", type=int, default=None, help="compile at most this many distinct kernels per model")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="benchmarks/results/triton_hopper_compile")
    args = parser.parse_args(argv)
    import torch
    import triton

    from korch.fsutil import atomic_write_bytes

    rows = []
    for model in args.models.split(","):
        start = time.perf_counter()
        rows.append(survey(model, args.sample, args.jobs))
        print(f"{model}: {rows[-1]['compiled']}/{rows[-1]['tried']} compiled, {rows[-1]['claimed']}/"
              f"{rows[-1]['candidates']} claimed ({time.perf_counter() - start:.0f} s)", flush=True)
    meta = {"date": datetime.date.today().isoformat(), "host": f"{platform.node()} ({os.cpu_count()} cores, no GPU)",
            "triton": triton.__version__, "torch": torch.__version__,
            "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])])}
    atomic_write_bytes(args.out + ".json", json.dumps({"meta": meta, "models": rows}, indent=1).encode())
    atomic_write_bytes(args.out + ".md", markdown(rows, meta).encode())
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
