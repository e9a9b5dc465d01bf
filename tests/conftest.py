"""Shared test set-up: the Triton interpreter, a fixed CPU probe record, ``gpu`` tests skipped without CUDA, the
ONNX backend tally printed at the end of the run, a folder built once for all of a run's workers
(``built_once``)."""

import fcntl
import os
import shutil
# Generated Triton kernels run in the interpreter on CPUs; set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Compiling a whole plan with AOTInductor takes 15-30 s; tests/runtime/test_unit.py turns it on where it is tested.
os.environ.setdefault("KORCH_COMPILED_UNIT", "0")
# The suite runs on every core at once: a kernel timing beside it would be taken again (config.quiet_tries) and
# flagged, for nothing (no test asserts a latency) and by chance (flags would depend on the neighbouring tests).
# tests/backends/test_timing.py tests the retries with a fake load.
os.environ.setdefault("KORCH_QUIET_TRIES", "0")
# CPU plans are priced on a probe record of the 2-vCPU AMD EPYC these tests were written on, taken on a quiet
# host: a probe taken while the tests load both cores once merged dynamic buckets and failed four tests.
# The probe's own tests unset it.
os.environ.setdefault("KORCH_CPU_RECORD", os.path.join(os.path.dirname(__file__), "quiet_host_probe.json"))

import pytest

from tests.fission.test_onnx_backend_cases import SUMMARY_FILE

GPU_SKIP_REASON = "needs a CUDA device: torch.cuda.is_available() is False"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``@pytest.mark.gpu`` are skipped, with a reason, where torch sees no CUDA device."""
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=GPU_SKIP_REASON))


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput") and os.path.exists(SUMMARY_FILE):
        os.remove(SUMMARY_FILE)


def pytest_terminal_summary(terminalreporter):
    if os.path.exists(SUMMARY_FILE):
        with open(SUMMARY_FILE) as f:
            first = f.readline().rstrip()
        terminalreporter.write_line(first)


@pytest.fixture(scope="session")
def built_once(tmp_path_factory):
    """``built_once(name, build)``: the folder ``build(folder)`` fills, built by the first of the run's
    pytest-xdist workers that asks and read by the others (a module fixture is built once per worker that runs
    one of the module's tests: the GPU campaign's dry run took 75 s twice). A build that fails is tried again
    by the next that asks."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own

    def folder_of(name: str, build):
        folder, done = root / name, root / f"{name}.done"
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                build(folder)
                done.touch()
        return folder
    return folder_of
