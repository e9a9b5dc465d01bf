"""``korch optimize --estimate``: what a measured search would compile and time, and in how many minutes,
before it runs; for a GPU target, before a GPU is lent.

The model's candidates are enumerated as ``korch optimize`` enumerates them, and each distinct candidate
kernel (signature) is asked of every backend of the target. A Triton kernel is compiled once per launch
variant, an Inductor kernel once, a library kernel not at all; every kernel each backend built is then timed on
the device, one at a time, at the seconds a kernel's timing took on an H200 as a search's workers time it
(``TIMING_S_BY_BACKEND``: its launch variants tuned, its inputs laid out, its runs captured and replayed,
not only the timer's budget of ``timing.BUDGET_S`` plus warm-up a variant first assumed). Compile seconds per
Triton kernel class are measured here on a sample, compiled for the target's architecture in spawned processes
(``backends/triton/ahead.py``); an Inductor kernel is charged the mean of those (Inductor cannot generate GPU
code without a GPU). Compiles spread over ``jobs`` cores of the machine the search will run on.

Two bounds: every signature measured (what the search does while floors are loose: it measures ahead every
column still in reach of a cheaper plan, nearly all of them, docs/orchestration.md), and the roofline plan's
kernels alone (one round of the lazy search, the least it can do).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

# a GPU target's compute capability, as Triton compiles for it
ARCHITECTURES = {"h100": 90, "h200": 90, "a100": 80, "v100": 70}
# Triton kernels compiled per class to time its compiles
SAMPLE_PER_CLASS = 3
# Seconds to time one kernel (a candidate as one backend built it) on an H200, by backend, as the search's build
# workers time since each draws its random inputs once (measure._worker_arena): the campaign's search_timer, four
# of Candy's kernels per backend, less drawing the inputs (benchmarks/results/gpu_2026-11-30/facts.json). A Triton
# kernel's is the tuning of its two launch variants alone (0.0730 s and 0.0006 of the rest): the winner's timing
# is the kernel's since (launch.TritonKernel.tune), where it was timed again (0.031 s). The searches of that
# session, drawing a fresh arena for every kernel, spent 0.39-0.62 s a kernel (0.39 in the fourth's, an H100)
TIMING_S_BY_BACKEND = {"triton": 0.0736, "inductor": 0.0251, "library": 0.0169}
# Drawing a worker's inputs, once in each (the same file: 0.78 s for the twelve kernels' arena), under the lock
ARENA_S = 0.78


@dataclasses.dataclass(frozen=True)
class Work:
    """Compiles and timed variants of a set of signatures."""

    signatures: int
    compiles: Mapping[str, int]     # by kernel class ("inductor" for Inductor's kernels)
    timed_variants: int
    kernels: Mapping[str, int]      # by backend, the signatures it builds: what the search times

    @property
    def built(self) -> int:
        return sum(self.kernels.values())


@dataclasses.dataclass(frozen=True)
class SearchEstimate:
    model: str
    target: str
    jobs: int
    candidates: int
    every: Work                         # every signature measured
    plan_only: Work                     # the roofline plan's kernels alone
    compile_s: Mapping[str, float]      # mean seconds of one compile, by kernel class
    timing_s: Mapping[str, float]       # seconds to time one kernel on the device, by backend

    def timing_seconds(self, work: Work) -> float:
        return sum(n * self.timing_s[b] for b, n in work.kernels.items()) + self.jobs * ARENA_S

    def minutes(self, work: Work) -> float:
        compiling = sum(n * self.compile_s.get(cls, self.mean_compile_s) for cls, n in work.compiles.items())
        # the build workers compile in parallel; each times its kernels on the device while the others
        # compile, one worker at a time (backends/measure.py): the longer of the two is the search
        return max(compiling / self.jobs, self.timing_seconds(work)) / 60

    @property
    def mean_compile_s(self) -> float:
        return sum(self.compile_s.values()) / len(self.compile_s) if self.compile_s else 0.0

    def describe(self) -> str:
        lines = [f"{self.model} on {self.target}: {self.candidates} candidates, "
                 f"{self.every.signatures} distinct kernels; compile seconds measured here for sm_"
                 f"{ARCHITECTURES[self.target]}: "
                 + ", ".join(f"{cls} {s:.2f}" for cls, s in sorted(self.compile_s.items()))
                 + "; seconds to time a kernel (an H200's): "
                 + ", ".join(f"{b} {t:.3f}" for b, t in self.timing_s.items()) + f"; {self.jobs} cores compiling"]
        for label, work in (("every kernel measured", self.every),
                            ("the roofline plan's kernels only", self.plan_only)):
            compiles = sum(work.compiles.values())
            lines.append(f"  {label}: {work.signatures} kernels, {compiles} compiles "
                         f"({', '.join(f'{c} {n}' for c, n in sorted(work.compiles.items()))}), "
                         f"{work.built} kernels timed ({work.timed_variants} variants): "
                         f"about {self.minutes(work):.1f} min")
        return "\n".join(lines)


@contextlib.contextmanager
def _environment(**values: str):
    """``values`` set in this process's environment (which spawned workers inherit) while active."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _work(kernels: Mapping[str, tuple[str | None, int, Sequence[str]]], signatures) -> Work:
    compiles: Counter = Counter()
    built: Counter = Counter()
    timed = 0
    for s in signatures:
        triton_class, variants, backends = kernels[s]
        if triton_class:
            compiles[triton_class] += variants
            built["triton"] += 1
        if "inductor" in backends:
            compiles["inductor"] += 1
        others = [b for b in ("inductor", "library") if b in backends]  # one variant each
        built.update(others)
        timed += (variants if triton_class else 0) + len(others)
    return Work(len(signatures), dict(compiles), timed, dict(built))


