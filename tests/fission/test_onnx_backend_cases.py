"""Every fission rule against the operator test cases shipped in the ``onnx`` package."""

import json
import os

import pytest

from tests.fission.backend_cases import run_all, summary

SUMMARY_FILE = os.path.join(os.path.dirname(__file__), "..", "..", ".pytest_cache", "korch-onnx-backend-summary.txt")


def test_every_claimed_onnx_backend_case_passes():
    outcomes = run_all()
    text = summary(outcomes)
    os.makedirs(os.path.dirname(SUMMARY_FILE), exist_ok=True)
    with open(SUMMARY_FILE, "w") as f:
        f.write(text)
    print(text)
    assert len(outcomes) > 500, "too few claimed cases: the collector or the registry is broken"
    failed = [o for o in outcomes if o.status == "failed"]
    assert not failed, text
    unexplained = [o for o in outcomes if o.status == "skipped" and not o.reason]
    assert not unexplained


@pytest.mark.parametrize("op", ["Softmax", "LayerNormalization", "Conv", "Resize", "Slice", "Pad"])
def test_key_operators_have_passing_cases(op):
    outcomes = run_all({op})
    passed = [o for o in outcomes if o.status == "passed"]
    assert passed, json.dumps([o.__dict__ for o in outcomes])[:2000]
