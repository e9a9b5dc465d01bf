"""Shared test set-up: prints the ONNX backend tally at the end of the run."""

import os
# Generated Triton kernels run in the interpreter on CPUs; set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.fission.test_onnx_backend_cases import SUMMARY_FILE


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput") and os.path.exists(SUMMARY_FILE):
        os.remove(SUMMARY_FILE)


def pytest_terminal_summary(terminalreporter):
    if os.path.exists(SUMMARY_FILE):
        with open(SUMMARY_FILE) as f:
            first = f.readline().rstrip()
        terminalreporter.write_line(first)
