"""``korch optimize`` writes an executable, ``korch run [--check]`` runs it, ``korch bench`` times it;
bad input is one line on stderr with exit status 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from korch.ir.ort import run_model
from tests.runtime.test_executable import _two_output_model
from tests.test_cli import assert_one_line_error, korch

ROOT = Path(__file__).resolve().parents[2]


def optimize_two_output_model(root, run=korch):
    """``korch optimize`` (roofline, CPU) of the two-output model into ``root/out``; returns its stdout."""
    import onnx

    onnx.save(_two_output_model(), root / "m.onnx")
    result = run("optimize", root / "m.onnx", "-o", root / "out", "--target", "cpu", "--cost", "roofline", "-q")
    assert result.returncode == 0, result.stderr
    assert "matches ONNX Runtime" in result.stdout and "korch run" in result.stdout
    return result.stdout


@pytest.fixture(scope="module")
def outdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    optimize_two_output_model(root)
    return root / "out"


def test_run_check_passes_and_prints_the_errors(outdir):
    result = korch("run", outdir, "--check")
    assert result.returncode == 0, result.stderr
    assert "seeded random input(s): x" in result.stdout
    assert "max abs error" in result.stdout and "max rel error" in result.stdout
    assert "matches ONNX Runtime" in result.stdout


def test_run_with_given_inputs_saves_the_outputs(outdir, tmp_path):
    import onnx

    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = korch("run", outdir, "--input", f"x={tmp_path / 'x.npy'}", "--save-outputs", tmp_path / "o", "--check")
    assert result.returncode == 0, result.stderr
    want = run_model(onnx.load(str(outdir / "reference.onnx")), {"x": x})
    np.testing.assert_allclose(np.load(tmp_path / "o" / "y.npy"), want["y"], rtol=1e-4, atol=1e-5)


def test_run_check_fails_on_a_mismatch(outdir, tmp_path):
    """An executable whose reference model disagrees: --check exits 1 and says so."""
    import shutil

    import onnx
    from onnx import helper

    d = tmp_path / "copy"
    shutil.copytree(outdir, d)
    reference = onnx.load(str(d / "reference.onnx"))
    mul = next(n for n in reference.graph.node if n.op_type == "Mul")
    mul.op_type = "Add"
    data = helper.make_model(reference.graph, opset_imports=reference.opset_import).SerializeToString()
    (d / "reference.onnx").write_bytes(data)
    manifest = json.loads((d / "manifest.json").read_text())
    import hashlib

    manifest["files"]["reference.onnx"] = hashlib.sha256(data).hexdigest()
    (d / "manifest.json").write_text(json.dumps(manifest))
    result = korch("run", d, "--check")
    assert result.returncode == 1
    assert "DOES NOT match" in result.stdout and "MISMATCH" in result.stdout


def test_a_damaged_reference_stops_the_check_not_the_run(outdir, tmp_path):
    """reference.onnx is verified where it is used: running does not read it, --check refuses it."""
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(outdir, d)
    (d / "reference.onnx").write_bytes(b"garbage")
    assert korch("run", d).returncode == 0
    assert_one_line_error(korch("run", d, "--check"), "reference.onnx", "corrupted")


def test_run_bad_inputs_are_one_line_errors(outdir, tmp_path):
    np.save(tmp_path / "wrong.npy", np.zeros((1, 3, 8, 9), np.float32))
    np.save(tmp_path / "int.npy", np.zeros((1, 3, 8, 8), np.int64))
    (tmp_path / "junk.npy").write_bytes(b"not an array")
    assert_one_line_error(korch("run", outdir, "--input", f"x={tmp_path / 'wrong.npy'}"), "1x3x8x9")
    assert_one_line_error(korch("run", outdir, "--input", f"x={tmp_path / 'int.npy'}"), "int64")
    assert_one_line_error(korch("run", outdir, "--input", f"x={tmp_path / 'junk.npy'}"), "not a .npy")
    assert_one_line_error(korch("run", outdir, "--input", f"x={tmp_path / 'none.npy'}"), "no such file")
    assert_one_line_error(korch("run", outdir, "--input", "x"), "NAME=FILE.npy")
    assert_one_line_error(korch("run", outdir, "--input", f"q={tmp_path / 'wrong.npy'}"), "unknown input")
    assert_one_line_error(korch("run", outdir, "--target", "h100"), "built for cpu")
    assert_one_line_error(korch("run", tmp_path / "nowhere"), "no such directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(korch("run", tmp_path / "empty"), "not a korch executable")


def test_bench_prints_ratios_writes_json_and_the_report(outdir, tmp_path):
    result = korch("bench", outdir.parent / "m.onnx", "--target", "cpu", "--cost", "roofline", "--against",
                   "eager,compile,ort", "--budget", "0.05", "-o", tmp_path / "b", "--json", tmp_path / "b.json", "-q")
    assert result.returncode == 0, result.stderr
    assert "korch speedup" in result.stdout and "ort" in result.stdout
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["korch"]["median_s"] > 0 and set(data["speedup"]) == {"eager", "compile", "ort"}
    assert all(p["runs"] >= 10 for p in data["peers"])
    # an ONNX file's torch peers run its own graph (onnx2torch), never korch's primitives
    assert {p["name"]: p["note"] for p in data["peers"]}["eager"] == "(onnx2torch)"
    assert 'id="benchmark"' in (tmp_path / "b" / "report.html").read_text()


def test_bench_refuses_unknown_peers(tmp_path):
    assert_one_line_error(korch("bench", "zoo:candy", "--against", "tensorrt", "-o", tmp_path / "b"), "tensorrt")


@pytest.mark.parametrize("arguments", [["run", "{tmp}/nowhere"], ["run", "{tmp}", "--input", "x"]])
def test_a_wrong_run_command_line_is_refused_before_torch_is_imported(tmp_path, arguments):
    (tmp_path / "manifest.json").write_text("{}")  # enough to pass for an executable until it is read
    code = ("import sys; from korch.cli import main; code = main(sys.argv[1:]); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, *[a.format(tmp=tmp_path) for a in arguments]],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                            timeout=120)
    assert result.returncode == 2 and "korch: error:" in result.stderr, result.stderr
    assert result.stdout.strip() == "no torch"
