"""The primitive graph as a function of one dimension (``korch.ir.sizes``), the power-of-two buckets and
``--dynamic``'s parsing: no compiling here (``tests/test_dynamic.py`` builds and runs an executable)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from korch.errors import KorchError
from korch.frontend.inputs import parse_dynamic
from korch.ir.sizes import Poly, SizeFunctions
from korch.pipeline import load_model
from korch.runtime.buckets import Bucket, merge_equal, power_of_two_buckets

F, I64 = TensorProto.FLOAT, TensorProto.INT64
SAMPLES = (5, 6, 7, 8)


def _int64(name, values):
    return onnx.numpy_helper.from_array(np.asarray(values, np.int64), name)


def _model(path, *, scaled_by_size=False):
    """x: [seq, 4] -> (x + table[:seq]) reshaped to [2*seq, 2], and the outer product of x's first column
    with itself flattened to [seq*seq]; with ``scaled_by_size``, x is also multiplied by seq (a constant
    whose value, not shape, follows the size)."""
    table = onnx.numpy_helper.from_array(np.arange(64 * 4, dtype=np.float32).reshape(64, 4), "table")
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["seq"], axis=0),
             helper.make_node("Unsqueeze", ["seq", "zero1"], ["seq1"]),
             helper.make_node("Slice", ["table", "zero1", "seq1"], ["positions"]),
             helper.make_node("Add", ["x", "positions"], ["summed"]),
             helper.make_node("Mul", ["seq1", "two"], ["rows"]),
             helper.make_node("Concat", ["rows", "two"], ["target"], axis=0),
             helper.make_node("Reshape", ["summed", "target"], ["y"]),
             helper.make_node("Slice", ["x", "zero1", "one1", "one1", "one1"], ["column"]),
             helper.make_node("Transpose", ["column"], ["row"], perm=[1, 0]),
             helper.make_node("MatMul", ["column", "row"], ["outer"]),
             helper.make_node("Reshape", ["outer", "minus_one"], ["z"])]
    outputs = [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("z", F, None)]
    if scaled_by_size:
        nodes += [helper.make_node("Cast", ["seq"], ["seq_f"], to=F), helper.make_node("Mul", ["x", "seq_f"], ["w"])]
        outputs.append(helper.make_tensor_value_info("w", F, None))
    initializers = [table, _int64("zero", 0), _int64("zero1", [0]), _int64("one1", [1]), _int64("two", [2]),
                    _int64("minus_one", [-1])]
    graph = helper.make_graph(nodes, "sized", [helper.make_tensor_value_info("x", F, ["seq", 4])], outputs,
                              initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def _graphs(path, sizes=SAMPLES):
    return {s: load_model(str(path), {"seq": s})[1] for s in sizes}


def test_fits_linear_and_quadratic_sizes_and_leading_blocks(tmp_path):
    path = _model(tmp_path / "sized.onnx")
    sizes = SizeFunctions.fit("seq", _graphs(path))
    assert sizes.input_axes == {"x": (0,)}
    assert sizes.shapes["x"] == (Poly(0, 1), 4)
    assert sizes.shapes["y"] == (Poly(0, 2), 2)
    assert sizes.shapes["z"] == (Poly(0, 0, 1),)
    reference = _graphs(path, (8,))[8]
    assert sizes.varying_constants(reference)  # the table's leading rows, folded to a constant
    for size in (2, 3, 11, 40):
        at_size = _graphs(path, (size,))[size]
        sizes.check_graph_at(reference, at_size, size)  # raises unless every attribute and shape agrees
        assert sizes.graph_at(reference, size).tensors["z"].shape == (size * size,)


def test_a_constant_whose_value_follows_the_size_is_refused(tmp_path):
    path = _model(tmp_path / "scaled.onnx", scaled_by_size=True)
    with pytest.raises(KorchError, match="changes with seq"):
        SizeFunctions.fit("seq", _graphs(path))


def test_a_graph_at_a_size_the_functions_do_not_describe_is_refused(tmp_path):
    path = _model(tmp_path / "sized.onnx")
    sizes = SizeFunctions.fit("seq", _graphs(path))
    reference = _graphs(path, (8,))[8]
    other = _graphs(_model(tmp_path / "scaled.onnx", scaled_by_size=True), (9,))[9]
    with pytest.raises(KorchError, match="differ from those at the sizes fitted"):
        sizes.check_graph_at(reference, other, 9)


def test_poly_evaluates_and_reads():
    assert Poly(3, 2, 1)(4) == 3 + 8 + 16
    assert Poly(0, 1).is_size and not Poly(0, 2).is_size
    assert str(Poly(1, 2, 0)) == "2*size + 1" and str(Poly(0, 1)) == "size"


def test_power_of_two_buckets_cover_the_range_once():
    assert power_of_two_buckets(1, 512) == [Bucket(1, 1), Bucket(2, 2), Bucket(3, 4), Bucket(5, 8), Bucket(9, 16),
                                            Bucket(17, 32), Bucket(33, 64), Bucket(65, 128), Bucket(129, 256),
                                            Bucket(257, 512)]
    assert power_of_two_buckets(3, 20) == [Bucket(3, 4), Bucket(5, 8), Bucket(9, 16), Bucket(17, 20)]
    assert power_of_two_buckets(6, 7) == [Bucket(6, 7)]


def test_equal_plans_share_a_unit_but_size_one_stays_alone():
    buckets = power_of_two_buckets(1, 8)
    groups = merge_equal(buckets, lambda a, b: True)
    assert groups == [[Bucket(1, 1)], [Bucket(2, 2), Bucket(3, 4), Bucket(5, 8)]]
    assert merge_equal(buckets, lambda a, b: False) == [[b] for b in buckets]


@pytest.mark.parametrize("bad", ["seq", "seq=1-4", "seq=0..4", "seq=8..4", "seq=4..4", "=1..4", "seq=a..b"])
def test_bad_dynamic_ranges_are_one_line_errors(bad):
    with pytest.raises(KorchError, match="bad --dynamic") as info:
        parse_dynamic(bad)
    assert "\n" not in str(info.value)


def test_dynamic_range_parses():
    assert parse_dynamic(" seq = 1..512 ") == ("seq", 1, 512)
