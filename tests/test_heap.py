"""A process that loads a CPU unit keeps the memory a call frees (korch/heap.py): a large value allocated and
filled over and over soon faults in no new pages; without it (glibc's default) every page, every time."""

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = """
import json, resource, sys
import torch
from korch import heap

def faults_of_a_large_value():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(16 << 20).fill_(1.0)  # 64 MiB, above any mmap threshold glibc sets itself (32 MiB at most)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

kept = heap.keep_freed_memory() if sys.argv[1] == "keep" else False
faults = [faults_of_a_large_value() for _ in range(30)]
print(json.dumps({"kept": kept, "faults": faults}))
"""


def _run(mode: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_value_is_reused_without_faulting_its_pages_again():
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    default = _run("default")
    assert not default["kept"] and all(f > pages // 2 for f in default["faults"])  # mmap'd afresh every time
    kept = _run("keep")
    # glibc reuses a freed block once its bins have sorted it: after seven to ten calls here, later under load
    late = kept["faults"][-12:]
    assert kept["kept"] and sum(f < pages // 20 for f in late) >= 10, kept["faults"]


def test_the_heap_is_left_alone_when_configured_so():
    result = _run("keep", KORCH_KEEP_FREED_MEMORY="0")
    assert not result["kept"]


_RELEASE = """
import json
import torch
from korch import heap

def resident_bytes():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

heap.keep_freed_memory()
values = [torch.ones(64 << 20) for _ in range(4)]  # 1 GiB
held = resident_bytes()
del values
freed = resident_bytes()
released = heap.release_freed_memory()
print(json.dumps({"held": held, "freed": freed, "after": resident_bytes(), "released": released}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_heap_that_keeps_what_it_frees_gives_it_back_when_asked():
    """A build worker's heap keeps its largest batch's memory; released, the process no longer holds it."""
    out = subprocess.run([sys.executable, "-c", _RELEASE], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    gib = 1 << 30
    assert result["released"]
    assert result["freed"] > result["held"] - gib // 8  # kept by the heap after the values are freed
    assert result["after"] < result["freed"] - gib * 3 // 4
