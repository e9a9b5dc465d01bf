"""korch's CPU kernels compute float32 exp with ATen's exp_u20 (backends/vector_exp.py): torch's answers on
every edge (NaN, infinities, overflow, underflow) to within its 20 ULP, and never mixed with Inductor's own
code generation through the compilers' caches."""

import math

import pytest
import torch
from torch._inductor.compile_fx import compile_fx
from torch._inductor.utils import run_and_get_code
from torch.fx.experimental.proxy_tensor import make_fx

from korch.backends.inductor import InductorBackend, _cacheable
from korch.backends.vector_exp import fast_vector_exp
from tests.backends import cases
from tests.backends.kernels import check_built

EDGES = [math.nan, math.inf, -math.inf, 88.72, 88.73, 100.0, -86.0, -87.0, -90.0, -103.0, -104.0,
         -0.0, 0.0, 1e-8, 1.0, -1.0, 10.0, -10.0, 30.0, -30.0]
FUNCTIONS = {"exp": torch.exp, "sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu,
             "softmax": lambda x: torch.softmax(x, dim=-1)}


def _values(dtype=torch.float32) -> torch.Tensor:
    # 1000 values: the vector loop and its masked tail both see edges
    x = torch.linspace(-100, 100, 1000 - len(EDGES), dtype=dtype)
    return torch.cat([torch.tensor(EDGES, dtype=dtype), x]).reshape(10, 100)


def _compiled(fn, x: torch.Tensor):
    """``fn`` compiled by Inductor for ``x`` (no shape environment: the FX graph cache is bypassed), and its
    code."""
    graph_module = make_fx(lambda t: (fn(t),))(x)
    compiled, codes = run_and_get_code(compile_fx, graph_module, [x])
    return compiled, "\n".join(codes)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_fast_exp_gives_torchs_answers_on_every_edge(name):
    fn, x = FUNCTIONS[name], _values()
    with fast_vector_exp():
        compiled, code = _compiled(fn, x)
    assert "exp_u20" in code
    (got,) = compiled(x)
    torch.testing.assert_close(got, fn(x), rtol=4e-6, atol=2.4e-38, equal_nan=True)


def test_nan_stays_nan_and_overflow_is_infinite():
    x = torch.tensor([math.nan, 89.0, math.inf, -math.inf] * 8)
    with fast_vector_exp():
        compiled, _ = _compiled(torch.exp, x)
    (got,) = compiled(x)
    assert torch.isnan(got[0::4]).all()
    assert torch.isposinf(got[1::4]).all() and torch.isposinf(got[2::4]).all()
    assert (got[3::4] == 0).all()


def test_float64_keeps_sleefs_exp():
    x = _values(torch.float64)
    with fast_vector_exp():
        compiled, code = _compiled(torch.exp, x)
    assert "exp_u20" not in code
    (got,) = compiled(x)
    torch.testing.assert_close(got, torch.exp(x), equal_nan=True)


def test_inductor_is_as_given_after_the_context_even_after_an_error():
    with pytest.raises(RuntimeError), fast_vector_exp():
        raise RuntimeError("a failed compile")
    _, code = _compiled(torch.sigmoid, _values())
    assert "exp_u20" not in code and ".exp()" in code


def test_the_fx_graph_cache_never_answers_one_code_generation_with_the_other():
    # exp(1) differs in its last bits between the two: the value says which code ran
    x = torch.ones(64)
    graph_module = make_fx(lambda t: (torch.exp(t),))(x)
    results = {}
    for fast in (True, False, True):
        with _cacheable([x]) as fakes, (fast_vector_exp() if fast else torch.no_grad()):
            compiled = compile_fx(graph_module, fakes)
        results.setdefault(fast, set()).add(compiled(x)[0][0].item())
    assert results[False] == {torch.exp(x)[0].item()}
    assert len(results[True]) == 1 and results[True] != results[False]


def test_korchs_inductor_kernels_use_it():
    graph = cases.softmax()
    built = InductorBackend().build(graph, "cpu")
    assert "exp_u20" in built.source
    check_built(built, graph)
