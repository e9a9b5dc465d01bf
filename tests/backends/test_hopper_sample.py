"""A representative sample of the paper models' Triton-claimed candidates compiles for Hopper (sm_90) without a GPU.

The full survey (every claimed candidate of the five models) is
``benchmarks/compile_hopper.py``; its results are in docs/backends.md. Here: up to
``PER_CLASS`` distinct kernels of each kernel class per model, chosen with a
fixed seed.
"""

import collections
import random

import pytest

from korch.backends.registry import BackendPredicate, backends_for
from korch.backends.triton.ahead import compile_many
from korch.backends.triton.backend import kernel_classes
from korch.ir.subgraph import extract
from korch.orchestrate.candidates import enumerate_candidates
from korch.pipeline import load_model

PER_CLASS = 3


def _sample(model: str):
    _, graph, _ = load_model(f"zoo:{model}")
    candidates = enumerate_candidates(graph, predicate=BackendPredicate(backends_for("h100"))).candidates
    by_class = collections.defaultdict(dict)
    for c in candidates:
        kernel = extract(graph, c.nodes, c.inputs, c.outputs)
        cls = next((k for k in kernel_classes() if k.claims(kernel) is None), None)
        if cls is not None:
            by_class[cls.name].setdefault(c.signature, (cls, kernel))
    rng = random.Random(0)
    return {name: [kernels[s] for s in rng.sample(sorted(kernels), min(PER_CLASS, len(kernels)))]
            for name, kernels in sorted(by_class.items())}


@pytest.mark.parametrize("model", ["candy", "segformer_b0", "yolox_nano"])
def test_sampled_candidates_compile_for_hopper(model):
    sample = _sample(model)
    assert {"pointwise", "reduction"} & set(sample), f"no Triton kernel class claims anything in {model}"
    kernels = [kernel for chosen in sample.values() for _, kernel in chosen]
    results = compile_many(kernels, jobs=2)
    failures = [f"{r.kernel_class} {'+'.join(n.op.value for n in k.nodes)}: {r.status}: {r.reason}"
                for k, r in zip(kernels, results) if r.status != "compiled"]
    assert not failures, "\n".join(failures)
    assert len(results) >= 2
    # every pointer argument is compiled as the JIT specialises it (16-byte aligned): the cubin is the one it runs
    assert all(r.aligned_args >= r.pointer_args > 0 for r in results), [(r.aligned_args, r.pointer_args)
                                                                       for r in results]
