"""An executable that serves a range of sizes of one dimension: one executable per bucket of sizes.

``korch optimize --dynamic seq=1..512`` writes OUTDIR with a manifest whose
``runs`` is ``"by size"`` and whose ``buckets`` name a directory per range of
sizes (``buckets/seq_33-64``): each is a complete executable with its own plan,
compiled unit (``runtime/unit.py``; dynamic in the dimension when the range
holds more than one size), check and reports, loadable on its own.
``BucketedExecutable`` takes the same calls as ``Executable``, picks the bucket
from the size of its inputs and opens each bucket when first called, so
loading costs nothing per bucket.

``BUCKETS``' rule: powers of two (1, 2, 3-4, 5-8, ...), clipped to the range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from korch import precision
from korch.errors import KorchError

RUNS = "by size"
MIN_DYNAMIC = 2  # torch.export specialises sizes 0 and 1: a range that holds more than one size starts at 2 or above


@dataclasses.dataclass(frozen=True)
class Bucket:
    low: int
    high: int

    def directory(self, dim: str) -> str:
        return f"buckets/{dim}_{self.low}-{self.high}"


def power_of_two_buckets(low: int, high: int) -> list[Bucket]:
    """The range ``low..high`` cut at powers of two: 1, 2, 3-4, 5-8, ... (clipped to the range)."""
    buckets, top = [], 1
    while top < low:
        top *= 2
    start = low
    while start <= high:
        buckets.append(Bucket(start, min(top, high)))
        start, top = min(top, high) + 1, top * 2
    return buckets


def specs_at(specs: Mapping[str, tuple[tuple[int, ...], str]], axes: Mapping[str, Sequence[int]],
             size: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each input's shape and dtype (``specs``) with its dimension's ``axes`` set to ``size``."""
    return {n: (tuple(size if a in axes.get(n, ()) else d for a, d in enumerate(shape)), dtype)
            for n, (shape, dtype) in specs.items()}


def merge_equal(buckets: list[Bucket], same: Callable[[Bucket, Bucket], bool]) -> list[list[Bucket]]:
    """Consecutive buckets grouped where ``same`` says their plans agree (one unit then serves the group);
    a bucket below ``MIN_DYNAMIC`` stays alone."""
    groups: list[list[Bucket]] = []
    for bucket in buckets:
        last = groups[-1][-1] if groups else None
        if last is not None and last.low >= MIN_DYNAMIC and bucket.low >= MIN_DYNAMIC and same(last, bucket):
            groups[-1].append(bucket)
        else:
            groups.append([bucket])
    return groups


class BucketedExecutable:
    """The executables of one model for consecutive ranges of a dimension, called like one ``Executable``."""

    def __init__(self, outdir: str | Path, manifest: Mapping, open_bucket: Callable[[Path], object]):
        self.outdir, self.manifest = Path(outdir), dict(manifest)
        self.size_range = manifest["sizes"]
        self.buckets = [(b["low"], b["high"], b["dir"]) for b in manifest["buckets"]]
        self.input_names = [i["name"] for i in manifest["inputs"]]
        self.output_names = [o["name"] for o in manifest["outputs"]]
        self.input_specs = {i["name"]: (tuple(i["shape"]), i["dtype"]) for i in manifest["inputs"]}
        self.device, self.cuda_graph, self.calls_until_replay, self.check = manifest["device"], False, 0, None
        self._open_bucket = open_bucket
        self._opened: dict[str, object] = {}

    @property
    def precision(self) -> precision.Policy:
        return precision.get(self.manifest.get("precision", precision.DEFAULT))

    def describe_inputs(self) -> str:
        return self.bucket_at(self.size_range["high"]).describe_inputs()

    def bucket_at(self, size: int):
        """The executable serving ``size`` (opened on first use)."""
        for low, high, directory in self.buckets:
            if low <= size <= high:
                if directory not in self._opened:
                    self._opened[directory] = self._open_bucket(self.outdir / directory)
                return self._opened[directory]
        dim, low, high = self.size_range["dim"], self.size_range["low"], self.size_range["high"]
        raise KorchError(f"{dim}={size} is outside the range {low}..{high} {self.outdir} serves: "
                         f"korch optimize --dynamic {dim}=LOW..HIGH covers it")

    def specs_at(self, size: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """Each input's shape and dtype at ``size``."""
        return specs_at(self.input_specs, self.size_range["axes"], size)

    def _size(self, named: Mapping[str, object]) -> int:
        for name, axes in self.size_range["axes"].items():
            if name in named and len(np.shape(named[name])) > axes[0]:
                return int(np.shape(named[name])[axes[0]])
        return self.size_range["high"]  # no input to read it from: the bucket's own checks say what is missing

    def __call__(self, *args, **kwargs):
        return self.bucket_at(self._size({**dict(zip(self.input_names, args)), **kwargs}))(*args, **kwargs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.bucket_at(self._size(feeds)).run(feeds)


def check_sizes(buckets: list[tuple[int, int, str]]) -> list[int]:
    """The sizes a whole check runs at: each bucket's smallest and largest."""
    return sorted({size for low, high, _ in buckets for size in (low, high)})
