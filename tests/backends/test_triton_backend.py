"""The Triton backend: dispatch among kernel classes, refusals, Hopper compilation, and real zoo candidates."""

import collections
import random

import pytest
import triton
from onnx import helper

from korch.backends.base import BuildError
from korch.backends.check import check
from korch.backends.triton import backend as triton_backend
from korch.backends.triton.ahead import compile_generated as compile_for_hopper
from korch.backends.triton.backend import TritonBackend, kernel_class_of
from korch.backends.triton.kernel_class import KernelClass, Refuse
from korch.backends.triton.launch import TritonKernel, compile_for_target
from korch.backends.triton.pointwise import POINTWISE
from korch.backends.triton.reduction import REDUCTION
from korch.backends.triton.window import WINDOW
from tests.backends import (
    test_triton_pointwise,
    test_triton_reduction,
    test_triton_window,
)
from tests.backends.kernels import check_built, kernel

MINE = {"pointwise": POINTWISE, "reduction": REDUCTION, "window": WINDOW}
ALL_CASES = {f"{module.__name__.rsplit('_', 1)[-1]}:{name}": (cls, make)
             for module, cls in ((test_triton_pointwise, POINTWISE), (test_triton_reduction, REDUCTION),
                                 (test_triton_window, WINDOW))
             for name, make in {**module.CASES, **getattr(module, "COMPILE_ONLY", {})}.items()}


def test_backend_identity_and_devices():
    backend = TritonBackend()
    assert backend.name == "triton" and backend.version.startswith(triton.__version__)
    assert backend.supports_device("cuda") and backend.supports_device("cpu")  # tests run the interpreter


def test_backend_dispatches_to_the_class_that_claims():
    backend = TritonBackend()
    softmax = test_triton_reduction.CASES["softmax_last_axis"]()
    assert backend.claims(softmax) is None and kernel_class_of(softmax) == "reduction"
    built = backend.build(softmax, "cpu")
    assert built.generated.kernel_class == "reduction"
    check_built(built, softmax)
    assert kernel_class_of(test_triton_window.CASES["max_pool_1d"]()) == "window"
    assert kernel_class_of(test_triton_pointwise.CASES["gelu_tanh"]()) == "pointwise"


def test_backend_reports_the_owning_class_refusal_and_build_raises():
    backend = TritonBackend()
    moved = kernel([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1),
                    helper.make_node("ReduceSum", ["x", "a"], ["t"], keepdims=1)],
                   {"x": (4, 6)}, {"s": (1, 1), "t": (4, 1)}, {"a": __import__("numpy").array([1])})
    assert backend.claims(moved) == "two reduction groups"
    with pytest.raises(BuildError, match="two reduction groups"):
        backend.build(moved, "cpu")


def test_a_class_that_crashes_while_claiming_only_refuses(monkeypatch):
    class Broken(KernelClass):
        name = "broken"

        def generate(self, kernel):
            raise KeyError("bug")

    monkeypatch.setattr(triton_backend, "MATMUL", Broken())
    relu = kernel([helper.make_node("Relu", ["x"], ["y"])], {"x": (3,)}, {"y": (3,)})
    assert kernel_class_of(relu) == "pointwise"


def test_every_class_claims_by_generating():
    class Buggy(KernelClass):
        name = "buggy"

        def generate(self, kernel):
            raise IndexError("bug")

    class Refusing(KernelClass):
        def generate(self, kernel):
            raise Refuse("not mine")

    relu = kernel([helper.make_node("Relu", ["x"], ["y"])], {"x": (3,)}, {"y": (3,)})
    assert Buggy().claims(relu) == "generator error: IndexError" and Refusing().claims(relu) == "not mine"
    assert all(isinstance(cls, KernelClass) for cls in triton_backend.kernel_classes())


def test_no_compile_for_a_gpu_in_a_process_that_interprets():
    relu = kernel([helper.make_node("Relu", ["x"], ["y"])], {"x": (3,)}, {"y": (3,)})
    with pytest.raises(RuntimeError, match="spawned process"):
        compile_for_target(POINTWISE.generate(relu))


def test_every_test_kernel_compiles_for_hopper():
    names = list(ALL_CASES)
    errors = compile_for_hopper([cls.generate(make()) for cls, make in ALL_CASES.values()])
    failed = {name: error for name, error in zip(names, errors) if error}
    assert not failed


# --- real candidates ------------------------------------------------------------------------------

SAMPLE_PER_MODEL = 20
MAX_ELEMENTS = 70_000  # the interpreter is slow: sample kernels whose tensors are small


def _claimed_candidates(model: str):
    from korch.ir.subgraph import extract
    from korch.orchestrate.candidates import enumerate_candidates
    from korch.pipeline import load_model

    _, graph, _ = load_model(f"zoo:{model}")
    candidates = enumerate_candidates(graph).candidates
    claimed, reasons = [], collections.Counter()
    for c in candidates:
        k = extract(graph, c.nodes, c.inputs, c.outputs)
        name = next((n for n, cls in MINE.items() if cls.claims(k) is None), None)
        if name is not None:
            claimed.append((c, k, MINE[name]))
            continue
        kinds = {node.op.kind.value for node in k.nodes}
        owner = "window" if "window" in kinds else "reduction" if "reduce" in kinds else "pointwise"
        if not kinds & {"linear", "opaque"}:
            reasons[MINE[owner].claims(k)] += 1
    return candidates, claimed, reasons


@pytest.mark.parametrize("model", ["candy", "segformer_b0"])
def test_sample_of_real_candidates_generates_checks_and_compiles(model):
    candidates, claimed, reasons = _claimed_candidates(model)
    assert not [r for r in reasons if "generator error" in r or "claims failed" in r]
    assert len(claimed) > len(candidates) // 2
    small = [entry for entry in claimed if max(t.numel for t in entry[1].tensors.values()) <= MAX_ELEMENTS]
    sample = random.Random(0).sample(small, min(SAMPLE_PER_MODEL, len(small)))
    generated = []
    for c, k, cls in sample:
        generated.append(cls.generate(k))
        result = check(TritonKernel(k, generated[-1], "cpu"), k)
        assert result.ok, f"candidate {c.id} ({cls.name}): {result.message}"
    assert compile_for_hopper(generated) == [None] * len(generated)
