"""korch asks OpenMP for brief spinning when it is imported before torch, and keeps what the user chose."""

import os
import subprocess
import sys

from korch import threads

_SHOW = "import korch, os; from korch import threads; print(os.environ.get('GOMP_SPINCOUNT'), threads.describe())"


def _spin_count_seen(code: str, **env) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          check=True, timeout=120)
    return done.stdout.split()[-2:]


def test_korch_imported_first_asks_for_brief_spinning():
    assert _spin_count_seen(_SHOW) == [str(threads.SPIN_COUNT), f"GOMP_SPINCOUNT={threads.SPIN_COUNT}"]


def test_torch_imported_first_keeps_its_default():
    assert _spin_count_seen(_SHOW.replace("import korch", "import torch, korch")) == ["None", "GOMP_SPINCOUNT=default"]


def test_a_users_own_choice_is_kept():
    assert _spin_count_seen(_SHOW, OMP_WAIT_POLICY="passive") == ["None", "OMP_WAIT_POLICY=passive"]
    assert _spin_count_seen(_SHOW, GOMP_SPINCOUNT="300") == ["300", "GOMP_SPINCOUNT=300"]
