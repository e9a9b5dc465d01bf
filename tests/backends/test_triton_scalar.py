"""The Triton scalar table: every elementwise op of ``ir/ops.py`` has an entry, and each entry computes the op.

The completeness walk takes the ops from ``ir/ops.py`` (every ``Op`` of kind
elementwise), so an op added there without a Triton expression fails here.
Each expression runs in Triton's interpreter against the reference executor
(``ir/interpret.py``: torch's operators, NaN and infinity included).
"""

import numpy as np
import pytest
import torch

from korch.backends.triton import scalar
from korch.backends.triton.loader import load_module
from korch.ir.graph import Attrs, Node
from korch.ir.interpret import run_node
from korch.ir.ops import BINARY, ELEMENTWISE, LOGICAL, UNARY, Kind, Op

N = 64
ELEMENTWISE_OPS = [op for op in Op if op.kind is Kind.ELEMENTWISE]
# ops whose first operand must be positive, or all operands finite, to test something
POSITIVE = {Op.LOG, Op.SQRT, Op.POW}
FINITE = {Op.MOD, Op.CAST}
ATTRS = {Op.CAST: {"to": "int32"}, Op.MOD: {"fmod": 0}}


def _operand_dtypes(op: Op) -> list[str]:
    """The operand dtypes ``op`` is checked on: bool for logic, float32 otherwise."""
    if op in LOGICAL or op is Op.NOT:
        return ["bool"] * (1 if op is Op.NOT else 2)
    if op is Op.WHERE:
        return ["bool", "float32", "float32"]
    if op in UNARY or op is Op.CAST:
        return ["float32"]
    if op in BINARY:
        return ["float32", "float32"]
    raise AssertionError(f"{op} is elementwise but neither unary, binary, Where nor Cast: say here how to test it")


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


def _values(dtype, rng, positive=False, finite=False):
    if dtype == "bool":
        return torch.from_numpy(rng.random(N) < 0.5)
    if dtype.startswith("int"):
        v = rng.integers(-20, 20, N).astype(dtype)
        return torch.from_numpy(np.where(v == 0, 3, v).astype(dtype))
    v = rng.standard_normal(N).astype(dtype) * 4
    if positive:
        v[:4] = [0.5, 1.5, 2.5, 3.5]
        return torch.from_numpy(np.abs(v) + 0.1)
    v[:4] = [1.0, 9.7, -9.7, 2.5] if finite else [np.nan, np.inf, -np.inf, 2.5]
    return torch.from_numpy(v)


def _check(op, inputs, attrs=None):
    attrs = attrs or {}
    node = Node(name="n", op=op, inputs=tuple(f"i{k}" for k in range(len(inputs))), outputs=("o",), attrs=Attrs(attrs))
    expected = run_node(node, inputs)[0]
    out = torch.empty(N, dtype=expected.dtype)
    _kernel(op, len(inputs), [str(x.dtype).removeprefix("torch.") for x in inputs],
            str(expected.dtype).removeprefix("torch."), attrs)[(1,)](*inputs, out, N=N)
    torch.testing.assert_close(out, expected, rtol=2e-6, atol=1e-6, equal_nan=True)


def test_the_table_writes_exactly_the_elementwise_ops():
    missing = [op.value for op in ELEMENTWISE_OPS if not scalar.supported(op, _operand_dtypes(op))]
    assert not missing, f"elementwise ops without a Triton expression in scalar.py: {missing}"
    assert not scalar.OPS - ELEMENTWISE, f"scalar.py writes ops that are not elementwise: {scalar.OPS - ELEMENTWISE}"


@pytest.mark.parametrize("op", ELEMENTWISE_OPS, ids=lambda o: o.value)
def test_every_elementwise_op_matches_the_reference(op):
    rng = np.random.default_rng(sorted(Op, key=lambda o: o.value).index(op))
    inputs = [_values(dtype, rng, positive=i == 0 and op in POSITIVE, finite=op in FINITE)
              for i, dtype in enumerate(_operand_dtypes(op))]
    _check(op, inputs, ATTRS.get(op))


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float32"])
def test_mod_and_integer_division(fmod, dtype):
    rng = np.random.default_rng(2)
    a, b = _values(dtype, rng, finite=True), _values(dtype, rng, finite=True)
    _check(Op.MOD, [a, b], {"fmod": fmod})
    if dtype != "float32":
        _check(Op.DIV, [a, b])


def test_where_logic_and_casts():
    rng = np.random.default_rng(3)
    c, x, y = _values("bool", rng), _values("float32", rng), _values("float32", rng)
    _check(Op.WHERE, [c, x, y])
    for op in (Op.AND, Op.OR, Op.XOR):
        _check(op, [c, _values("bool", rng)])
    _check(Op.NOT, [c])
    finite = _values("float32", rng, finite=True)
    for to in ("int32", "int64", "bool", "float16"):
        _check(Op.CAST, [finite], {"to": to})
    _check(Op.CAST, [_values("int64", rng)], {"to": "float32"})
