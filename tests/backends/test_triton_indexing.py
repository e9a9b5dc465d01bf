"""The index space of generated Triton kernels: digit arithmetic, canonical forms, reshapes, gather tables.

Every rendered index is also Python (``//``, ``%``), so each simplification is
checked against plain integer arithmetic over the whole domain.
"""

import numpy as np
import pytest

from korch.backends.triton.indexing import Digit, Ix, Space, broadcast_index, const, reshape_groups, table_index


def _space(**extents):
    space = Space()
    return space, [space.add_var(name, extent) for name, extent in extents.items()]


def _values(space: Space, ix: Ix, var: str) -> list[int]:
    """``ix`` evaluated from its source at every value of ``var``."""
    return [eval(space.render(ix), {var: v}) for v in range(space.extents[var])]  # noqa: S307 - our own source


def test_a_variable_is_one_digit():
    space, (x,) = _space(x=24)
    assert x == Ix(((Digit("x", 1, None), 1),), 0, None, frozenset({"x"}))
    assert space.render(x) == "x"


def test_reshape_round_trip_simplifies_back_to_the_variable():
    space, (x,) = _space(x=24)
    index = space.unflatten(x, (2, 3, 4))
    assert [space.render(ix) for ix in index] == ["(x // 12)", "((x // 4) % 3)", "(x % 4)"]
    assert space.flatten(index, (2, 3, 4)) == x
    assert space.flatten(space.reshape(space.reshape(index, (2, 3, 4), (6, 4)), (6, 4), (2, 3, 4)), (2, 3, 4)) == x


def test_reshape_maps_each_element_to_the_same_position():
    space, (x,) = _space(x=60)
    index = space.unflatten(x, (3, 4, 5))
    moved = space.reshape(index, (3, 4, 5), (12, 5, 1))
    expected = [np.unravel_index(v, (12, 5, 1)) for v in range(60)]
    assert list(zip(*(_values(space, ix, "x") for ix in moved))) == [tuple(int(i) for i in e) for e in expected]


def test_digit_arithmetic():
    space, (x,) = _space(x=24)
    assert space.floordiv(x, 4) == space.floordiv(space.floordiv(x, 2), 2)
    assert space.mod(space.floordiv(x, 4), 3) == Ix(((Digit("x", 4, 3), 1),), 0, None, frozenset({"x"}))
    assert space.add(space.mod(x, 4), space.mul(space.mod(space.floordiv(x, 4), 3), 4)) == space.mod(x, 12)
    assert space.mod(x, 24) == x and space.floordiv(x, 24) == const(0)  # the extent bounds x
    assert space.floordiv(space.add_const(space.mul(x, 6), 3), 3) == space.add_const(space.mul(x, 2), 1)
    assert space.mod(space.mul(x, 4), 2) == const(0)


@pytest.mark.parametrize("build, reference", [
    (lambda s, x: s.floordiv(s.add_const(s.mul(x, 3), 2), 4), lambda v: (3 * v + 2) // 4),
    (lambda s, x: s.mod(s.add(s.mul(s.floordiv(x, 5), 5), s.mod(x, 5)), 7), lambda v: v % 7),
    (lambda s, x: s.mod(s.floordiv(x, 6), 4), lambda v: (v // 6) % 4),
    (lambda s, x: s.add_const(s.mul(s.mod(x, 3), -2), 9), lambda v: 9 - 2 * (v % 3)),
])
def test_rendered_source_computes_the_arithmetic(build, reference):
    space, (x,) = _space(x=30)
    assert _values(space, build(space, x), "x") == [reference(v) for v in range(30)]


def test_what_cannot_stay_affine_becomes_opaque_source():
    space, (x,) = _space(x=30)
    shifted = space.add_const(x, -2)
    assert space.floordiv(shifted, 4).code == "((x + -2) // 4)"
    gathered = space.opaque("t7", frozenset({"x"}))
    assert space.add(gathered, x).code == "(t7 + x)" and space.add(gathered, x).vars == {"x"}


def test_same_holds_only_for_equal_affine_indices():
    space, (row, col) = _space(row=6, col=8)
    merged = space.add(space.mul(row, 8), col)
    assert space.same(space.floordiv(merged, 8), row)
    assert not space.same(space.mod(merged, 8), row)
    loaded = space.opaque("t1", frozenset({"row"}))
    assert not space.same(loaded, loaded)  # opaque source proves nothing


def test_unmasked_variables_and_broadcast_index():
    space = Space()
    batch = space.add_var("batch", 4, masked=False)
    m = space.add_var("m", 16)
    assert space.masked(frozenset({"batch", "m"})) == ["m"]
    assert broadcast_index((batch, m, const(3)), (1, 5)) == (const(0), const(3))
    assert broadcast_index((batch, m), (4, 16)) == (batch, m)


def test_reshape_groups_pair_the_axes_holding_the_same_elements():
    assert reshape_groups((2, 3, 4), (6, 4)) == [([0, 1], [0]), ([2], [1])]
    assert reshape_groups((6, 1, 4), (2, 12)) == [([0, 1, 2], [0, 1])]


@pytest.mark.parametrize("table, kind", [
    (np.arange(2, 14, 3), "affine"),                    # a strided slice
    (np.repeat(np.arange(5), 2) + 1, "digit"),          # nearest upsample by 2 from offset 1
    ((np.arange(7) * 3) // 7, "opaque"),                # uneven nearest resize 3 -> 7
    (np.array([3, 0, 2, 2, 1]), None),                  # no closed form: loaded
])
def test_gather_tables_with_a_closed_form_become_arithmetic(table, kind):
    space, (x,) = _space(x=table.size)
    looked_up = table_index(space, table, x)
    if kind is None:
        assert looked_up is None
        return
    assert (looked_up.code is not None) == (kind == "opaque")
    assert _values(space, looked_up, "x") == table.tolist()
    assert table_index(space, table, const(2)) == const(int(table[2]))
