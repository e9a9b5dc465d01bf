"""ONNX Runtime's GEMM as korch's C++ operator: products as ONNX Runtime computes them, rows split among torch's
threads, sessions keyed per unit, and the executable that calls it carries (and checks) its library."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from korch.backends import ort_gemm
from korch.ir.ort import run_model
from korch.pipeline import optimize
from korch.runtime import unit
from tests.runtime.test_unit import _matmul_relu_model
from tests.test_cli import assert_one_line_error
from tests.test_cli import korch as cli_korch


@pytest.fixture(scope="module", autouse=True)
def library():
    ort_gemm.open_library()


def _slot():
    _slot.count = getattr(_slot, "count", 0) + 1
    return _slot.count


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("columns", [40, 160])
@pytest.mark.parametrize("shape", [(1, 24), (15, 24), (17, 24), (2, 33, 24), (3, 1, 64, 24)])
def test_products_match_onnx_runtime(shape, columns, threads):
    """Any number of rows (one, fewer than a thread's share, leading batch axes), split among one or two
    threads, gives ONNX Runtime's own MatMul result."""
    rng = np.random.default_rng(sum(shape) + columns)
    x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal((24, columns)).astype(np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (*shape[:-1], columns))],
        [onnx.numpy_helper.from_array(w, "w")]), opset_imports=[helper.make_opsetid("", 13)])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = ort_gemm.ops().matmul(torch.from_numpy(x), torch.from_numpy(w), 1, _slot())
    finally:
        torch.set_num_threads(before)
    assert got.shape == (*shape[:-1], columns)
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k, n", [(24, 40), (512, 640)])
def test_a_slot_opened_on_one_thread_serves_more(k, n):
    """Each thread runs a session of its own (ONNX Runtime's Run locks its session) where the weight is small,
    and they share one above kPerThreadBytes (512x640: 1.3 MB); a slot opened while torch had one thread and
    called with two shares that session between them and still multiplies correctly."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((64, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    slot, a = _slot(), rng.standard_normal((2, 40, 9)).astype(np.float32)
    b = rng.standard_normal((2, 9, 7)).astype(np.float32)
    for threads in (1, 2):
        product = _with_threads(threads, lambda: ort_gemm.ops().matmul(torch.from_numpy(x), torch.from_numpy(w), 1,
                                                                      slot))
        np.testing.assert_allclose(product.numpy(), x @ w, rtol=1e-4, atol=1e-4)
        batched = _with_threads(threads, lambda: ort_gemm.ops().batched_matmul(torch.from_numpy(a),
                                                                              torch.from_numpy(b), 1, slot))
        np.testing.assert_allclose(batched.numpy(), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_products_in_column_blocks_lie_side_by_side(blocks):
    """``matmul_blocks`` leaves block b of x @ w (its b-th share of the columns) at [b]: seen as (rows, columns),
    ONNX Runtime's product."""
    rng = np.random.default_rng(blocks)
    x, w = rng.standard_normal((2, 7, 24)).astype(np.float32), rng.standard_normal((24, 48)).astype(np.float32)
    got = _with_threads(2, lambda: ort_gemm.ops().matmul_blocks(torch.from_numpy(x), torch.from_numpy(w), 1, _slot(),
                                                                blocks))
    assert got.shape == (blocks, 14, 48 // blocks)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [onnx.numpy_helper.from_array(w, "w")]),
        opset_imports=[helper.make_opsetid("", 13)])
    np.testing.assert_allclose(got.permute(1, 0, 2).reshape(2, 7, 48).numpy(), run_model(model, {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="divisible by 5"):
        ort_gemm.ops().matmul_blocks(torch.from_numpy(x), torch.from_numpy(w), 1, _slot(), 5)


def test_only_large_weights_are_cut_into_column_blocks():
    assert _with_threads(2, lambda: ort_gemm.column_blocks(768, 3072)) == 2
    assert _with_threads(2, lambda: ort_gemm.column_blocks(768, 768)) == 1  # 2.4 MB: the threads split the rows
    assert _with_threads(2, lambda: ort_gemm.column_blocks(4096, 1001)) == 1  # columns do not divide evenly
    assert _with_threads(1, lambda: ort_gemm.column_blocks(768, 3072)) == 1


def _mlp_model():
    """relu(x @ w1 + b1) @ w2, weights of 4.7 MB (large enough to be cut into column blocks); the second product
    is the model's output."""
    rng = np.random.default_rng(7)
    inits = [onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name)
             for name, shape in (("w1", (768, 1536)), ("b1", (1536,)), ("w2", (1536, 768)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 12, 768))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_large_products_read_by_kernels_stay_in_column_blocks(tmp_path):
    """With two threads, the first product (read by Inductor's bias-and-relu kernel) is left in column blocks;
    the second, the model's output, is one array; the unit matches ONNX Runtime."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(unit, "VARIANTS", {"MLAS by ONNX Runtime": unit.VARIANTS["MLAS by ONNX Runtime"]})
            result = optimize(_mlp_model(), target="cpu", cost="roofline", output=tmp_path / "out",
                              compiled_unit=True)
            module = unit.PlanModule(result.graph, result.plan, ort_kernels=True)
        steps = {outputs: fn for fn, _, outputs in filter(None, module._replaced.values())}
        assert steps[("m1",)].blocks == 2 and steps[("y",)].blocks == 1
        x = np.random.default_rng(1).standard_normal((1, 12, 768)).astype(np.float32)
        with torch.inference_mode():
            got = module(torch.from_numpy(x))[0]
        np.testing.assert_allclose(got.numpy(), run_model(_mlp_model(), {"x": x})["y"], rtol=1e-4, atol=1e-5)
    finally:
        torch.set_num_threads(before)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["unit"]["weights"] == "MLAS by ONNX Runtime" and manifest["check"]["ok"]


def test_a_slot_keeps_the_weight_it_was_opened_for():
    slot = _slot()
    ort_gemm.ops().matmul(torch.ones(2, 4), torch.ones(4, 3), 7, slot)
    with pytest.raises(RuntimeError, match="opened for a 4x3 weight, called with 5x3"):
        ort_gemm.ops().matmul(torch.ones(2, 5), torch.ones(5, 3), 7, slot)


@pytest.fixture(scope="module")
def ort_unit_dir(tmp_path_factory):
    """An executable whose unit runs its product in ONNX Runtime (the only variant offered)."""
    out = tmp_path_factory.mktemp("ort-unit") / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit, "VARIANTS", {"MLAS by ONNX Runtime": unit.VARIANTS["MLAS by ONNX Runtime"]})
        optimize(_matmul_relu_model((2, 40, 16))[0], target="cpu", cost="roofline", output=out, compiled_unit=True)
    return out


def test_the_executable_carries_the_operator_library(ort_unit_dir):
    """The unit's library is in the directory with its checksum; a fresh process loads and runs it without
    building anything and matches ONNX Runtime."""
    manifest = json.loads((ort_unit_dir / "manifest.json").read_text())
    assert manifest["unit"]["libraries"] == [ort_gemm.LIBRARY_FILE] and ort_gemm.LIBRARY_FILE in manifest["files"]
    script = f"""
import sys, numpy as np, onnx, korch
from korch.backends import native
from korch.ir.ort import run_model
native.build = None  # nothing may be compiled here
exe = korch.load({str(ort_unit_dir)!r})
x = np.random.default_rng(3).standard_normal((2, 40, 16)).astype(np.float32)
np.testing.assert_allclose(exe.run({{"x": x}})["y"], run_model(onnx.load({str(ort_unit_dir / 'reference.onnx')!r}),
                           {{"x": x}})["y"], rtol=1e-5, atol=1e-5)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_a_damaged_operator_library_is_a_one_line_error(ort_unit_dir, tmp_path):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(ort_unit_dir, d)
    data = bytearray((d / ort_gemm.LIBRARY_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (d / ort_gemm.LIBRARY_FILE).write_bytes(bytes(data))
    assert_one_line_error(cli_korch("run", d, timeout=300), ort_gemm.LIBRARY_FILE, "corrupted")


@pytest.mark.parametrize("rows", [1, 33])
def test_a_large_weight_in_column_blocks_in_inference_mode(rows):
    """A weight above 4 MiB is cut into a column block per thread, each block's result copied into place;
    torch's worker threads do not share the caller's inference mode, so they touch plain memory only."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x, w = torch.randn(rows, 1024), torch.randn(1024, 1030)  # 4.2 MB: blocks of 515 columns
        with torch.inference_mode():
            got = ort_gemm.ops().matmul(x, w, 2, _slot())
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got, x @ w, rtol=1e-4, atol=1e-3)


def test_a_unit_of_the_earlier_python_operator_is_a_one_line_error(ort_unit_dir, tmp_path):
    import shutil

    d = tmp_path / "old"
    shutil.copytree(ort_unit_dir, d)
    manifest = json.loads((d / "manifest.json").read_text())
    del manifest["unit"]["libraries"]
    (d / "manifest.json").write_text(json.dumps(manifest))
    assert_one_line_error(cli_korch("run", d, timeout=300), "earlier korch", "run korch optimize again")


def _with_threads(threads, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("transposed_b", [False, True])
@pytest.mark.parametrize("batch", [(), (1,), (3,), (2, 3)])
@pytest.mark.parametrize("rows", [1, 40])
def test_batched_products_match_onnx_runtime(batch, rows, transposed_b, threads):
    """Products of two activations over batch axes (fewer batches than threads: their rows are split; keys
    stored transposed: read as they lie) give ONNX Runtime's MatMul result."""
    rng = np.random.default_rng(len(batch) + rows)
    a = rng.standard_normal((*batch, rows, 12)).astype(np.float32)
    b = rng.standard_normal((*batch, 12, 7)).astype(np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "bmm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, a.shape),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, b.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 13)])
    b_torch = torch.from_numpy(np.ascontiguousarray(np.swapaxes(b, -1, -2))).transpose(-1, -2) if transposed_b \
        else torch.from_numpy(b)
    assert b_torch.is_contiguous() is not transposed_b
    got = _with_threads(threads, lambda: ort_gemm.ops().batched_matmul(torch.from_numpy(a), b_torch, 1, _slot()))
    np.testing.assert_allclose(got.numpy(), run_model(model, {"a": a, "b": b})["y"], rtol=1e-5, atol=1e-5)


def test_batched_products_need_equal_batch_axes():
    with pytest.raises(RuntimeError, match="equal batch axes"):
        ort_gemm.ops().batched_matmul(torch.ones(2, 3, 4), torch.ones(1, 4, 5), 1, _slot())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(5,), (3, 197), (2, 3, 40, 17)])
def test_softmax_matches_onnx_runtime(shape, threads):
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32) * 10
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]), opset_imports=[helper.make_opsetid("", 13)])
    got = _with_threads(threads, lambda: ort_gemm.ops().softmax(torch.from_numpy(x), 1, _slot()))
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-6, atol=1e-7)


