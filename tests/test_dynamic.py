"""``--dynamic``: one OUTDIR serving a range of sequence lengths of a BERT-like model from ``transformers``
(random weights, exported with a symbolic ``seq``), checked against ONNX Runtime at every size in the range.

One executable is built for the module (seq=1..6: buckets 1, 2, 3-4, 5-6, the last two dynamic units);
to keep it quick, each unit is compiled in one weight variant instead of timing all three.
"""

import json
import shutil

import numpy as np
import pytest
import torch

from korch.errors import KorchError
from korch.frontend.torch_module import export_module
from korch.ir.ort import run_model
from korch.runtime import unit
from korch.runtime.buckets import BucketedExecutable
from tests.test_cli import assert_one_line_error, korch

transformers = pytest.importorskip("transformers")

LOW, HIGH, VOCAB = 1, 6, 500


class _Hidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


@pytest.fixture(scope="module")
def bert_path(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    model = _Hidden(transformers.BertModel(config, add_pooling_layer=False)).eval()
    seq = torch.export.Dim("seq", min=1, max=64)
    return export_module(model, (torch.randint(0, VOCAB, (1, 8)),), tmp_path_factory.mktemp("bert") / "bert.onnx",
                         input_names=["input_ids"], dynamic_shapes={"ids": {1: seq}})


@pytest.fixture(scope="module")
def built(bert_path, tmp_path_factory):
    from korch.dynamic import optimize_dynamic

    out = tmp_path_factory.mktemp("dynamic") / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unit, "VARIANTS", {"packed for oneDNN": unit.VARIANTS["packed for oneDNN"]})
        result = optimize_dynamic(str(bert_path), ("seq", LOW, HIGH), output=out, cost="roofline")
    return out, result


def test_buckets_are_powers_of_two_with_dynamic_units(built):
    out, result = built
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(b["low"], b["high"]) for b in manifest["buckets"]] == [(1, 1), (2, 2), (3, 4), (5, 6)]
    assert manifest["sizes"] == {"dim": "seq", "low": LOW, "high": HIGH, "axes": {"input_ids": [1]}}
    assert manifest["check"]["ok"]
    for bucket in manifest["buckets"]:
        inner = json.loads((out / bucket["dir"] / "manifest.json").read_text())
        assert inner["runs"] == "compiled unit"
        assert ("sizes" in inner) == (bucket["low"] < bucket["high"])
        assert set(inner["check"]["sizes"]) == {str(bucket["low"]), str(bucket["high"])}
    assert "seq = 1..6" in (out / "report.md").read_text()


def test_every_size_in_the_range_matches_onnxruntime(built, bert_path):
    out, _ = built
    executable = __import__("korch").load(out)
    assert isinstance(executable, BucketedExecutable)
    rng = np.random.default_rng(0)
    for size in range(LOW, HIGH + 1):
        ids = rng.integers(0, VOCAB, (1, size)).astype(np.int64)
        expected = run_model(str(bert_path), {"input_ids": ids})
        got = executable(ids)
        assert got.shape == (1, size, 32)
        np.testing.assert_allclose(got, expected["output"], rtol=1e-4, atol=1e-5)
    with pytest.raises(KorchError, match="outside the range 1..6"):
        executable(np.zeros((1, HIGH + 1), np.int64))
    with pytest.raises(KorchError, match="expected 1xseq"):
        executable(np.zeros((2, 4), np.int64))


def test_a_dynamic_unit_refuses_a_size_outside_its_bucket(built):
    from korch.runtime.load import load

    out, _ = built
    bucket = load(out / "buckets" / "seq_3-4")
    assert bucket(np.zeros((1, 3), np.int64)).shape == (1, 3, 32)
    with pytest.raises(KorchError, match=r"seq\(3..4\)"):
        bucket(np.zeros((1, 5), np.int64))


def test_run_checks_every_bucket_and_refuses_sizes_out_of_range(built):
    out, _ = built
    checked = korch("run", out, "--check")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.count("matches ONNX Runtime") == 6  # sizes 1, 2, 3, 4, 5, 6: each bucket's ends
    at = korch("run", out, "--dim", "seq=5", "--check")
    assert at.returncode == 0 and "at seq=5" in at.stdout, at.stderr
    assert_one_line_error(korch("run", out, "--dim", "seq=9"), "outside the range 1..6")
    assert_one_line_error(korch("run", out, "--dim", "len=3"), "--dim names len")


def test_a_corrupted_bucket_fails_when_it_is_opened(built, tmp_path):
    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    unit_file = copy / "buckets" / "seq_5-6" / "model.pt2"
    unit_file.write_bytes(unit_file.read_bytes()[:-10] + b"0123456789")
    executable = __import__("korch").load(copy)
    assert executable(np.zeros((1, 2), np.int64)).shape == (1, 2, 32)  # another bucket still runs
    with pytest.raises(KorchError, match="corrupted"):
        executable(np.zeros((1, 5), np.int64))


def test_bad_dynamic_options_are_one_line_errors(bert_path, tmp_path):
    out = tmp_path / "out"
    assert_one_line_error(korch("optimize", bert_path, "--dynamic", "seq=0..4", "-o", out, "-q"), "bad --dynamic")
    assert_one_line_error(korch("optimize", bert_path, "--dynamic", "len=1..4", "-o", out, "-q", "--cost",
                                "roofline"), "len")
    assert_one_line_error(korch("optimize", bert_path, "--dynamic", "seq=1..4", "--plan-only", "-o", out, "-q"),
                          "--plan-only")
    assert_one_line_error(korch("optimize", bert_path, "--dynamic", "seq=1..4", "--target", "h100", "-o", out,
                                "-q", "--cost", "roofline"), "CPUs")
    assert not (out / "manifest.json").exists()


def test_the_api_takes_one_dimension_and_its_range(bert_path):
    import korch

    with pytest.raises(KorchError, match="one dimension"):
        korch.optimize(str(bert_path), target="cpu", dynamic={"seq": (1, 4), "batch": (1, 2)})
    with pytest.raises(KorchError, match="check_inputs does not apply"):
        korch.optimize(str(bert_path), target="cpu", dynamic={"seq": (1, 4)}, check_inputs={})
    with pytest.raises(KorchError, match="1 <= low < high"):
        korch.optimize(str(bert_path), target="cpu", dynamic={"seq": (4, 4)})
