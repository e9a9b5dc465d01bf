"""Costs measured in place: a plan's kernels run in their order on the values they pass each other, each call timed.

A measured search times a kernel alone, call after call on one input set, so its inputs, its weights and the
memory its outputs go to are all in the cache. In an executable a kernel reads what its producer has just
written, its weights were last read a whole inference ago, and its outputs land in blocks other values left
cold. Where a model's values overflow the cache that differs by far: Segformer-B0's 213 planned kernels summed
54.7 ms timed alone and 78.5 ms run in sequence, and its compiled unit ran 76.2 ms (``benchmarks/in_sequence.py``).
No single way of timing a kernel alone serves every model (flushing the cache first summed 80.3 ms there, but 28 ms
for YOLOX-Nano's kernels, which run in 17 ms in sequence: its values fit the cache).

So the search prices the kernels an optimum selects in place (``orchestrate/segments.py``): ``InPlaceTimer.time``
builds them (from the compilers' caches the measurement filled) in this process, runs them in the plan's order
``SEQUENCE_RUNS`` times on random values for what enters from outside, each kernel on its producers' outputs
converted to the layout it reads, and gives each kernel its median call less its backend's calling cost.
Alone-times stay the floors of in-place times for the kernels no plan has run in place yet.

A kernel's first price in place stands for the rest of the search, and for later searches of the model: the
profile database keeps it (``StoredPrices``) under a signature naming the kernel and its place in the model, at
the version of the backend that built it. A search whose database holds the model's measurements and prices in
place runs sequences only for kernels no search has placed yet (EfficientViT's: 65 sequences, 487 s, in a search
that measured nothing).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Mapping, Sequence

import torch

from korch import heap
from korch.backends.base import stored_as
from korch.backends.check import RandomArena, index_bounds
from korch.backends.db import Record
from korch.errors import one_line
from korch.ir.graph import Graph

# runs of a plan's sequence; the first is not timed (it warms the allocator and the kernels' first calls)
SEQUENCE_RUNS = 6


# the start of the database signatures of prices in place (a kernel's own signature is a hexadecimal digest)
PLACE_PREFIX = "in-place:"
PLACE_MESSAGE = "a price in place: the kernel's median call in sequence, where its model runs it"


class StoredPrices:
    """Prices in place in a measurer's profile database: a record each, its signature naming the kernel (its
    candidate signature, layout included) and its place (its model's name and node names, its own nodes), its
    backend the one the kernel's measurement chose, at that backend's version."""

    def __init__(self, measurer):
        self.measurer = measurer
        self._names = [node.name for node in measurer.graph.nodes]
        self._model = hashlib.sha256(json.dumps([measurer.graph.name, self._names]).encode()).hexdigest()

    def signature(self, candidate_id: int) -> str:
        candidate = self.measurer.candidates[candidate_id]
        place = [self._model, candidate.signature, sorted(self._names[i] for i in candidate.nodes)]
        return PLACE_PREFIX + hashlib.sha256(json.dumps(place).encode()).hexdigest()[:32]

    def _backends(self, candidate_ids) -> dict[int, str]:
        """The backend each measured candidate's kernel is built by (its fastest record's)."""
        records = {c: self.measurer.record_for(c) for c in candidate_ids}
        return {c: record.backend for c, record in records.items() if record is not None}

    def lookup(self, candidate_ids: Sequence[int]) -> dict[int, float]:
        """The stored prices of these candidates, where their backends and versions are the current ones."""
        backends = self._backends(candidate_ids)
        signatures = {c: self.signature(c) for c in backends}
        m = self.measurer
        found = m.db.lookup(signatures.values(), m.device_key, m.versions)
        return {c: r.latency_s for c, s in signatures.items() for r in found[s] if r.ok and r.backend == backends[c]}

    def put(self, prices: Mapping[int, float]) -> None:
        m = self.measurer
        m.db.put(Record(signature=self.signature(c), device=m.device_key, backend=backend,
                        backend_version=m.versions[backend], status="ok", latency_s=float(prices[c]),
                        message=PLACE_MESSAGE) for c, backend in self._backends(prices).items())


class InPlaceTimer:
    """Times a measurer's candidates in sequence (``time``); built kernels are kept for later sequences. With
    ``stored``, each kernel's first price is kept there and an earlier search's are found (``known``)."""

    def __init__(self, measurer, stored: StoredPrices | None = None):
        self.measurer, self.stored = measurer, stored
        self._priced: set[int] = set()  # candidates whose first price in place ``stored`` holds
        self.from_database = 0  # prices found there
        self._built: dict[int, tuple[Graph, object, str]] = {}  # candidate id -> kernel graph, built, backend
        self._arena = RandomArena(measurer.device)
        self.sequences = 0          # sequences timed
        self.timed = 0              # kernel timings taken in place
        self.seconds = 0.0          # building and running them
        self.build_s = 0.0          # of ``seconds``, building them
        self.failure = ""           # why the last sequence that did not run failed

    @property
    def built(self) -> int:
        """Kernels built here."""
        return len(self._built)

    def time(self, candidate_ids: Sequence[int]) -> dict[int, float]:
        """Seconds per candidate, run in the order given (an executable order: each value written before it is
        read, or from outside the sequence); empty when a kernel cannot be built or run here (the alone-times
        then stand)."""
        start = time.perf_counter()
        try:
            kernels = [self.build(c) for c in candidate_ids]
            seconds = self._run(kernels)
        except Exception as exc:  # a kernel that ran alone but not here leaves the times alone in force
            self.failure = one_line(exc)
            return {}
        finally:
            self.seconds += time.perf_counter() - start
            heap.release_freed_memory()  # a sequence's values, freed, stay out of the unit's compile and the workers'
        self.sequences += 1
        self.timed += len(candidate_ids)
        prices = {c: max(statistics.median(s) - self.measurer.calling_s(backend), 0.0)
                  for c, s, (_, _, backend) in zip(candidate_ids, seconds, kernels)}
        if self.stored is not None:
            first = {c: price for c, price in prices.items() if c not in self._priced}
            self.stored.put(first)
            self._priced.update(first)
        return prices

    def known(self, candidate_ids: Sequence[int]) -> dict[int, float]:
        """The prices in place an earlier search stored for these candidates (none without ``stored``)."""
        found = self.stored.lookup(candidate_ids) if self.stored is not None else {}
        self._priced.update(found)
        self.from_database += len(found)
        return found

    def close(self) -> None:
        """Let go of the kernels built here and the random values, and give their memory back."""
        self._built.clear()
        self._arena = RandomArena(self.measurer.device)
        heap.release_freed_memory()

    def build(self, candidate_id: int) -> tuple[Graph, object, str]:
        """The candidate's kernel graph, its kernel built by the backend its measurement chose, that backend's name."""
        if candidate_id not in self._built:
            record = self.measurer.record_for(candidate_id)
            if record is None:
                raise LookupError(f"candidate {candidate_id} has no measured kernel")
            backend = next(b for b in self.measurer.backends if b.name == record.backend)
            kernel = self.measurer.kernel_graph(candidate_id)
            start = time.perf_counter()
            self._built[candidate_id] = kernel, backend.build(kernel, self.measurer.device), record.backend
            self.build_s += time.perf_counter() - start
        return self._built[candidate_id]

    def _run(self, kernels) -> list[list[float]]:
        self._arena.reset()
        outside: dict[str, torch.Tensor] = {}  # values from outside the sequence: the same random ones every run
        seconds: list[list[float]] = [[] for _ in kernels]
        last_read = {name: i for i, (kernel, _, _) in enumerate(kernels) for name in kernel.inputs}
        with torch.inference_mode():
            for run in range(SEQUENCE_RUNS):
                values: dict[str, torch.Tensor] = {}
                for i, ((kernel, built, _), spent) in enumerate(zip(kernels, seconds)):
                    inputs = [self._input(kernel, name, values, outside) for name in kernel.inputs]
                    for name in kernel.inputs:  # a value no later kernel reads is freed, as the unit frees it
                        if last_read[name] == i:
                            values.pop(name, None)
                    begin = time.perf_counter()
                    result = built(*inputs)
                    elapsed = time.perf_counter() - begin
                    if run:
                        spent.append(elapsed)
                    results = result if isinstance(result, (list, tuple)) else (result,)
                    values.update((name, r) for name, r in zip(kernel.outputs, results) if name in last_read)
        return seconds

    def _input(self, kernel: Graph, name: str, values: dict, outside: dict) -> torch.Tensor:
        tensor = kernel.tensors[name]
        if name not in values:
            if name not in outside:
                # what a lookup's indices come from drawn as the kernel's check draws it
                outside[name] = self._arena.input(tensor, index_bounds(kernel).get(name))
            return outside[name]
        return stored_as(values[name], tensor.layout)  # a copy where the plan converts it, priced apart, untimed
