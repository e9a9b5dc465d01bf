"""Measuring candidate kernels: every claiming backend builds, checks and times each kernel once, remembered.

``KernelMeasurer`` is the cost oracle of the lazy measurement loop
(``korch.orchestrate.lazy``). For each candidate it is asked about, it looks
the candidate's signature up in the profile database (``db.py``) and measures
only what is missing: every backend that claims the kernel builds it, the
build is checked against the reference executor (``check.py``), and a kernel
that checks is timed (``timing.py``; Triton kernels try each launch variant).
The candidate's latency is its fastest correct kernel's; a candidate no
backend builds correctly costs ``inf`` (the solver never picks it) and each
failure is kept, with its reason, for the report.

Builds and checks run in parallel worker processes (``jobs``), in chunks of kernels whose C++ compiles in one
compiler run (``cpp_batch.py``). The workers time their kernels themselves, one at a time (a lock: timings taken
in parallel disturb each other), on inputs each draws once (``_worker_arena``), so no kernel is rebuilt here. On a
GPU they time as they build, on the device while the others compile on the host's cores. On a CPU the builds
occupy the cores a timing needs, so each worker keeps what it built until every build of the batch is done, then
the workers time in turn (``_time_held``; a barrier puts one such task on each worker).

A kernel is timed through its Python call (a compiled Inductor function, a
torch operator), a path the executable does not take: a CPU executable is one
compiled unit (0.1 us per kernel), a GPU one replays a CUDA graph. So each
backend's calling cost is measured once, on a kernel that does nothing (one negation
of one element), and the solver sees the measured latency less that cost (the
database keeps what was measured, and the calling cost under its own signature).

Kernels are built and timed under the run's precision policy: ``korch.optimize``
sets torch's switches for the whole run (``precision.use``); a build worker,
a fresh process, sets them itself.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from korch import heap, precision, workers
from korch.backends import conversions, cpp_batch
from korch.backends.base import Backend, BuildError
from korch.backends.calling import CALLING_COST, calling_cost_s, empty_call
from korch.errors import one_line
from korch.backends.check import RandomArena, check, checked_variants
from korch.backends.db import ProfileDB, Record
from korch.backends.measure_records import Failure, MeasureStats, device_key, keyed_versions
from korch.backends.registry import backends_for, device_for
from korch.backends.timing import Timing, time_measured, timing_inputs
from korch.cost.roofline import BELOW_FLOOR_S
from korch.ir.graph import Graph, Tensor
from korch.ir.subgraph import extract

MESSAGE_CHARS = 300  # a failure's reason as kept in the database and the report
# An ok record's message when every timing found other processes on the cores (timing.py): a later search retimes it
DISTURBED = "timed while other processes held the cores it needs"
BUILD_CHUNK = 16  # kernels a CPU build worker builds together (their C++ in one compiler run, cpp_batch.py)


@dataclasses.dataclass
class _Checked:
    status: str
    message: str = ""
    max_rel_error: float | None = None
    launches: int = 0
    built: object = None      # the kernel, when it was built in this process
    variants: tuple[int, ...] = ()  # the launch variants that check (Triton kernels), the only ones timed
    latency_s: float | None = None  # once timed (in a worker on a GPU: see _worker)
    variant: dict | None = None     # the launch variant the timing chose
    timing_s: float = 0.0           # seconds the timing took
    graphed: bool = False           # timed inside one replayed CUDA graph (``time_kernel(graphed=True)``)


def _build(backend: Backend, kernel: Graph, device: str) -> tuple[object, _Checked | None]:
    """(the built kernel, None), or (None, why it failed)."""
    try:
        return backend.build(kernel, device), None
    except Exception as exc:
        return None, _Checked("build_failed", one_line(exc, MESSAGE_CHARS))


def _check_built(built, kernel: Graph, device: str) -> _Checked:
    try:
        result = check(built, kernel, device=device)
    except Exception as exc:
        return _Checked("check_failed", one_line(exc, MESSAGE_CHARS), None, built.launches)
    if not result.ok:
        return _Checked("check_failed", result.message, result.rel_norm, built.launches)
    variants = checked_variants(built, kernel, device=device) if _tunes(built, device) else ()
    return _Checked("ok", "", result.rel_norm, built.launches, built, variants)


def _build_and_check(backend: Backend, kernel: Graph, device: str) -> _Checked:
    built, failed = _build(backend, kernel, device)
    return failed or _check_built(built, kernel, device)


# In a build worker: the lock every worker holds while it times, so that timings run one at a time; the barrier
# every worker's _time_held task meets first; a CPU batch's checked kernels held until timed, by (batch, index)
_DEVICE_LOCK = _BARRIER = _ARENA = None
_HELD: dict[tuple[int, int], tuple["_Checked", Graph, Backend]] = {}
DEVICE_LOCK_WAIT_S = 120  # a worker that died holding the lock must not hang the search: time without it


def _hold_device_lock(lock, barrier=None) -> None:
    global _DEVICE_LOCK, _BARRIER
    _DEVICE_LOCK, _BARRIER = lock, barrier


def _time_held(batch: int, device: str, rounds: int = 1) -> dict[int, "_Checked"]:
    """In a build worker, once every build of ``batch`` is done (a CPU): time the kernels this worker holds, one
    worker at a time, in ``rounds`` (``_time_in_rounds``); every worker runs one such task (the barrier), so every
    held kernel is timed."""
    _BARRIER.wait(timeout=DEVICE_LOCK_WAIT_S)
    held = {index: entry for (held_batch, index), entry in _HELD.items() if held_batch == batch}
    _time_in_rounds(list(held.values()), _worker_arena(device), device, _DEVICE_LOCK, rounds)
    timed = {}
    for index, (checked, _, _) in held.items():
        checked.built, timed[index] = None, checked
    _HELD.clear()
    gc.collect()  # the kernels just dropped, and whatever cycles hold their buffers
    heap.release_freed_memory()
    return timed


def _worker_arena(device: str) -> RandomArena:
    """The worker's timing inputs, drawn once: a GPU worker is handed one kernel a call, and a fresh arena a call
    drew rotation sets past the L2 each time (0.4 s on a core: most of an H200 search's 0.39 s a kernel)."""
    global _ARENA
    if _ARENA is None or _ARENA.device != device:
        _ARENA = RandomArena(device)
    return _ARENA


@contextlib.contextmanager
def _device_held(lock) -> Iterator[None]:
    held = lock is not None and lock.acquire(timeout=DEVICE_LOCK_WAIT_S)
    try:
        yield
    finally:
        if held:
            lock.release()


def _worker(target: str, jobs: Sequence[tuple[Graph, str]], device: str, policy: str, threads: int,
            timed: bool = False, held: tuple[int, Sequence[int]] | None = None, rounds: int = 1) -> list[_Checked]:
    """Build and check ``jobs`` (kernel, backend name) in a build worker: every kernel is built before any is
    checked, so that the C++ of Inductor's kernels compiles in one compiler run (``cpp_batch``). ``timed``:
    time each kernel that checks here too, holding the pool's device lock (a GPU: see ``KernelMeasurer``).
    ``held`` (batch, each job's index in it): keep each kernel that checks for ``_time_held`` (a CPU).
    ``rounds``: see ``_time_in_rounds``."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # the parent's thread count, not one: Inductor writes it into a CPU kernel's parallel loops, so a kernel
    # built here for one thread is not the one the parent times, which it would compile again (0.5-3 s each)
    torch.set_num_threads(threads)
    if device == "cpu":
        heap.keep_freed_memory()  # as the unit's process does: kernels are timed on the heap they run on
    backends = {b.name: b for b in backends_for(target)}
    with precision.use(policy):  # a spawned process starts from the defaults
        with cpp_batch.deferred_compiles() as batch:
            builds = [heap.given_back(_build(backends[name], kernel, device)) for kernel, name in jobs]
        batch.compile()
        checked = [failed or heap.given_back(_check_built(built, kernel, device))
                   for (built, failed), (kernel, _) in zip(builds, jobs)]
        if timed:
            _time_in_rounds([(result, kernel, backends[name]) for result, (kernel, name) in zip(checked, jobs)],
                            _worker_arena(device), device, _DEVICE_LOCK, rounds)
    if held is not None:
        batch, indices = held
        _HELD.update({(batch, i): (dataclasses.replace(r), k, backends[name])
                      for i, r, (k, name) in zip(indices, checked, jobs) if r.status == "ok"})
    for result in checked:
        result.built = None  # kernels do not cross processes (one not timed in a worker is rebuilt from the caches)
    return checked


def _time_checked(checked: _Checked, kernel: Graph, backend: Backend, arena: RandomArena, device: str,
                  lock=None) -> None:
    """Time ``backend``'s kernel that checked into ``checked`` and was built there (its latency, launch variant,
    seconds taken), holding ``lock`` if any; a timing that fails makes it ``timing_failed``."""
    if checked.status != "ok":
        return
    try:
        built = checked.built
        warm_path = _warm_path(backend, device)  # built before the lock: other workers' timings do not wait on it
        with _device_held(lock):
            started = time.perf_counter()
            timing, checked.variant, checked.launches = _time_built(built, kernel, checked.variants, arena, device,
                                                                    warm_path)
            checked.timing_s = time.perf_counter() - started
        checked.latency_s, checked.graphed = timing.median_s, timing.graphed
        if timing.disturbed:
            checked.message = DISTURBED
    except Exception as exc:
        checked.status, checked.message = "timing_failed", one_line(exc, MESSAGE_CHARS)


def _time_in_rounds(kernels: Sequence[tuple[_Checked, Graph, Backend]], arena: RandomArena, device: str,
                    lock=None, rounds: int = 1) -> None:
    """Time each checked kernel of ``kernels`` once a round, ``rounds`` rounds over all of them in turn, each
    keeping its fastest round (``timing_s``: the rounds' sum): a host can be slow for a moment with nothing to
    show for it (docs/cost.md, "Products and convolutions timed alone"), and one kernel's rounds, seconds apart,
    are rarely all slowed. A kernel built elsewhere is built here first; a round whose timing fails fails it."""
    best: dict[int, _Checked] = {}
    spent: dict[int, float] = {}
    for _ in range(rounds):
        for i, (checked, kernel, backend) in enumerate(kernels):
            if checked.status != "ok":
                continue
            if checked.built is None:
                try:
                    checked.built = backend.build(kernel, device)
                except Exception as exc:
                    checked.status, checked.message = "timing_failed", one_line(exc, MESSAGE_CHARS)
                    continue
            trial = dataclasses.replace(checked)
            _time_checked(trial, kernel, backend, arena, device, lock)
            spent[i] = spent.get(i, 0.0) + trial.timing_s
            if trial.status != "ok":
                checked.status, checked.message = trial.status, trial.message
            elif i not in best or trial.latency_s < best[i].latency_s:
                best[i] = trial
    for i, trial in best.items():
        checked = kernels[i][0]
        if checked.status == "ok":
            checked.latency_s, checked.variant, checked.launches = trial.latency_s, trial.variant, trial.launches
            checked.graphed, checked.message = trial.graphed, trial.message
        checked.timing_s = spent[i]


def _warm_path(backend: Backend | None, device: str) -> Callable[[], object] | None:
    """``backend``'s empty kernel, to warm a CPU timer's calling path after its cold start (``timing.ColdStart``);
    None elsewhere (a GPU timer has no cold start)."""
    return empty_call(backend, device) if backend is not None and device == "cpu" else None


def _time_built(built, kernel: Graph, variants: Sequence[int], arena: RandomArena, device: str,
                warm_path: Callable[[], object] | None = None) -> tuple[Timing, dict | None, int]:
    """(the timing, chosen launch variant among the checked ``variants``, launches); ``warm_path``: the
    backend's empty kernel (``timing.ColdStart``)."""
    arena.reset()
    sets = timing_inputs(lambda: arena.inputs(kernel),
                         sum(kernel.tensors[n].nbytes for n in (*kernel.inputs, *kernel.outputs)), device)
    if _tunes(built, device):  # Triton: the fastest launch variant, timed as any kernel, its timing the kernel's
        timing = built.tune(lambda call: time_measured(call, sets, device, warm_path), sets, variants,
                            seconds=lambda t: t.median_s)
        return timing, {"variant": built.variant.describe()}, built.launches
    return time_measured(lambda i: built(*sets[i]), sets, device, warm_path), None, built.launches


def _chunks(count: int, jobs: int, size: int) -> list[list[int]]:
    """``range(count)`` dealt round-robin into at least ``jobs`` chunks of at most ``size`` (none empty)."""
    n = min(count, max(jobs, -(-count // size)))
    return [list(range(k, count, n)) for k in range(n)]


class KernelMeasurer:
    """The measuring cost oracle for the candidates of one graph (see the module docstring)."""

    def __init__(self, graph: Graph, candidates: Sequence, bounds: Sequence[float], *, target: str,
                 db: ProfileDB, jobs: int | None = None, backends: Sequence[Backend] | None = None,
                 on_kernel: Callable[[str], None] | None = None):
        self.graph, self.candidates, self.bounds = graph, candidates, bounds
        self.target, self.db, self.on_kernel = target, db, on_kernel
        self.device = device_for(target)
        self.device_key = device_key(target)
        if self.device == "cpu":
            heap.keep_freed_memory()  # kernels timed here too (a failed worker's): on the heap a unit runs on
        self.backends = [b for b in (backends or backends_for(target)) if b.supports_device(self.device)]
        self.versions = keyed_versions(self.backends, self.device)
        self.jobs = max(1, jobs if jobs is not None else min(os.cpu_count() or 1, 8))
        self.best: dict[str, Record | None] = {}
        self._kernels: dict[str, tuple[Graph, list[Backend]]] = {}  # signature -> kernel graph, claiming backends
        self.stats = MeasureStats()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._calling_s: dict[str, float] = {}  # backend -> its calling cost (see the module docstring)
        self._arena = RandomArena(self.device)  # the timing inputs
        self._conversions: dict[str, float] = {}  # conversions.signature -> seconds (conversion_s)
        # the build workers time, one at a time under this lock: on a GPU as they build (timings on the device,
        # builds on the host's cores), on a CPU once the batch's builds are done (they would disturb timings)
        self.time_in_workers = True
        context = multiprocessing.get_context("spawn")
        self._device_lock, self._barrier, self._batches = context.Lock(), context.Barrier(self.jobs), 0

    # -- the oracle ---------------------------------------------------------------------

    def measure(self, candidate_ids: Sequence[int], rounds: int = 1) -> dict[int, float]:
        """Each candidate's latency as the executable runs it (``in_place_s``), at least its floor; what the
        database does not hold is measured, each kernel's fastest of ``rounds`` timings (``_time_in_rounds``)."""
        by_signature: dict[str, int] = {}
        for c in candidate_ids:
            by_signature.setdefault(self.candidates[c].signature, c)
        fresh = [s for s in by_signature if s not in self.best]
        if fresh:
            self._resolve(fresh, by_signature, rounds)
        result = {}
        for c in candidate_ids:
            record = self.best[self.candidates[c].signature]
            latency = math.inf if record is None else self.in_place_s(record)
            if latency < self.bounds[c]:
                self.stats.below_bound += int(latency < self.bounds[c] - BELOW_FLOOR_S)  # not within resolution
                latency = self.bounds[c]
            result[c] = latency
        return result

    def known(self, candidate_ids: Sequence[int]) -> dict[int, float]:
        """Latencies the database already holds in full for these candidates (nothing is built or timed)."""
        representative: dict[str, int] = {}
        for c in candidate_ids:
            representative.setdefault(self.candidates[c].signature, c)
        found = self._trusted(representative)
        complete = {s for s, records in found.items() if records and
                    {b.name for b in self._claimed(s, representative[s])[1]} <= {r.backend for r in records}}
        return self.measure([c for c in candidate_ids if self.candidates[c].signature in complete])

    def _trusted(self, signatures) -> dict[str, list[Record]]:
        """The database's records of ``signatures`` for this device and these backends, less those timed beside
        other processes: such a kernel is measured again, in case the machine is quiet now."""
        found = self.db.lookup(signatures, self.device_key, self.versions)
        return {s: [r for r in records if r.message != DISTURBED] for s, records in found.items()}

    def in_place_s(self, record: Record) -> float:
        """The latency of a measured kernel as the executable runs it: measured, less its calling cost."""
        return max(record.latency_s - self.calling_s(record.backend), 0.0)

    def _backend(self, name: str) -> Backend | None:
        return next((b for b in self.backends if b.name == name), None)

    def calling_s(self, backend_name: str) -> float:
        """What calling a kernel of this backend costs the timer beyond the kernel's work: measured once per
        device and backend version and kept in the database, so that the same measurements give the same plan."""
        if backend_name not in self._calling_s:
            backend = self._backend(backend_name)
            if backend is None:
                return 0.0
            self._calling_s[backend_name] = self._remembered(
                CALLING_COST, backend_name, lambda: calling_cost_s(backend, self.device),
                "calling cost: the fastest time of an empty kernel")
        return self._calling_s[backend_name]

    def conversion_s(self, tensor: Tensor, to: str) -> float:
        """Seconds the compiled unit takes at most to copy a value shaped as ``tensor`` into layout ``to`` from
        the other one (``conversions.py``), kept in the database; a torch copy's without Inductor here."""
        key = conversions.signature(tensor, to)
        if key not in self._conversions:
            seconds = None
            if conversions.INDUCTOR in self.versions:
                with contextlib.suppress(BuildError):  # Inductor could not compile the loop
                    seconds = self._remembered(key, conversions.INDUCTOR, lambda: conversions.loop_s(
                        tensor, to, self._arena, self.device,
                        _warm_path(self._backend(conversions.INDUCTOR), self.device)),
                        "a layout conversion: Inductor's loop")
                    seconds -= self.calling_s(conversions.INDUCTOR)
            if seconds is None:
                seconds = conversions.torch_copy_s(tensor, to, self._arena, self.device)
            self._conversions[key] = max(seconds, 0.0)
        return self._conversions[key]

    def _remembered(self, signature: str, backend_name: str, measure: Callable[[], float], message: str) -> float:
        """The database's latency under ``signature`` for this device and ``backend_name``'s version, or
        ``measure()``'s, then kept there."""
        version = {backend_name: self.versions[backend_name]}
        known = [r for r in self.db.lookup([signature], self.device_key, version)[signature] if r.ok]
        if known:
            return known[0].latency_s
        seconds = measure()
        self.db.put([Record(signature=signature, device=self.device_key, backend=backend_name,
                            backend_version=self.versions[backend_name], status="ok", latency_s=seconds,
                            message=message)])
        return seconds

    def record_for(self, candidate_id: int) -> Record | None:
        return self.best.get(self.candidates[candidate_id].signature)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
            self._barrier.reset()  # a barrier broken by a worker that died would stay broken for the next pool

    # -- measuring ---------------------------------------------------------------------

    def kernel_graph(self, candidate_id: int) -> Graph:
        c = self.candidates[candidate_id]
        return extract(self.graph, c.nodes, c.inputs, c.outputs, name=f"c{candidate_id}", layout=c.layout)

    def _claimed(self, signature: str, candidate_id: int) -> tuple[Graph, list[Backend]]:
        """The kernel graph of a signature and the backends that claim it, worked out once."""
        if signature not in self._kernels:
            kernel = self.kernel_graph(candidate_id)
            self._kernels[signature] = kernel, [b for b in self.backends if b.claims(kernel) is None]
        return self._kernels[signature]

    def _resolve(self, signatures: list[str], representative: Mapping[str, int], rounds: int = 1) -> None:
        for backend in self.backends:  # before the first batch: the build workers' start-up would slow them
            self.calling_s(backend.name)
        self.stats.asked += len(signatures)
        found = self._trusted(signatures)
        kernels = {s: self._claimed(s, representative[s])[0] for s in signatures}
        todo: list[tuple[str, Backend]] = []
        for s in signatures:
            have = {r.backend for r in found[s]}
            missing = [b for b in self._claimed(s, representative[s])[1] if b.name not in have]
            todo += [(s, b) for b in missing]
            if not missing:
                self.stats.from_db += 1
        records = self._measure(todo, kernels, rounds)
        self.db.put(records)
        for r in records:
            found[r.signature].append(r)
        for s in signatures:
            ok = sorted((r for r in found[s] if r.ok), key=self.in_place_s)
            self.best[s] = ok[0] if ok else None
            self.stats.failures += [Failure(s, _ops(kernels[s]), r.backend, r.status, r.message)
                                    for r in found[s] if not r.ok]

    def _checked_builds(self, todo, kernels, chunk: int = BUILD_CHUNK, rounds: int = 1) -> list[_Checked]:
        # on a GPU every kernel is built and checked in a worker, alone: a variant that faults (an illegal
        # address) poisons its process's CUDA context, which must not be this one
        if self.device == "cpu" and (self.jobs == 1 or len(todo) < 2):
            return [_build_and_check(b, kernels[s], self.device) for s, b in todo]
        if self._pool is None:
            self._pool = workers.pool(self.jobs, functools.partial(_hold_device_lock, self._device_lock,
                                                                   self._barrier))
        cpu = self.device == "cpu"
        chunks = _chunks(len(todo), self.jobs, chunk if cpu else 1)
        threads = torch.get_num_threads() if cpu else 1  # a GPU kernel's code does not depend on it
        self._batches += 1
        hold = cpu and self.time_in_workers
        futures = [self._pool.submit(_worker, self.target, [(kernels[todo[i][0]], todo[i][1].name) for i in c],
                                     self.device, precision.current().name, threads,
                                     self.time_in_workers and not cpu, (self._batches, c) if hold else None,
                                     rounds)
                   for c in chunks]
        results: list[_Checked | None] = [None] * len(todo)
        alone, died = [], False
        for indices, future in zip(chunks, futures):
            try:
                for i, checked in zip(indices, future.result()):
                    results[i] = checked
            except Exception as exc:  # the worker died (a faulting kernel): a failed build of it, not the run
                died = True
                if len(indices) > 1:
                    alone += indices  # which kernel killed it is not known: each is built again alone
                else:
                    results[indices[0]] = _Checked("build_failed", "worker died: " + one_line(exc, MESSAGE_CHARS))
        if hold and not died:
            try:  # one task per worker (the barrier): each times what it holds
                for future in [self._pool.submit(_time_held, self._batches, self.device, rounds)
                               for _ in range(self.jobs)]:
                    for i, checked in future.result().items():
                        results[i] = checked
            except Exception:  # a worker that died or never came: what was not timed there is timed here
                died = True
        if died:
            self.close()  # a broken pool takes no more work: the next batch starts a fresh one
        if alone:
            for i, checked in zip(alone, self._checked_builds([todo[i] for i in alone], kernels, 1, rounds)):
                results[i] = checked
        return results

    def _measure(self, todo: list[tuple[str, Backend]], kernels: Mapping[str, Graph], rounds: int = 1) \
            -> list[Record]:
        records = []
        started = time.perf_counter()
        built = self._checked_builds(todo, kernels, rounds=rounds)
        self.stats.build_s += time.perf_counter() - started
        # built and checked here, or in a worker that does not time
        _time_in_rounds([(checked, kernels[s], backend) for (s, backend), checked in zip(todo, built)
                         if checked.latency_s is None], self._arena, self.device, rounds=rounds)
        for (s, backend), checked in zip(todo, built):
            kernel = kernels[s]
            if self.on_kernel:
                self.on_kernel(f"{backend.name} {_ops(kernel)}")
            self.stats.timing_s += checked.timing_s
            self.stats.disturbed += checked.message == DISTURBED
            self.stats.graphed += checked.graphed
            records.append(Record(signature=s, device=self.device_key, backend=backend.name,
                                  backend_version=self.versions[backend.name], status=checked.status,
                                  latency_s=checked.latency_s, message=checked.message, launches=checked.launches,
                                  variant=checked.variant, max_rel_error=checked.max_rel_error))
            self.stats.measured += 1
        return records


def _tunes(built, device: str) -> bool:
    """Whether ``built`` has launch variants to choose among here (Triton kernels on a GPU; the interpreter's
    timings would choose nothing): only then are its variants checked and timed."""
    return hasattr(built, "tune") and device != "cpu"


def _ops(kernel: Graph) -> str:
    return "+".join(n.op.value for n in kernel.nodes)
