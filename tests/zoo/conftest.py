"""Shared by the zoo tests: threads shared out between pytest-xdist workers."""

import os

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def share_cores():
    """Under pytest-xdist, one intra-op thread per core per worker.

    torch and onnxruntime each default to a thread per core; with two workers
    on two cores their spinning threads contend and runs take several times
    longer.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    saved = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    yield
    torch.set_num_threads(saved)
