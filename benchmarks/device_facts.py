"""The device's own ceilings, measured once: copy bandwidth, matrix rates, the time of one kernel.

What the cost model's device table should hold instead of datasheet figures
(issue 14's "measured device ceilings", issue 16's "device facts"):

* copy bandwidth: a device-to-device ``copy_`` of 1 GiB (bytes read plus written);
* matrix rate: an 8192-cube ``matmul`` in float32 (tf32 off), tf32 and bf16 on random data;
* one kernel's time: 1000 one-element adds launched from Python, and the same adds captured in a
  CUDA graph and replayed (the executable's calling path), per kernel.

Each is the median of korch's kernel timer (``backends/timing.py``: warm-up, CUDA events on a GPU). On a
CPU (the campaign's dry run) the same measurements run smaller, timed with the host clock.

    python benchmarks/device_facts.py            # prints the JSON
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def _median_s(device: str, fn) -> float:
    """``fn``'s median time after warm-up, by korch's kernel timer (CUDA events on a GPU)."""
    from korch.backends.timing import time_kernel

    return time_kernel(lambda i: fn(), device=device).median_s


def copy_bandwidth(device: str) -> float:
    n = (1 << 30 if device == "cuda" else 64 << 20) // 4
    src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
    return 2 * src.nbytes / _median_s(device, lambda: dst.copy_(src))


def matrix_rates(device: str) -> dict[str, float]:
    n = 8192 if device == "cuda" else 1024
    rates = {}
    dtypes = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
    if device != "cuda":
        dtypes = {"fp32": torch.float32}
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, dtype in dtypes.items():
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
            rates[name] = 2 * n ** 3 / _median_s(device, lambda: a @ b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return rates


def kernel_time(device: str) -> dict[str, float]:
    count = 1000
    x = torch.zeros(1, device=device)

    def launches():
        for _ in range(count):
            x.add_(1)

    facts = {"launched_s": _median_s(device, launches) / count}
    if device == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            launches()  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launches()
        facts["graph_replayed_s"] = _median_s(device, graph.replay) / count
    return facts


def measure() -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    facts = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "date": time.strftime("%Y-%m-%d"),
             "torch": torch.__version__, "copy_bandwidth_Bps": copy_bandwidth(device),
             "matmul_flops": matrix_rates(device), "one_kernel": kernel_time(device)}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts["properties"] = {"multiprocessors": props.multi_processor_count, "memory_bytes": props.total_memory,
                               "l2_bytes": getattr(props, "L2_cache_size", None),
                               "capability": f"{props.major}.{props.minor}"}
    return facts


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    print(json.dumps(measure(), indent=1))
