"""Every elementwise expression of the Triton table against the reference executor, in the interpreter."""

import numpy as np
import pytest
import torch

from korch.backends.triton import scalar
from korch.backends.triton.loader import load_module
from korch.ir.graph import Attrs, Node
from korch.ir.ops import Op
from korch.ir.interpret import run_node

N = 64
UNARY = [Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RECIPROCAL, Op.TANH, Op.ERF, Op.SIGMOID, Op.RELU,
         Op.SOFTPLUS, Op.FLOOR, Op.CEIL, Op.ROUND, Op.SIGN, Op.SIN, Op.COS, Op.ISNAN, Op.ISINF]
BINARY = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN, Op.EQUAL, Op.LESS, Op.LESS_EQUAL,
          Op.GREATER, Op.GREATER_EQUAL]


def _kernel(op, arity, in_dtype, out_dtype, attrs):
    args = [f"x{i}" for i in range(arity)]
    loads = "".join(f"    x{i} = tl.load(p{i} + offs).to({scalar.tl_dtype(scalar.compute_dtype(in_dtype[i]))})\n"
                    for i in range(arity))
    expr = scalar.expression(op, args, attrs, in_dtype)
    params = ", ".join(f"p{i}" for i in range(arity))
    source = (scalar.PRELUDE + "\n\n@triton.jit\n"
              f"def k({params}, out, N: tl.constexpr):\n    offs = tl.arange(0, N)\n{loads}"
              f"    tl.store(out + offs, ({expr}).to({scalar.tl_dtype(out_dtype)}))\n")
    return load_module(source).k


def _values(dtype, rng, positive=False):
    if dtype == "bool":
        return torch.from_numpy(rng.random(N) < 0.5)
    if dtype.startswith("int"):
        v = rng.integers(-20, 20, N).astype(dtype)
        return torch.from_numpy(np.where(v == 0, 3, v).astype(dtype))
    v = rng.standard_normal(N).astype(dtype) * 4
    v[:4] = [np.nan, np.inf, -np.inf, 2.5] if not positive else [0.5, 1.5, 2.5, 3.5]
    return torch.from_numpy(np.abs(v) + 0.1 if positive else v)


def _check(op, inputs, attrs=None, out_dtype=None):
    attrs = attrs or {}
    node = Node(name="n", op=op, inputs=tuple(f"i{k}" for k in range(len(inputs))), outputs=("o",), attrs=Attrs(attrs))
    expected = run_node(node, inputs)[0]
    out = torch.empty(N, dtype=expected.dtype)
    _kernel(op, len(inputs), [str(x.dtype).removeprefix("torch.") for x in inputs],
            str(expected.dtype).removeprefix("torch."), attrs)[(1,)](*inputs, out, N=N)
    torch.testing.assert_close(out, expected, rtol=2e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("op", UNARY, ids=lambda o: o.value)
def test_unary_float(op):
    rng = np.random.default_rng(0)
    _check(op, [_values("float32", rng, positive=op in (Op.LOG, Op.SQRT))])


@pytest.mark.parametrize("op", BINARY, ids=lambda o: o.value)
def test_binary_float(op):
    rng = np.random.default_rng(1)
    a, b = _values("float32", rng, positive=op is Op.POW), _values("float32", rng)
    _check(op, [a, b])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float32"])
def test_mod_and_integer_division(fmod, dtype):
    rng = np.random.default_rng(2)
    a, b = _values(dtype, rng), _values(dtype, rng)
    if dtype == "float32":
        a, b = torch.nan_to_num(a, posinf=3.0, neginf=-3.0, nan=1.0), torch.nan_to_num(b, posinf=3.0, neginf=-7.0, nan=2.0)
    _check(Op.MOD, [a, b], {"fmod": fmod})
    if dtype != "float32":
        _check(Op.DIV, [a, b])


def test_where_logic_and_casts():
    rng = np.random.default_rng(3)
    c, x, y = _values("bool", rng), _values("float32", rng), _values("float32", rng)
    _check(Op.WHERE, [c, x, y])
    _check(Op.AND, [c, _values("bool", rng)])
    _check(Op.XOR, [c, _values("bool", rng)])
    _check(Op.NOT, [c])
    finite = torch.nan_to_num(x, nan=0.5, posinf=9.7, neginf=-9.7)
    for to in ("int32", "int64", "bool", "float16"):
        _check(Op.CAST, [finite], {"to": to})
    _check(Op.CAST, [_values("int64", rng)], {"to": "float32"})