def estimate(model, *, target: str, jobs: int = 16, input_shapes=None, max_kernel_nodes: int | None = None,
             sample: int = SAMPLE_PER_CLASS) -> SearchEstimate:
    """The search ``korch optimize model --target target --cost measured`` would run (see the docstring)."""
    from korch import config
    from korch.backends.registry import BackendPredicate, backends_for
    from korch.backends.triton.ahead import compile_many
    from korch.backends.triton.backend import _attempt
    from korch.errors import KorchError
    from korch.ir.subgraph import extract
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.pipeline import load_model, optimize

    if target not in ARCHITECTURES:
        raise KorchError(f"--estimate is for GPU targets ({', '.join(ARCHITECTURES)}), not {target!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, graph, _ = load_model(model, input_shapes)
        plan = optimize(model, target=target, cost="roofline", plan_only=True, input_shapes=input_shapes,
                        max_kernel_nodes=max_kernel_nodes).plan
    backends = backends_for(target)
    candidates = enumerate_candidates(graph, max_nodes=max_kernel_nodes or config.max_kernel_nodes,
                                      predicate=BackendPredicate(backends)).candidates
    kernels: dict[str, tuple[str | None, int, Sequence[str]]] = {}
    by_class: dict[str, list] = defaultdict(list)
    for candidate in candidates:
        if candidate.signature in kernels:
            continue
        kernel = extract(graph, candidate.nodes, candidate.inputs, candidate.outputs)
        claiming = [b.name for b in backends if b.claims(kernel) is None]
        cls, generated = _attempt(kernel) if "triton" in claiming else (None, None)
        kernels[candidate.signature] = (cls.name if cls else None, len(generated.variants) if cls else 0, claiming)
        if cls:
            by_class[cls.name].append(kernel)
    samples = {cls: ks[:: max(1, len(ks) // sample)][:sample] for cls, ks in by_class.items()}
    flat = [(cls, k) for cls, ks in samples.items() for k in ks]
    with tempfile.TemporaryDirectory() as cache, _environment(TRITON_CACHE_DIR=cache):  # compiles, not cache hits
        results = compile_many([k for _, k in flat], arch=ARCHITECTURES[target], jobs=min(len(flat), 2) or None)
    seconds: dict[str, list[float]] = defaultdict(list)
    for (cls, _), result in zip(flat, results):
        if result.status == "compiled":
            seconds[cls].append(result.seconds)
    compile_s = {cls: sum(v) / len(v) for cls, v in seconds.items()}
    planned = {k.signature for k in plan.kernels} & kernels.keys()
    return SearchEstimate(graph.name, target, jobs, len(candidates), _work(kernels, list(kernels)),
                          _work(kernels, sorted(planned)), compile_s, TIMING_S_BY_BACKEND)

