"""Tests marked ``gpu`` skip, with a reason, where torch sees no CUDA device (the hook in tests/conftest.py)."""

import pytest
import torch

from tests import conftest

pytest_plugins = ["pytester"]


@pytest.mark.gpu
def test_a_gpu_test_runs_only_where_cuda_is():
    assert torch.cuda.is_available()  # without the hook this fails on every machine without CUDA


@pytest.mark.parametrize("cuda", [False, True])
def test_the_hook_skips_gpu_tests_only_without_cuda(pytester, monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    pytester.makeconftest("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    pytester.makeini('[pytest]\nmarkers =\n    gpu: needs a CUDA device\n')
    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpu
        def test_on_gpu():
            pass

        def test_anywhere():
            pass
    """)
    result = pytester.runpytest_inprocess("-rs", "-p", "no:cacheprovider", "-p", "no:xdist")
    if cuda:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines([f"SKIPPED *.py:3: {conftest.GPU_SKIP_REASON}"])  # line 3: test_on_gpu