def _attention_model(extra_output: str | None = None):
    """softmax(q @ k^T * 0.5) @ v over (1, 2, 9, 4) heads; ``extra_output`` also made a graph output."""
    spec = [("q", TensorProto.FLOAT, (1, 2, 9, 4)), ("k", TensorProto.FLOAT, (1, 2, 9, 4)),
            ("v", TensorProto.FLOAT, (1, 2, 9, 4))]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "half"], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info(extra_output, TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info(*s) for s in spec], outputs,
                              [onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_softmaxes_are_found_where_their_parts_are_private():
    """Fission's softmax (max, subtract, exp, sum, divide) in one kernel becomes one softmax; not when a
    part is read elsewhere, nor when the parts are in different kernels."""
    from korch.pipeline import load_model

    _, graph, _ = load_model(_attention_model())
    (found,) = ort_gemm.softmaxes(graph, graph.nodes)
    assert len(found.parts) == 5 and {graph.producers()[found.output].op.value} == {"Div"}
    parts = [n for n in graph.nodes if n.name in found.parts]
    assert ort_gemm.softmaxes(graph, [n for n in graph.nodes if n.name != parts[2].name]) == []
    exp = next(n for n in parts if n.op.value == "Exp")
    graph.outputs.append(exp.output)
    assert ort_gemm.softmaxes(graph, graph.nodes) == []


def test_attention_runs_in_onnx_runtimes_kernels(tmp_path):
    """The unit's MLAS variant runs both products and the softmax in ONNX Runtime, and the executable matches
    ONNX Runtime on the whole model."""
    module_steps = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit, "VARIANTS", {"MLAS by ONNX Runtime": unit.VARIANTS["MLAS by ONNX Runtime"]})
        result = optimize(_attention_model(), target="cpu", cost="roofline", output=tmp_path / "out",
                          compiled_unit=True)
        module = unit.PlanModule(result.graph, result.plan, ort_kernels=True)
        module_steps = module._replaced
    kinds = sorted(fn.__qualname__.split(".")[0] for fn, *_ in filter(None, module_steps.values()))
    assert kinds == ["batched_function", "batched_function", "softmax_function"]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["unit"]["weights"] == "MLAS by ONNX Runtime" and manifest["check"]["ok"]


