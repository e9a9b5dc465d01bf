"""korch asks OpenMP for brief spinning when it is imported before torch, and knows when it could not."""

import os
import subprocess
import sys

import pytest

from korch import threads


def _spin_count_seen(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          check=True, timeout=120)
    return done.stdout.split()[-2:]


def test_korch_imported_first_asks_for_brief_spinning():
    code = "import korch, os; from korch import threads; print(os.environ.get('GOMP_SPINCOUNT'), threads.openmp_yields())"
    assert _spin_count_seen(code) == [str(threads.SPIN_COUNT), "True"]


def test_torch_imported_first_keeps_its_default_and_korch_knows():
    code = ("import torch, korch, os; from korch import threads; "
            "print(os.environ.get('GOMP_SPINCOUNT'), threads.openmp_yields())")
    assert _spin_count_seen(code) == ["None", "False"]


def test_a_users_own_policy_is_kept():
    code = "import korch, os; from korch import threads; print(os.environ.get('GOMP_SPINCOUNT'), threads.openmp_yields())"
    assert _spin_count_seen(code, OMP_WAIT_POLICY="ACTIVE") == ["None", "False"]
    assert _spin_count_seen(code, OMP_WAIT_POLICY="passive") == ["None", "True"]


@pytest.mark.parametrize("env, yields", [({"GOMP_SPINCOUNT": "100"}, True), ({"GOMP_SPINCOUNT": "300000"}, False),
                                         ({"GOMP_SPINCOUNT": "lots"}, False), ({}, False)])
def test_spin_counts_above_the_limit_do_not_yield(env, yields):
    assert threads._yields(env) is yields
