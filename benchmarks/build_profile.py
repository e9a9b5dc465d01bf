"""Where one build worker's time goes: random candidate kernels of a model built and checked as a search's worker
builds them (``measure._worker``, in this process), under ``cProfile``.

Prints one JSON line: kernels, seconds a kernel in all, and a kernel's seconds in each step (korch's trace of the
kernel, Inductor's ``compile_fx`` and within it AOT autograd's tracing, freezing and ``compile_fx_inner``, the
batched C++ compile, the check and within it the comparison with the reference), and how many kernels Inductor
lowered (the rest came from its FX graph cache). The worker's one-off start (imports, the vector-ISA probe) is
spent on two kernels before the profile. Say in the record whether the compilers' caches were warm.

    python benchmarks/build_profile.py zoo:candy [--kernels 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

# (step, where the profile finds it: a function's file suffix and name)
STEPS = {
    "traces (make_fx: korch's, and AOT autograd's inside compile_fx)": ("proxy_tensor.py", "wrapped"),
    "compile_fx": ("compile_fx.py", "compile_fx"),
    "aot stage 2 (freezing, compile_fx_inner)": ("graph_compile.py", "aot_stage2_compile"),
    "freezing": ("_inductor/freezing.py", "freeze"),
    "compile_fx_inner": ("compile_fx.py", "compile_fx_inner"),
    "C++ compile (batched)": ("cpp_batch.py", "compile"),
    "check": ("check.py", "check"),
    "compare": ("check.py", "compare"),
}
LOWERED = ("compile_fx.py", "fx_codegen_and_compile")


def sampled_jobs(model: str, kernels: int, seed: int) -> list:
    """(kernel, backend) for ``kernels`` random signatures of ``model``'s CPU candidates, as a search claims them."""
    from korch.backends.db import ProfileDB
    from korch.backends.measure import KernelMeasurer
    from korch.pipeline import candidate_kernels, load_model

    _, graph, _ = load_model(model)
    candidates = candidate_kernels(graph, "cpu", "measured")
    measurer = KernelMeasurer(graph, candidates.candidates, [0.0] * len(candidates.candidates), target="cpu",
                              db=ProfileDB(None), jobs=1)
    first: dict[str, int] = {}
    for c in candidates.candidates:
        first.setdefault(c.signature, c.id)
    signatures = sorted(first)
    random.Random(seed).shuffle(signatures)
    jobs = []
    for signature in signatures[:kernels]:
        kernel, backends = measurer._claimed(signature, first[signature])
        jobs += [(kernel, b) for b in backends]
    return jobs


def checked_jobs(jobs: list) -> list:
    """(checked, kernel, backend) for each of ``sampled_jobs``'s, built and checked as a build worker does (on
    the heap a worker keeps)."""
    from korch import heap
    from korch.backends.measure import _build_and_check

    heap.keep_freed_memory()
    return [(_build_and_check(backend, kernel, "cpu"), kernel, backend) for kernel, backend in jobs]


def retimed(checked, kernel, backend, arena) -> float:
    """A checked kernel's latency timed again as the measured search times it (``measure._time_checked``)."""
    from korch.backends.measure import _time_checked

    again = dataclasses.replace(checked, latency_s=None)
    _time_checked(again, kernel, backend, arena, "cpu")
    return again.latency_s if again.latency_s is not None else float("nan")


def sampling_parser(doc: str, kernels: int, seed: int) -> argparse.ArgumentParser:
    """The arguments of a script over ``sampled_jobs``: the model, how many signatures, the sample's seed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--kernels", type=int, default=kernels, help="distinct candidate kernels (signatures)")
    parser.add_argument("--seed", type=int, default=seed)
    return parser


def main(argv=None) -> int:
    import torch

    from korch.backends.measure import _worker

    args = sampling_parser(__doc__, kernels=40, seed=0).parse_args(argv)
    jobs = [(kernel, backend.name) for kernel, backend in sampled_jobs(args.model, args.kernels, args.seed)]
    threads = torch.get_num_threads()
    _worker("cpu", jobs[:2], "cpu", "fp32", threads)  # the worker's start: imports, the vector-ISA probe
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    results = _worker("cpu", jobs, "cpu", "fp32", threads)
    profile.disable()
    seconds = time.perf_counter() - started
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, primitive calls, own s, cumulative s, ...)

    def cumulative(where: tuple[str, str]) -> tuple[int, float]:
        found = [(v[1], v[3]) for (file, _, name), v in stats.items() if file.endswith(where[0]) and name == where[1]]
        return sum(n for n, _ in found), sum(s for _, s in found)

    print(json.dumps({
        "model": args.model, "kernels": len(jobs), "built_ok": sum(r.status == "ok" for r in results),
        "seconds_per_kernel": round(seconds / len(jobs), 4),
        "steps_s_per_kernel": {step: round(cumulative(where)[1] / len(jobs), 4) for step, where in STEPS.items()},
        "lowered": cumulative(LOWERED)[0], "threads": threads}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