def _sibling_products_model():
    """x @ wq, x @ wk, x @ wv (attention's projections, of different widths), each plus one, as three outputs."""
    rng = np.random.default_rng(5)
    widths = {"q": 8, "k": 8, "v": 12}
    nodes, outputs, weights = [], [], []
    for name, width in widths.items():
        nodes += [helper.make_node("MatMul", ["x", f"w{name}"], [f"m{name}"]),
                  helper.make_node("Add", [f"m{name}", "one"], [name])]
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, (3, 5, width)))
        weights.append(onnx.numpy_helper.from_array(rng.standard_normal((16, width)).astype(np.float32), f"w{name}"))
    graph = helper.make_graph(nodes, "siblings", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 5, 16))],
                              outputs, [*weights, onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_products_of_one_activation_run_as_one(tmp_path):
    """Products of one activation by three weights are one MLAS call by the weights side by side, computed
    where the first is planned; each output is its block of columns, as ONNX Runtime computes them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit, "VARIANTS", {"MLAS by ONNX Runtime": unit.VARIANTS["MLAS by ONNX Runtime"]})
        result = optimize(_sibling_products_model(), target="cpu", cost="roofline", output=tmp_path / "out",
                          compiled_unit=True)
        module = unit.PlanModule(result.graph, result.plan, ort_kernels=True)
    steps = [step for step in module._replaced.values() if step]
    assert len(module._replaced) == 3 and len(steps) == 1
    (fn, inputs, outputs), = steps
    assert fn.__qualname__.startswith("product_function") and len(outputs) == 3
    x = torch.randn(3, 5, 16)
    got = module(x)
    want = run_model(_sibling_products_model(), {"x": x.numpy()})
    for name, value in zip(result.graph.outputs, got):
        np.testing.assert_allclose(value.numpy(), want[name], rtol=1e-5, atol=1e-5)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["check"]["ok"] and manifest["unit"]["libraries"] == [ort_gemm.LIBRARY_FILE]


needs_mkl = pytest.mark.skipif(not torch._C.has_mkl, reason="this torch has no MKL (not an x86 build)")


@needs_mkl
@pytest.mark.parametrize("shape", [(1, 24), (17, 24), (2, 33, 24)])
def test_products_in_mkls_packed_gemm_match_onnx_runtime(shape):
    """``mkl_matmul`` packs the weight on its slot's first call and multiplies as ONNX Runtime's MatMul does,
    for any leading axes; a later call of another row count multiplies by the weight as it is."""
    rng = np.random.default_rng(sum(shape))
    x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal((24, 40)).astype(np.float32)
    slot = _slot()
    got = ort_gemm.ops().mkl_matmul(torch.from_numpy(x), torch.from_numpy(w), 9, slot)
    assert got.shape == (*shape[:-1], 40)
    np.testing.assert_allclose(got.numpy(), x @ w, rtol=1e-5, atol=1e-5)
    more = rng.standard_normal((5, 3, 24)).astype(np.float32)
    np.testing.assert_allclose(ort_gemm.ops().mkl_matmul(torch.from_numpy(more), torch.from_numpy(w), 9, slot).numpy(),
                               more @ w, rtol=1e-5, atol=1e-5)


@needs_mkl
def test_a_packed_slot_keeps_its_weight_until_its_unit_closes():
    slot = _slot()
    ort_gemm.ops().mkl_matmul(torch.ones(2, 4), torch.ones(4, 3), 11, slot)
    with pytest.raises(RuntimeError, match="packed for a 4x3 weight, called with 5x3"):
        ort_gemm.ops().mkl_matmul(torch.ones(2, 5), torch.ones(5, 3), 11, slot)
    ort_gemm.ops().close_unit(11)
    got = ort_gemm.ops().mkl_matmul(torch.ones(2, 5), torch.ones(5, 3), 11, slot)
    np.testing.assert_allclose(got.numpy(), np.full((2, 3), 5.0))


@needs_mkl
def test_a_unit_with_products_in_mkl_matches_onnx_runtime(tmp_path):
    """The MKL variant's unit multiplies the products by constant weights in ``mkl_matmul`` (siblings as one)
    and matches ONNX Runtime, and is chosen only where MKL's packed GEMM is the faster (here: said to be)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit, "VARIANTS", {unit.MKL_PACKED: unit.VARIANTS[unit.MKL_PACKED]})
        patch.setattr(ort_gemm, "mkl_packed_faster", lambda graph: True)
        result = optimize(_sibling_products_model(), target="cpu", cost="roofline", output=tmp_path / "out",
                          compiled_unit=True)
        module = unit.plan_module(result.graph, result.plan, "cpu", unit.VARIANTS[unit.MKL_PACKED])
    steps = [step for step in module._replaced.values() if step]
    assert [fn.__qualname__.split(".")[0] for fn, *_ in steps] == ["mkl_product_function"]
    x = torch.randn(3, 5, 16)
    want = run_model(_sibling_products_model(), {"x": x.numpy()})
    for name, value in zip(result.graph.outputs, module(x)):
        np.testing.assert_allclose(value.numpy(), want[name], rtol=1e-5, atol=1e-5)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["unit"]["weights"] == unit.MKL_PACKED and manifest["check"]["ok"]
    assert manifest["unit"]["libraries"] == [ort_gemm.LIBRARY_FILE]


def test_the_mkl_variant_is_compiled_only_where_mkl_is_the_faster(monkeypatch):
    result = optimize(_sibling_products_model(), target="cpu", cost="roofline", plan_only=True)
    graph, plan = result.graph, result.plan
    for faster in (True, False):
        monkeypatch.setattr(ort_gemm, "mkl_packed_faster", lambda graph, faster=faster: faster)
        assert (unit.MKL_PACKED in unit.own_variants(graph, plan)) is faster


def test_a_graph_without_products_by_weights_has_no_mkl_probe():
    """No product by a constant weight: nothing for MKL to multiply, whatever the CPU."""
    assert not ort_gemm.mkl_packed_faster(optimize(_attention_model(), target="cpu", cost="roofline",
                                                   plan_only=True).graph)


def test_operator_libraries_of_two_versions_load_in_one_process(tmp_path):
    """A library registers its operators under a namespace named after their source (its file is named so in an
    executable), so the library of another version of the operators loads beside this korch's and both run."""
    from korch.backends import native

    assert ort_gemm.LIBRARY_FILE == f"{ort_gemm.NAMESPACE}.so" and ort_gemm.NAMESPACE != "korch_ort"
    other = tmp_path / "korch_ort_other.so"
    other.write_bytes(native.build(ort_gemm._SOURCE, "korch_ort_other").read_bytes())
    ort_gemm.open_library(other)
    x, w = torch.randn(3, 8), torch.randn(8, 5)
    for namespace in ("korch_ort_other", ort_gemm.NAMESPACE):
        torch.testing.assert_close(ort_gemm.ops(namespace).matmul(x, w, 11, _slot()), x @ w)


def _conv1d_model(pads, stride, dilation, batch=1):
    w = np.random.default_rng(sum(pads) + stride).standard_normal((6, 5, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=list(pads), strides=[stride], dilations=[dilation]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, 5, 20))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("pads, stride, dilation, batch", [((1, 1), 1, 1, 1), ((1, 1), 2, 1, 1), ((0, 2), 1, 2, 2),
                                                           ((0, 0), 3, 1, 3)])
def test_one_dimensional_convolutions_are_products_of_their_windows(pads, stride, dilation, batch):
    """A 1-D convolution by a constant weight runs as its windows times the weight in MLAS, as ONNX Runtime
    computes it, whatever its padding, stride, dilation and batch."""
    model = _conv1d_model(pads, stride, dilation, batch)
    result = optimize(model, target="cpu", cost="roofline")
    module = unit.PlanModule(result.graph, result.plan, ort_kernels=True)
    (fn, *_), = [step for step in module._replaced.values() if step]
    assert fn.__qualname__.startswith("conv1d_function")
    x = np.random.default_rng(batch).standard_normal((batch, 5, 20)).astype(np.float32)
    with torch.inference_mode():
        got = module(torch.from_numpy(x))[0]
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_a_unit_with_a_one_dimensional_convolution_matches_onnx_runtime(tmp_path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit, "VARIANTS", {"MLAS by ONNX Runtime": unit.VARIANTS["MLAS by ONNX Runtime"]})
        optimize(_conv1d_model((1, 1), 2, 1), target="cpu", cost="roofline", output=tmp_path / "out",
                 compiled_unit=True)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["unit"]["weights"] == "MLAS by ONNX Runtime" and manifest["check"]["ok"]


def _pointwise_conv_model(batch=1):
    rng = np.random.default_rng(batch)
    w, b = rng.standard_normal((12, 8, 1, 1)).astype(np.float32), rng.standard_normal(12).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, 8, 6, 7))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("batch, channels_last", [(1, True), (2, True), (2, False)])
