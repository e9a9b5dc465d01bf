"""Time ``korch optimize --cost roofline`` on the paper's models and the BERT layer (the paper's Table 2).

    .venv/bin/python benchmarks/optimize_times.py [--target h100] > benchmarks/results/optimize_times.md
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
import warnings

import torch

from korch import __version__, zoo
from korch.pipeline import optimize

PAPER = {  # Korch paper, Table 2: primitive nodes, candidates, tuning time
    "candy": (184, 1031, "5.5 h"), "efficientvit": (380, 2174, "11.5 h"), "yolox_nano": (367, 3361, "2.8 h"),
    "yolov4": (569, 4644, "12.2 h"), "segformer_b0": (672, 11400, "9.2 h"),
}
MODELS = ["candy", "efficientvit", "yolov4", "yolox_nano", "segformer_b0", "bert_layer"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="h100")
    parser.add_argument("--models", nargs="*", default=MODELS)
    args = parser.parse_args()
    print(f"korch {__version__}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, {datetime.date.today()}; target {args.target}, cost roofline\n")
    print("| model | primitives (paper) | candidates (paper) | segments (exact) | dropped | kernels "
          "| solver s | total s | proven optimal | paper tuning |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for name in args.models:
        zoo.export(name)  # export time is not part of optimizing
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = optimize(f"zoo:{name}", target=args.target, cost="roofline")
        total = time.perf_counter() - start
        plan = result.plan
        nodes, cands, hours = PAPER.get(name, ("-", "-", "-"))
        exact = sum(s.exact for s in plan.segments)
        print(f"| {name} | {len(result.graph.nodes)} ({nodes}) | {result.candidates} ({cands}) "
              f"| {len(plan.segments)} ({exact}) | {sum(s.dropped for s in plan.segments)} | {len(plan.kernels)} "
              f"| {result.stage_seconds['solve']:.1f} | {total:.1f} | {all(s.optimal for s in plan.segments)} "
              f"| {hours} |", flush=True)


if __name__ == "__main__":
    main()
