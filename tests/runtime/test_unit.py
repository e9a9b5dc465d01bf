"""The compiled unit: a whole CPU plan in one AOTInductor package that loads without compiling, keeps korch's
kernels apart, and refuses (one line, exit 2) a damaged package or one built for another torch or CPU."""

import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper
import pytest
import torch

from korch import config, precision
from korch.backends import freezing, ort_gemm
from korch.errors import KorchError
from korch.pipeline import optimize
from korch.runtime import unit
from korch.ir.ort import run_model
from tests.runtime.test_executable import _two_output_model, opaque_model
from tests.runtime.test_run_cli import optimize_two_output_model
from tests.test_cli import assert_one_line_error
from tests.test_cli import korch as cli_korch

UNIT_ON = {**os.environ, "KORCH_COMPILED_UNIT": "1"}


def korch(*args):
    return cli_korch(*args, env=UNIT_ON, timeout=600)


@pytest.fixture(scope="module")
def unit_dir(built_once):
    def build(root):
        assert "compiled unit" in optimize_two_output_model(root, run=korch)
    return built_once("unit", build) / "out"  # read only: a test that damages it damages a copy


def test_optimize_writes_the_plan_as_one_checked_unit(unit_dir):
    manifest = json.loads((unit_dir / "manifest.json").read_text())
    assert manifest["runs"] == "compiled unit" and manifest["check"]["ok"]
    assert manifest["precision"] == "fp32" and manifest["check"]["tolerance"] == precision.get("fp32").model_tolerance
    assert manifest["unit"]["torch"] == torch.__version__
    assert manifest["files"][unit.UNIT_FILE] == hashlib.sha256((unit_dir / unit.UNIT_FILE).read_bytes()).hexdigest()
    assert "one compiled unit" in (unit_dir / "report.md").read_text()


def test_load_compiles_nothing_and_matches_onnx_runtime(unit_dir):
    """Loading and calling a unit imports neither Inductor nor Dynamo: nothing is compiled."""
    script = f"""
import sys, numpy as np, onnx, korch
from korch.ir.ort import run_model
exe = korch.load({str(unit_dir)!r})
assert exe.unit is not None and exe.kernels == []
x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
got = exe.run({{"x": x}})
want = run_model(onnx.load({str(unit_dir / 'reference.onnx')!r}), {{"x": x}})
for name in ("p", "y"):
    np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
print("compilers imported:", sorted(m for m in ("torch._inductor", "torch._dynamo") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "compilers imported: []" in result.stdout


def test_run_check_passes(unit_dir):
    result = korch("run", unit_dir, "--check")
    assert result.returncode == 0, result.stderr
    assert "matches ONNX Runtime" in result.stdout


def _copy(unit_dir, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(unit_dir, d)
    return d


def test_a_damaged_unit_is_a_one_line_error(unit_dir, tmp_path):
    d = _copy(unit_dir, tmp_path)
    data = bytearray((d / unit.UNIT_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (d / unit.UNIT_FILE).write_bytes(bytes(data))
    assert_one_line_error(korch("run", d), "model.pt2", "corrupted")


# ZVECTOR: s390x's instruction set, which no machine that runs these tests has (AVX512 failed on AVX-512 hosts)
@pytest.mark.parametrize("key, value, needle", [("torch", "2.0.0", "torch 2.0.0"),
                                                ("cpu_capability", "ZVECTOR", "CPU instruction set ZVECTOR")])
def test_a_unit_built_elsewhere_is_a_one_line_error(unit_dir, tmp_path, key, value, needle):
    d = _copy(unit_dir, tmp_path)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["unit"][key] = value
    (d / "manifest.json").write_text(json.dumps(manifest))
    assert_one_line_error(korch("run", d), needle, "run korch optimize again")


def test_kernel_by_kernel_on_request(tmp_path):
    onnx.save(_two_output_model(), tmp_path / "m.onnx")
    result = korch("optimize", tmp_path / "m.onnx", "-o", tmp_path / "out", "--target", "cpu", "--cost", "roofline",
                   "-q", "--kernel-by-kernel")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["runs"] == "kernel by kernel" and unit.UNIT_FILE not in manifest["files"]
    assert not (tmp_path / "out" / unit.UNIT_FILE).exists()


def test_an_opaque_primitive_keeps_the_kernel_by_kernel_executable(tmp_path):
    model = opaque_model()
    with pytest.warns(UserWarning, match="Det"), config.patch(compiled_unit=True):
        compiled = optimize(model, output=tmp_path / "out", target="cpu", cost="roofline")
    assert compiled.executable.check.ok and compiled.executable.unit is None
    assert compiled.manifest["runs"] == "kernel by kernel"
    assert "ONNX Runtime" in compiled.manifest["unit"]["why_not"]


def _stores(code: str) -> int:
    return code.count(".store(") + code.count("] = tmp")


@pytest.mark.parametrize("bounded", [True, False])
def test_inductor_keeps_planned_kernels_apart(bounded):
    """Two pointwise kernels in a row: Inductor alone fuses them into one loop that stores once; within
    ``kernel_boundaries`` the first kernel's output is stored and read back by the second."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import annotate, preserve_node_meta

    def two_kernels(x):
        with annotate({"korch_kernel": 0}):
            r = torch.relu(x * 2.0 + 1.0)
        with annotate({"korch_kernel": 1}):
            return (torch.exp(r) - 3.0,)

    x = torch.randn(256)
    with preserve_node_meta():
        gm = make_fx(two_kernels)(x)
    with unit.kernel_boundaries() if bounded else torch.no_grad():
        _, codes = run_and_get_code(lambda: compile_fx(gm, [x])(x))
    stores = sum(_stores(code) for code in codes)
    assert stores == (2 if bounded else 1), codes