def test_pointwise_convolutions_are_products_of_their_pixels(batch, channels_last):
    """A 1x1 convolution by a constant weight runs as its pixels' channels times the weight in MLAS, its bias
    and SiLU after it, as ONNX Runtime computes them, over values stored either way."""
    model = _pointwise_conv_model(batch)
    result = optimize(model, target="cpu", cost="roofline")
    module = unit.PlanModule(result.graph, result.plan, ort_kernels=True, channels_last=channels_last)
    (fn, *_), = [step for step in module._replaced.values() if step]
    assert fn.__qualname__.startswith("pointwise_conv_function")
    x = np.random.default_rng(batch).standard_normal((batch, 8, 6, 7)).astype(np.float32)
    value = torch.from_numpy(x)
    if channels_last:
        value = value.to(memory_format=torch.channels_last)
    with torch.inference_mode():
        got = module(value)[0]
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_a_unit_with_pointwise_convolutions_in_mlas_matches_onnx_runtime(tmp_path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit, "VARIANTS", {"MLAS by ONNX Runtime": unit.VARIANTS["MLAS by ONNX Runtime"]})
        optimize(_pointwise_conv_model(2), target="cpu", cost="roofline", output=tmp_path / "out", compiled_unit=True)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["unit"]["weights"] == "MLAS by ONNX Runtime" and manifest["check"]["ok"]


