"""Compiling generated Triton kernels for Hopper (sm_90) in a fresh process, for tests.

The test process runs Triton's interpreter (``TRITON_INTERPRET=1``), under which
triton's own library functions (``tl.sum``, ``tl.max``) are interpreter
functions that cannot be compiled; a child process without the interpreter
compiles them as a GPU process would. Run as a module, it compiles the pickled
kernels named on its command line and prints one JSON list of errors (None: compiled).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def compile_for_hopper(generated: list) -> list[str | None]:
    """One error message (None when it compiled) per ``GeneratedKernel``."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernels.pkl"
        path.write_bytes(pickle.dumps(list(generated)))
        env = dict(os.environ, TRITON_INTERPRET="0")
        done = subprocess.run([sys.executable, "-m", "tests.backends.hopper", str(path)], check=False, env=env,
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _main(path: str) -> None:
    from korch.backends.triton.launch import compile_for_target

    errors = []
    for generated in pickle.loads(Path(path).read_bytes()):
        try:
            compile_for_target(generated)
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - reported per kernel
            errors.append(f"{type(exc).__name__}: {str(exc)[-400:]}")
    print(json.dumps(errors))


if __name__ == "__main__":
    _main(sys.argv[1])