def test_a_constant_pad_fill_is_read_once_not_on_every_call():
    """EfficientViT pads with 1.0: the fill is baked in when the kernel is made, so the plan exports (no
    data-dependent ``.item()``, which also breaks CUDA graph capture) and matches ONNX Runtime."""
    from onnx import TensorProto, helper

    from korch.ir.ort import run_model

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "pads", "fill"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array([0, 1, 2, 0, 0, 1, 2, 0], dtype=np.int64), "pads"),
             onnx.numpy_helper.from_array(np.array(1.0, dtype=np.float32), "fill")]
    graph = helper.make_graph(nodes, "pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 4, 5))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 5, 8, 5))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result = optimize(model, target="cpu", cost="roofline")
    module = unit.PlanModule(result.graph, result.plan)
    x = torch.randn(1, 3, 4, 5)
    with torch.fx.traceback.preserve_node_meta():
        exported = torch.export.export(module, (x,))
    assert "item" not in exported.graph_module.code
    np.testing.assert_allclose(module(x)[0].numpy(), run_model(model, {"x": x.numpy()})["y"], rtol=1e-6)


def test_an_embedding_lookup_is_a_primitive_inside_the_unit():
    """Gather with run-time indices is a GATHER primitive (negative indices counting from the end as ONNX
    says), fused with what follows, so a text model is one unit with no opaque node."""
    from onnx import TensorProto, helper

    from korch.ir.ops import Op
    from korch.ir.ort import run_model

    table = np.random.default_rng(0).standard_normal((10, 6)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0), helper.make_node("Relu", ["e"], ["y"])]
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info("ids", TensorProto.INT64, (2, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3, 6))],
                              [onnx.numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result = optimize(model, target="cpu", cost="roofline")
    assert not any(n.op is Op.OPAQUE for n in result.graph.nodes)
    gather = next(n for n in result.graph.nodes if n.op is Op.GATHER)
    assert any(gather.name in k.nodes and len(k.nodes) > 1 for k in result.plan.kernels)  # fused, not alone
    assert unit.supports(result.graph, "cpu") is None
    module = unit.PlanModule(result.graph, result.plan)
    ids = torch.tensor([[0, -1, 3], [9, -10, 2]])
    with torch.fx.traceback.preserve_node_meta():
        torch.export.export(module, (ids,))
    np.testing.assert_allclose(module(ids)[0].numpy(), run_model(model, {"ids": ids.numpy()})["y"])


def _matmul_relu_model(shape=(4, 16), seed=0):
    from onnx import TensorProto, helper

    weight = np.random.default_rng(seed).standard_normal((shape[-1], 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (*shape[:-1], 8))],
                              [onnx.numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), weight


def test_the_unit_is_the_fastest_of_its_weight_variants(monkeypatch):
    """choose_unit compiles the plan with and without oneDNN weight packing and with its GEMMs in ONNX
    Runtime, times them in turns and keeps the fastest; a variant that fails to compile is left out."""
    model, weight = _matmul_relu_model()
    result = optimize(model, target="cpu", cost="roofline")
    # MKL's packed GEMM is compiled where a probe finds it the faster (and this torch has it): here, always
    monkeypatch.setattr(ort_gemm, "mkl_packed_faster", lambda graph: torch._C.has_mkl)
    data, choice = unit.choose_unit(result.graph, result.plan)
    measured = choice["measured_ms"]
    # a roofline plan measured nothing with MLAS: "MLAS where planned" would be "packed for oneDNN" again
    applies = {name for name, variant in unit.VARIANTS.items() if variant.ort_within != "planned"
               and (torch._C.has_mkl or not variant.mkl_products)}
    assert set(measured) == applies and all(ms > 0 for ms in measured.values())
    assert measured[choice["weights"]] == min(measured.values())
    expected = [ort_gemm.LIBRARY_FILE] if unit.VARIANTS[choice["weights"]].ort_kernels else []
    assert choice.get("libraries", []) == expected
    x = torch.randn(4, 16)
    np.testing.assert_allclose(unit.CompiledUnit.from_bytes(data)(x)[0].numpy(),
                               torch.relu(x @ torch.from_numpy(weight)).numpy(), rtol=1e-5, atol=1e-6)

    compile_unit = unit.compile_unit

    def packed_fails(graph, plan, device="cpu", variant=unit.VARIANTS["packed for oneDNN"], size_range=None):
        if variant.prepack:
            raise RuntimeError("no oneDNN here")
        return compile_unit(graph, plan, device, variant, size_range)

    monkeypatch.setattr(unit, "compile_unit", packed_fails)
    _, choice = unit.choose_unit(result.graph, result.plan)
    assert choice["weights"] == "as given to ATen" and choice["measured_ms"] == {}
    assert choice["failed"] == {name: "RuntimeError: no oneDNN here"
                                for name, variant in unit.VARIANTS.items() if variant.prepack and name in applies}


def _wrapper_code(package: bytes) -> str:
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        return "".join(archive.read(n).decode() for n in archive.namelist() if n.endswith(".wrapper.cpp"))


def test_a_units_weights_are_packed_as_its_variant_says_whatever_the_process_compiled_before():
    """Inductor decides once per process whether frozen compiles pack their weights (on the first); a unit's
    variant must decide for itself, in either order: a 3x3 convolution is oneDNN's packed one only when packed."""
    result = optimize(_pointwise_model(), target="cpu", cost="roofline")

    def packed(name: str) -> bool:
        code = _wrapper_code(unit.compile_unit(result.graph, result.plan, "cpu", unit.VARIANTS[name]))
        return "mkldnn__convolution_pointwise" in code

    order = ["as given to ATen", "packed for oneDNN", "as given to ATen", "packed for oneDNN"]
    assert [packed(name) for name in order] == [False, True, False, True]
    from torch._inductor.fx_passes import freezing_patterns

    with freezing.weight_packing(False):
        pass
    entries = [e for p in freezing_patterns.pass_patterns for v in p.patterns.values() for e in v]
    assert any(not hasattr(e, "handler") for e in entries)  # Inductor's other patterns survive a compile
    assert any("mkldnn_fusion" in getattr(getattr(e, "handler", None), "__module__", "") for e in entries)


def test_a_network_with_convolutions_has_its_boundary_layout_measured_too():
    """With convolutions, the fastest weight variant is compiled again with NCHW values between kernels, the two
    take turns and the faster is kept (channels-last helps Segformer-B0 and slows Candy)."""
    model = _two_output_model()
    result = optimize(model, target="cpu", cost="roofline")
    data, choice = unit.choose_unit(result.graph, result.plan)
    measured, weights = choice["measured_ms"], choice["weights"]
    assert weights in unit.VARIANTS and choice["boundaries"] in ("channels-last", "NCHW")
    # the fastest so far is challenged: the weights' variant, or it with attention in MLAS where that won its turns
    challenger = next(name for name in measured if name.endswith(", NCHW between kernels"))
    fastest = challenger.removesuffix(", NCHW between kernels")
    assert fastest in (weights, f"{weights}, {unit.ACTIVATIONS} in MLAS")
    pair = {layout: measured[f"{fastest}, {layout} between kernels"] for layout in ("channels-last", "NCHW")}
    assert min(pair, key=pair.get) == choice["boundaries"]
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = run_model(model, {"x": x})
    got = unit.CompiledUnit.from_bytes(data)(torch.from_numpy(x))
    for value, name in zip(got, ("p", "y")):
        np.testing.assert_allclose(value.numpy(), want[name], rtol=1e-4, atol=1e-5)


def _pointwise_model() -> onnx.ModelProto:
    """A 3x3 convolution, then a 1x1 one (16 -> 8 channels) with its bias, and a ReLU."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w3"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w1", "b"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w3", (16, 3, 3, 3)), ("w1", (8, 16, 1, 1)), ("b", (8,)))]
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 8, 8))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_pointwise_convolutions_as_products_are_measured_against_the_library():
    """A graph with a 1x1 convolution has its unit compiled again with the library's convolution for it; the
    two take turns and the faster is kept (products: YOLOX-Nano 10% faster; the library: Segformer-B0)."""
    model = _pointwise_model()
    result = optimize(model, target="cpu", cost="roofline")
    data, choice = unit.choose_unit(result.graph, result.plan)
    measured, best = choice["measured_ms"], choice["weights"]
    if choice["boundaries"] == "NCHW":
        best = f"{best}, NCHW between kernels"
    pair = {"products": measured[f"{best}, pointwise convolutions as products"],
            "library": measured[f"{best}, pointwise convolutions by the library"]}
    assert min(pair, key=pair.get) == choice["pointwise convolutions"]
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = unit.CompiledUnit.from_bytes(data)(torch.from_numpy(x))[0]
    np.testing.assert_allclose(got.numpy(), run_model(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def test_gemms_by_onnx_runtime_compute_each_units_own_product():
    """Two units compiled with ONNX Runtime GEMMs, loaded in one process, each multiply by their own weight
    (sessions are keyed by a per-unit token), batched activations included, as ONNX Runtime computes it."""
    from korch.ir.ort import run_model

    variant = unit.VARIANTS["MLAS by ONNX Runtime"]
    models = [_matmul_relu_model((2, 5, 16), seed) for seed in (1, 2)]
    units = []
    for model, _ in models:
        result = optimize(model, target="cpu", cost="roofline")
        units.append(unit.CompiledUnit.from_bytes(unit.compile_unit(result.graph, result.plan, "cpu", variant)))
    x = torch.randn(2, 5, 16)
    for (model, _), loaded in zip(models, units):
        np.testing.assert_allclose(loaded(x)[0].numpy(), run_model(model, {"x": x.numpy()})["y"],
                                   rtol=1e-5, atol=1e-6)


def test_mlas_where_planned_runs_in_onnx_runtime_only_the_kernels_the_plan_measured_so():
    """A plan that measured one product with MLAS and another with Inductor: the unit variant that runs each
    kernel as its plan priced it replaces only the first, and computes both as ONNX Runtime does."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, (32, 16))
    graph = helper.make_graph(nodes, "two_products", [x_info],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (32, 8))],
                              [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
                               for n, s in (("w1", (16, 24)), ("w2", (24, 8)))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result = optimize(model, target="cpu", cost="roofline")
    products = [n.name for n in result.graph.nodes if n.op.value == "MatMul"]
    first = next(k for k in result.plan.kernels if products[0] in k.nodes)
    assert products[1] not in first.nodes
    kernels = tuple(dataclasses.replace(k, backend="mlas" if k is first else "inductor") for k in result.plan.kernels)
    plan = dataclasses.replace(result.plan, kernels=kernels)
    assert unit.mlas_kernels(plan) == frozenset(first.nodes)
    module = unit.PlanModule(result.graph, plan, ort_kernels=True, ort_within="planned")
    assert {name for name, step in module._replaced.items() if step} == {products[0]}
    everywhere = unit.PlanModule(result.graph, plan, ort_kernels=True)
    assert {name for name, step in everywhere._replaced.items() if step} == set(products)
    package = unit.compile_unit(result.graph, plan, "cpu", unit.VARIANTS["MLAS where planned"])
    loaded = unit.CompiledUnit.from_bytes(package)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    np.testing.assert_allclose(loaded(torch.from_numpy(x))[0].numpy(), run_model(model, {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)


def test_a_units_1x1_convolutions_are_products_but_where_the_plan_measured_the_librarys():
    """Two 1x1 convolutions in two kernels, the first measured with the library's convolution
    (``LibraryConvBackend``): the unit computes that one as oneDNN's convolution, the other as a product, and
    matches ONNX Runtime; the manifest's choice says "as planned"."""
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (16, 8, 1, 1)), ("w2", (4, 16, 1, 1)))]
    graph = helper.make_graph(nodes, "two_pointwise",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8, 6, 6))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, 6, 6))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result = optimize(model, target="cpu", cost="roofline")
    convolutions = [n.name for n in result.graph.nodes if n.op.value == "Conv"]
    first = next(k for k in result.plan.kernels if convolutions[0] in k.nodes)
    assert convolutions[1] not in first.nodes
    kernels = tuple(dataclasses.replace(k, backend="inductor-libconv" if k is first else "inductor")
                    for k in result.plan.kernels)
    plan = dataclasses.replace(result.plan, kernels=kernels)
    assert unit.library_conv_kernels(plan) == frozenset(first.nodes)
    x = torch.from_numpy(rng.standard_normal((1, 8, 6, 6)).astype(np.float32))
    exported = torch.export.export(unit.PlanModule(result.graph, plan).eval(), (x,))
    targets = [str(n.target) for n in exported.graph.nodes]
    assert sum("conv" in t for t in targets) == 1 and sum("bmm" in t for t in targets) == 1, targets
    data, choice = unit.choose_unit(result.graph, plan)
    assert choice["pointwise convolutions"] in (unit.PLANNED, "library")
    assert any(name.endswith("pointwise convolutions as planned") for name in choice["measured_ms"])
    np.testing.assert_allclose(unit.CompiledUnit.from_bytes(data)(x)[0].numpy(),
                               run_model(model, {"x": x.numpy()})["y"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels_last", [True, False])
def test_a_value_a_convolution_reads_crosses_kernel_boundaries_channels_last(channels_last):
    """Two kernels' outputs concatenated for a convolution in a third: Inductor's layout optimization wants the
    convolution's input channels-last. With channels-last boundaries the concatenation is laid out that way and
    both kernels store into it (two stores, and the output's); in NCHW it is stored NCHW and copied to
    channels-last for the convolution (a third of Segformer-B0's unit)."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import annotate, preserve_node_meta

    weight = torch.randn(16, 32, 1, 1)

    def three_kernels(x):
        with annotate({"korch_kernel": 0}):
            a = torch.relu(x * 2.0 + 1.0)
        with annotate({"korch_kernel": 1}):
            b = torch.exp(x)
        with annotate({"korch_kernel": 2}):
            return (torch.nn.functional.conv2d(torch.cat([a, b], 1), weight),)

    x = torch.randn(1, 16, 8, 8)
    with preserve_node_meta():
        gm = make_fx(three_kernels)(x)
    with unit.kernel_boundaries(channels_last), torch.no_grad():
        got, codes = run_and_get_code(lambda: compile_fx(gm, [x])(x))
    torch.testing.assert_close(got[0], three_kernels(x)[0])
    code = "\n".join(codes)
    nchw_concatenation = "(1, 32, 8, 8), (2048, 64, 8, 1)"  # a buffer's size and strides in the wrapper
    assert (nchw_concatenation in code) != channels_last, code
    assert "(1, 32, 8, 8), (2048, 1, 256, 32)" in code  # the channels-last one the convolution reads, either way
    assert sum(_stores(c) for c in codes) == (3 if channels_last else 4), code


def test_a_concatenation_of_narrow_slices_is_stored_nchw_at_channels_last_boundaries():
    """YOLOX's stem: four stride-2 slices of a 3-channel image concatenated for a convolution. Channels-last,
    each slice's copy would write every 12th float alone; with fewer channels per input than a vector holds,
    the concatenation is stored NCHW (and copied for the convolution), while a wide one stays channels-last."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import annotate, preserve_node_meta

    for channels, nchw in ((3, True), (16, False)):
        weight = torch.randn(8, 4 * channels, 3, 3)

        def two_kernels(x):
            with annotate({"korch_kernel": 0}):
                y = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)
            with annotate({"korch_kernel": 1}):
                return (torch.nn.functional.conv2d(y, weight, padding=1),)

        x = torch.randn(1, channels, 16, 16)
        with preserve_node_meta():
            gm = make_fx(two_kernels)(x)
        with unit.kernel_boundaries(True), torch.no_grad():
            got, codes = run_and_get_code(lambda: compile_fx(gm, [x])(x))
        torch.testing.assert_close(got[0], two_kernels(x)[0], rtol=1e-4, atol=1e-4)
        nchw_concatenation = f"(1, {4 * channels}, 8, 8), ({4 * channels * 64}, 64, 8, 1)"
        assert (nchw_concatenation in "\n".join(codes)) == nchw, codes


@pytest.mark.parametrize("boundaries, stored", [("nchw", "NCHW"), ("channels-last", "channels-last")])
def test_the_boundary_layout_can_be_fixed_instead_of_measured(boundaries, stored):
    """``--unit-boundaries nchw`` or ``channels-last``: no second compile, no timing of the layouts, the
    layout the user asked for."""
    result = optimize(_two_output_model(), target="cpu", cost="roofline")
    with config.patch(unit_boundaries=boundaries):
        _, choice = unit.choose_unit(result.graph, result.plan)
    assert choice["boundaries"] == stored
    assert not any("between kernels" in name for name in choice["measured_ms"])


def test_an_unknown_boundary_layout_is_a_one_line_error(tmp_path):
    onnx.save(_two_output_model(), tmp_path / "m.onnx")
    with pytest.raises(KorchError, match="unknown unit boundary layout 'nhwc'"):
        optimize(str(tmp_path / "m.onnx"), target="cpu", cost="roofline", unit_boundaries="nhwc")


def test_a_value_only_a_pointwise_product_reads_is_stored_channels_last():
    """A pointwise convolution is a product over the [N, H, W, C] view of its input
    (``torch_ops._pointwise_conv``): with channels-last boundaries, a value only such a product reads is
    stored channels-last too, so the product reads whole rows of channels (as a convolution would), and what
    it is computed from follows; with NCHW boundaries it stays NCHW."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import annotate, preserve_node_meta

    weight, rows = torch.randn(16, 32, 3, 3), torch.randn(8, 32)

    def three_kernels(x):
        with annotate({"korch_kernel": 0}):
            a = torch.relu(x * 2.0 + 1.0)
        with annotate({"korch_kernel": 1}):  # a convolution of the input: Inductor's layout optimisation on
            c = torch.nn.functional.conv2d(x, weight, padding=1)
        with annotate({"korch_kernel": 2}):
            y = torch.bmm(a.permute(0, 2, 3, 1).reshape(1, 64, 32), rows.t().expand(1, 32, 8))
        return c, y

    x = torch.randn(1, 32, 8, 8)
    with preserve_node_meta():
        gm = make_fx(three_kernels)(x)
    for channels_last, strides in ((True, "(2048, 32, 1)"), (False, "(64, 1, 64)")):
        with unit.kernel_boundaries(channels_last), torch.no_grad():
            got, (code,) = run_and_get_code(lambda: compile_fx(gm, [x])(x))
        for value, want in zip(got, three_kernels(x)):  # 288-term sums, in another order
            torch.testing.assert_close(value, want, rtol=1e-4, atol=1e-4)
        (product,) = [line for line in code.splitlines() if "extern_kernels.bmm(" in line]
        assert f"(1, 64, 32), {strides}" in product, code


def test_a_value_computed_from_a_convolution_that_no_convolution_reads_is_not_stored_channels_last():
    """Attention heads computed from a convolution's output, [1, heads, pixels, head width], are no image:
    stored channels-last at a boundary (heads as channels) they were copied by every ``bmm`` that read them
    (EfficientViT). With channels-last boundaries only values a convolution reads are laid out so; the heads
    keep the layout their product wants, and the convolution's output is still channels-last."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import annotate, preserve_node_meta

    weight, later = torch.randn(32, 16, 1, 1), torch.randn(8, 16, 3, 3)

    def four_kernels(x):
        with annotate({"korch_kernel": 0}):
            c = torch.nn.functional.conv2d(x, weight)  # [1, 32, 8, 8]
        with annotate({"korch_kernel": 1}):
            heads = torch.relu(c).reshape(1, 4, 8, 64).transpose(2, 3) + 1.0  # [1, 4, 64, 8]
        with annotate({"korch_kernel": 2}):
            scores = torch.matmul(heads, heads.transpose(2, 3))
        with annotate({"korch_kernel": 3}):  # a later convolution: Inductor's layout optimisation follows
            return scores, torch.nn.functional.conv2d(x, later, padding=1)  # what is computed before it

    x = torch.randn(1, 16, 8, 8)
    with preserve_node_meta():
        gm = make_fx(four_kernels)(x)
    with unit.kernel_boundaries(True), torch.no_grad():
        got, codes = run_and_get_code(lambda: compile_fx(gm, [x])(x))
    for value, want in zip(got, four_kernels(x)):
        torch.testing.assert_close(value, want, rtol=1e-4, atol=1e-4)
    code = "\n".join(codes)
    assert "(1, 4, 64, 8), (2048, 512, 8, 1)" in code, code  # the heads, as their product reads them
    assert "(1, 4, 64, 8), (2048, 1, 32, 4)" not in code, code
    assert "(1, 32, 8, 8), (2048, 1, 256, 32)" in code, code  # the convolution's output


@pytest.mark.parametrize("first, second", [("channels_last", "contiguous"), ("contiguous", "channels_last")])
def test_planned_layouts_decide_how_each_value_between_kernels_is_stored(first, second):
    """With layouts the plan chose (``orchestrate/layouts.py``), a value between kernels is stored in the
    layout of the kernel that writes it, whatever Inductor's own preference: here a pointwise kernel's output
    that a convolution reads, and the convolution's output that another pointwise kernel reads."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import annotate, preserve_node_meta

    weight = torch.randn(16, 16, 3, 3)

    def three_kernels(x):
        with annotate({"korch_kernel": 0, "korch_layout": first}):
            a = torch.relu(x * 2.0 + 1.0)
        with annotate({"korch_kernel": 1, "korch_layout": second}):
            c = torch.nn.functional.conv2d(a, weight, padding=1)
        with annotate({"korch_kernel": 2, "korch_layout": "contiguous"}):
            return (torch.exp(c),)

    x = torch.randn(1, 16, 8, 8)
    with preserve_node_meta():
        gm = make_fx(three_kernels)(x)
    with unit.kernel_boundaries(planned=True), torch.no_grad():
        got, codes = run_and_get_code(lambda: compile_fx(gm, [x])(x))
    torch.testing.assert_close(got[0], three_kernels(x)[0], rtol=1e-4, atol=1e-4)
    code = "\n".join(codes)
    strides = {"contiguous": "(1, 16, 8, 8), (1024, 64, 8, 1)", "channels_last": "(1, 16, 8, 8), (1024, 1, 128, 16)"}
    # the first kernel's output is a buffer of its own, in the first kernel's layout
    assert f"buf0 = empty_strided_cpu({strides[first]}" in code, code


def test_a_recorded_choice_names_its_variant():
    """``chosen_variant`` reads back a manifest's ``unit``: weights, boundary layout, pointwise convolutions."""
    assert unit.chosen_variant({"weights": "as given to ATen"}) == unit.VARIANTS["as given to ATen"]
    chosen = unit.chosen_variant({"weights": "MLAS by ONNX Runtime", "boundaries": "NCHW",
                                  "pointwise convolutions": "library"})
    assert chosen == unit.Variant(prepack=True, ort_kernels=True, channels_last_boundaries=False,
                                  pointwise_products=False)


def test_variants_are_compared_by_their_fastest_call_not_their_median():
    """A shared host only slows calls down, so choose_unit compares each unit's fastest call: a unit that takes
    2 ms when left alone but is slowed to 6 ms every other call beats one that always takes 3 ms, though its
    median is the higher."""
    import itertools
    import time

    slowed = itertools.cycle([0.002, 0.006])
    units = {"steady": lambda: time.sleep(0.003), "slowed every other call": lambda: time.sleep(next(slowed))}
    seconds = unit._fastest_seconds(units, (), "cpu")
    assert seconds["slowed every other call"] < 0.0028 < 0.003 <= seconds["steady"]


def _activations_model() -> onnx.ModelProto:
    """A 3x3 convolution with its bias and a HardSwish, then a product by a weight with its bias and a GELU (16
    output channels: with fewer the convolution folds its taps into channels, ``torch_ops._narrow_conv``)."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["h"]), helper.make_node("MatMul", ["h", "m"], ["p"]),
             helper.make_node("Add", ["p", "bm"], ["q"]), helper.make_node("Gelu", ["q"], ["y"])]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w", (16, 3, 3, 3)), ("b", (16,)), ("m", (8, 16)), ("bm", (16,)))]
    graph = helper.make_graph(nodes, "activations",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 6, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 16, 6, 16))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_activations_and_biases_are_the_librarys_post_ops_in_a_packed_unit():
    """Fission writes HardSwish and GELU as several primitives; in one kernel with the convolution or product
    before them, a unit packed for oneDNN computes each as that call's post-op, and matches ONNX Runtime."""
    from korch.orchestrate.plan import PlannedKernel

    model = _activations_model()
    result = optimize(model, target="cpu", cost="roofline")
    graph = result.graph
    whole = PlannedKernel(name="k0", nodes=tuple(n.name for n in graph.nodes), ops="all", inputs=tuple(graph.inputs),
                          outputs=tuple(graph.outputs), signature="", cost_s=0.0, bound_s=0.0, measured=False)
    plan = dataclasses.replace(result.plan, kernels=(whole,), conversions=())
    package = unit.compile_unit(graph, plan, "cpu", unit.VARIANTS["packed for oneDNN"])
    code = _wrapper_code(package)
    assert '"hardswish"' in code and '"gelu"' in code
    x = np.random.default_rng(6).normal(0, 3, (1, 3, 6, 8)).astype(np.float32)
    got = unit.CompiledUnit.from_bytes(package)(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(got, run_model(model, {"x": x})["y"], rtol=1e-4, atol=1e-4)


def _depthwise_model() -> onnx.ModelProto:
    """ConvNeXt's depthwise convolution: 7x7 over 16 channels, padded to keep the size, then a ReLU."""
    weight = np.random.default_rng(2).standard_normal((16, 1, 7, 7)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=16, pads=[3, 3, 3, 3]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "depthwise",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16, 12, 12))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_with_planned_layouts_a_unit_computes_each_kernel_as_it_was_measured(layout):
    """A unit of a plan that chose its kernels' layouts runs each kernel's operations in that kernel's layout, as
    the kernel's measurement did (``torch_ops.kernel_function``): a depthwise convolution of an NCHW kernel is
    the library's, of a channels-last one its taps' sum. Channels-last boundaries made every kernel's taps, 3.5x
    the time the plan priced for ConvNeXt's NCHW 7x7 ones. Without planned layouts the boundaries still decide."""
    result = optimize(_depthwise_model(), target="cpu", cost="roofline")
    plan = dataclasses.replace(result.plan, kernels=tuple(dataclasses.replace(k, layout=layout)
                                                          for k in result.plan.kernels))

    def conv_step(variant):
        module = unit.plan_module(result.graph, plan, "cpu", variant)
        conv = next(node for node in result.graph.nodes if node.op.value == "Conv")
        return next(fn for kernel in module._kernels for fn, ins, outs in kernel if outs == conv.outputs)

    planned = dataclasses.replace(unit.VARIANTS["packed for oneDNN"], planned_layouts=True)
    taps = conv_step(planned).__qualname__.startswith("_depthwise_conv")
    assert taps == (layout == "channels_last")
    assert conv_step(unit.VARIANTS["packed for oneDNN"]).__qualname__.startswith("_depthwise_conv")
    x = torch.randn(1, 16, 12, 12)
    with torch.inference_mode():
        got = unit.plan_module(result.graph, plan, "cpu", planned)(x)[0]
    np.testing.assert_allclose(got.numpy(), run_model(_depthwise_model(), {"x": x.numpy()})["y"], rtol=1e-4, atol=1e-4)