def _sibling_pointwise_convs_model():
    """A CSP block's opening: two 1x1 convolutions of one activation (4 and 6 channels), each with its bias and
    SiLU, then their concatenation and a third 1x1 convolution."""
    rng = np.random.default_rng(11)
    nodes, weights = [], []
    for name, width in (("a", 4), ("b", 6)):
        nodes += [helper.make_node("Conv", ["x", f"w{name}", f"b{name}"], [f"c{name}"]),
                  helper.make_node("Sigmoid", [f"c{name}"], [f"s{name}"]),
                  helper.make_node("Mul", [f"c{name}", f"s{name}"], [name])]
        weights += [onnx.numpy_helper.from_array(rng.standard_normal((width, 8, 1, 1)).astype(np.float32), f"w{name}"),
                    onnx.numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), f"b{name}")]
    nodes += [helper.make_node("Concat", ["a", "b"], ["ab"], axis=1), helper.make_node("Conv", ["ab", "wc"], ["y"])]
    weights.append(onnx.numpy_helper.from_array(rng.standard_normal((5, 10, 1, 1)).astype(np.float32), "wc"))
    graph = helper.make_graph(nodes, "csp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 8, 6, 7))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("channels_last", [True, False])
def test_pointwise_convolutions_of_one_activation_run_as_one_product(channels_last):
    """The two 1x1 convolutions of one activation are one MLAS call by their weights' columns side by side; each
    output is its channels of that product, as ONNX Runtime computes the block; the third is a call of its own."""
    model = _sibling_pointwise_convs_model()
    result = optimize(model, target="cpu", cost="roofline")
    module = unit.PlanModule(result.graph, result.plan, ort_kernels=True, channels_last=channels_last)
    steps = [step for step in module._replaced.values() if step]
    assert len(module._replaced) == 3 and sorted(len(outputs) for _, _, outputs in steps) == [1, 2]
    x = np.random.default_rng(3).standard_normal((2, 8, 6, 7)).astype(np.float32)
    with torch.inference_mode():
        got = module(torch.from_numpy(x))[0]
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_a_kernel_with_sibling_pointwise_convolutions_in_mlas_checks(tmp_path):
    """The MLAS backend's kernel holding both siblings (the way a search measures it) matches the reference."""
    from korch.backends.mlas import MlasBackend
    from tests.backends.kernels import check_built
    from tests.fission.oracle import lower

    kernel = lower(_sibling_pointwise_convs_model())
    assert MlasBackend().claims(kernel) is None
    check_built(MlasBackend().build(kernel, "cpu"), kernel)
