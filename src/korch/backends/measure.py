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

Builds and checks run in parallel worker processes (``jobs``), in chunks of
kernels whose C++ compiles in one compiler run (``cpp_batch.py``); they fill
the compilers' on-disk caches, so the main process rebuilds from cache and
times kernels one at a time (timings taken in parallel would disturb each
other). On a GPU it times each kernel as soon as its worker is done, while
the others build; on a CPU, whose cores the builds occupy, after the last.

A kernel is timed through its Python call (a compiled Inductor function, a
torch operator), a path the executable does not take: a CPU executable is one
compiled unit (0.1 us per kernel), a GPU one replays a CUDA graph. So each
backend's calling cost is measured once, on a kernel that does nothing (one
negation of one element), and the latency the solver sees is the measured
one less that cost (the database keeps what was measured, and the calling cost
under its own signature).

Kernels are built and timed under the run's precision policy: ``korch.optimize``
sets torch's switches for the whole run (``precision.use``); a build worker,
a fresh process, sets them itself.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from korch import precision, workers
from korch.backends import cpp_batch
from korch.backends.base import Backend, stored_as
from korch.errors import one_line
from korch.backends.check import RandomArena, check, checked_variants, random_inputs
from korch.backends.db import ProfileDB, Record
from korch.backends.registry import backends_for, device_for
from korch.backends.timing import rotation_sets, time_kernel
from korch.cost.devices import get_device
from korch.ir.graph import Graph, Node, Tensor, other_layout
from korch.ir.ops import Op
from korch.ir.subgraph import extract


MESSAGE_CHARS = 300  # a failure's reason as kept in the database and the report
BUILD_CHUNK = 16  # kernels a CPU build worker builds together (their C++ in one compiler run, cpp_batch.py)


@dataclasses.dataclass(frozen=True)
class Failure:
    signature: str
    ops: str
    backend: str
    status: str
    message: str


@dataclasses.dataclass
class MeasureStats:
    asked: int = 0            # distinct signatures the loop asked about
    from_db: int = 0          # of those, answered from the database alone
    measured: int = 0         # kernels built, checked and timed here (signature x backend)
    below_bound: int = 0      # measurements under the lower bound, raised to it
    build_s: float = 0.0      # wall seconds waiting for kernels to be built and checked (workers in parallel)
    timing_s: float = 0.0     # wall seconds timing them (one at a time, in this process; on a GPU while
                              # workers build the next ones)
    failures: list[Failure] = dataclasses.field(default_factory=list)


def device_key(target: str) -> str:
    """The device part of a database key: the GPU kind with the precision policy its products follow, or the
    CPU model with its core count (a CPU's float32 products are exact under every policy)."""
    from korch.cost.probe import cpu_model

    name = get_device(target).name
    return f"{name}:{precision.current().name}" if name != "cpu" else f"cpu:{cpu_model()}:{os.cpu_count()}"


@dataclasses.dataclass
class _Checked:
    status: str
    message: str = ""
    max_rel_error: float | None = None
    launches: int = 0
    built: object = None      # the kernel, when it was built in this process
    variants: tuple[int, ...] = ()  # the launch variants that check (Triton kernels), the only ones timed


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


def _worker(target: str, jobs: Sequence[tuple[Graph, str]], device: str, policy: str, threads: int) -> list[_Checked]:
    """Build and check ``jobs`` (kernel, backend name) in a build worker: every kernel is built before any is
    checked, so that the C++ of Inductor's kernels compiles in one compiler run (``cpp_batch``)."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # the parent's thread count, not one: Inductor writes it into a CPU kernel's parallel loops, so a kernel
    # built here for one thread is not the one the parent times, which it would compile again (0.5-3 s each)
    torch.set_num_threads(threads)
    backends = {b.name: b for b in backends_for(target)}
    with precision.use(policy):  # a spawned process starts from the defaults
        with cpp_batch.deferred_compiles() as batch:
            builds = [_build(backends[name], kernel, device) for kernel, name in jobs]
        batch.compile()
        checked = [failed or _check_built(built, kernel, device) for (built, failed), (kernel, _) in zip(builds, jobs)]
    for result in checked:
        result.built = None  # kernels do not cross processes; the main process rebuilds from the caches
    return checked


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
        self.backends = [b for b in (backends or backends_for(target)) if b.supports_device(self.device)]
        self.versions = {b.name: b.version for b in self.backends}
        self.jobs = max(1, jobs if jobs is not None else min(os.cpu_count() or 1, 8))
        self.best: dict[str, Record | None] = {}
        self._kernels: dict[str, tuple[Graph, list[Backend]]] = {}  # signature -> kernel graph, claiming backends
        self.stats = MeasureStats()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._calling_s: dict[str, float] = {}  # backend -> its calling cost (see the module docstring)
        self._arena = RandomArena(self.device)  # the timing inputs
        self._conversions: dict[tuple, float] = {}  # (shape, dtype, layout) -> seconds (conversion_s)
        self.time_while_building = self.device != "cpu"  # see _checked_builds

    # -- the oracle ---------------------------------------------------------------------

    def measure(self, candidate_ids: Sequence[int]) -> dict[int, float]:
        by_signature: dict[str, int] = {}
        for c in candidate_ids:
            by_signature.setdefault(self.candidates[c].signature, c)
        fresh = [s for s in by_signature if s not in self.best]
        if fresh:
            self._resolve(fresh, by_signature)
        result = {}
        for c in candidate_ids:
            record = self.best[self.candidates[c].signature]
            latency = math.inf if record is None else self.in_place_s(record)
            if latency < self.bounds[c]:
                self.stats.below_bound += 1
                latency = self.bounds[c]
            result[c] = latency
        return result

    def known(self, candidate_ids: Sequence[int]) -> dict[int, float]:
        """Latencies the database already holds in full for these candidates (nothing is built or timed)."""
        representative: dict[str, int] = {}
        for c in candidate_ids:
            representative.setdefault(self.candidates[c].signature, c)
        found = self.db.lookup(representative, self.device_key, self.versions)
        complete = {s for s, records in found.items() if records and
                    {b.name for b in self._claimed(s, representative[s])[1]} <= {r.backend for r in records}}
        return self.measure([c for c in candidate_ids if self.candidates[c].signature in complete])

    def in_place_s(self, record: Record) -> float:
        """The latency of a measured kernel as the executable runs it: measured, less its calling cost."""
        return max(record.latency_s - self.calling_s(record.backend), 0.0)

    def calling_s(self, backend_name: str) -> float:
        """What calling a kernel of this backend costs the timer beyond the kernel's work: measured once per
        device and backend version and kept in the database, so that the same measurements give the same plan."""
        if backend_name not in self._calling_s:
            backend = next((b for b in self.backends if b.name == backend_name), None)
            if backend is None:
                return 0.0
            version = {backend_name: self.versions[backend_name]}
            known = [r for r in self.db.lookup([CALLING_COST], self.device_key, version)[CALLING_COST] if r.ok]
            if known:
                self._calling_s[backend_name] = known[0].latency_s
            else:
                seconds = calling_cost_s(backend, self.device)
                self.db.put([Record(signature=CALLING_COST, device=self.device_key, backend=backend_name,
                                    backend_version=self.versions[backend_name], status="ok", latency_s=seconds,
                                    message="calling cost: the median time of an empty kernel")])
                self._calling_s[backend_name] = seconds
        return self._calling_s[backend_name]

    def conversion_s(self, tensor: Tensor, to: str) -> float:
        """Seconds to copy a value shaped as ``tensor`` into layout ``to`` from the other one, as a torch copy;
        timed once per shape in a process (a few milliseconds each), not kept in the database."""
        key = (tensor.shape, tensor.dtype, to)
        if key not in self._conversions:
            self._arena.reset()
            sets = rotation_sets(lambda i: self._arena.take(tensor.dtype, tensor.shape, other_layout(to)),
                                 2 * tensor.nbytes,
                                 device=self.device)
            outputs = [stored_as(torch.empty_like(x), to) for x in sets]
            self._conversions[key] = time_kernel(lambda i: outputs[i].copy_(sets[i]), device=self.device,
                                                 rotate=len(sets)).median_s
        return self._conversions[key]

    def record_for(self, candidate_id: int) -> Record | None:
        return self.best.get(self.candidates[candidate_id].signature)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

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

    def _resolve(self, signatures: list[str], representative: Mapping[str, int]) -> None:
        self.stats.asked += len(signatures)
        found = self.db.lookup(signatures, self.device_key, self.versions)
        kernels = {s: self._claimed(s, representative[s])[0] for s in signatures}
        todo: list[tuple[str, Backend]] = []
        for s in signatures:
            have = {r.backend for r in found[s]}
            missing = [b for b in self._claimed(s, representative[s])[1] if b.name not in have]
            todo += [(s, b) for b in missing]
            if not missing:
                self.stats.from_db += 1
        records = self._measure(todo, kernels)
        self.db.put(records)
        for r in records:
            found[r.signature].append(r)
        for s in signatures:
            ok = sorted((r for r in found[s] if r.ok), key=self.in_place_s)
            self.best[s] = ok[0] if ok else None
            self.stats.failures += [Failure(s, _ops(kernels[s]), r.backend, r.status, r.message)
                                    for r in found[s] if not r.ok]

    def _checked_builds(self, todo, kernels, chunk: int = BUILD_CHUNK) -> Iterator[tuple[int, _Checked]]:
        """(index into ``todo``, its build checked) for every kernel of ``todo``. With ``time_while_building``
        (a GPU: timings run on the device, builds on the host's cores) each comes as its worker finishes, so the
        caller times it while the workers build the rest; otherwise all come after the last build, as
        timings taken beside running builds on the same cores would be disturbed."""
        # on a GPU every kernel is built and checked in a worker, alone: a variant that faults (an illegal
        # address) poisons its process's CUDA context, which must not be this one
        if self.device == "cpu" and (self.jobs == 1 or len(todo) < 2):
            yield from ((i, _build_and_check(b, kernels[s], self.device)) for i, (s, b) in enumerate(todo))
            return
        if self._pool is None:
            self._pool = workers.pool(self.jobs)
        cpu = self.device == "cpu"
        chunks = _chunks(len(todo), self.jobs, chunk if cpu else 1)
        threads = torch.get_num_threads() if cpu else 1  # a GPU kernel's code does not depend on it
        futures = {self._pool.submit(_worker, self.target, [(kernels[todo[i][0]], todo[i][1].name) for i in c],
                                     self.device, precision.current().name, threads): c for c in chunks}
        finished = concurrent.futures.as_completed(futures) if self.time_while_building else list(
            concurrent.futures.as_completed(futures))
        alone, died = [], False
        for future in finished:
            indices = futures[future]
            try:
                yield from zip(indices, future.result())
            except Exception as exc:  # the worker died (a faulting kernel): a failed build of it, not the run
                died = True
                if len(indices) > 1:
                    alone += indices  # which kernel killed it is not known: each is built again alone
                else:
                    yield indices[0], _Checked("build_failed", "worker died: " + one_line(exc, MESSAGE_CHARS))
        if died:
            self.close()  # a broken pool takes no more work: the next batch starts a fresh one
        if alone:
            again = self._checked_builds([todo[i] for i in alone], kernels, chunk=1)
            yield from ((alone[j], checked) for j, checked in again)

    def _measure(self, todo: list[tuple[str, Backend]], kernels: Mapping[str, Graph]) -> list[Record]:
        records: list[Record | None] = [None] * len(todo)
        builds = self._checked_builds(todo, kernels)
        while True:
            started = time.perf_counter()
            done = next(builds, None)
            self.stats.build_s += time.perf_counter() - started
            if done is None:
                return records
            i, checked = done
            records[i] = self._timed_record(*todo[i], kernels[todo[i][0]], checked)

    def _timed_record(self, s: str, backend: Backend, kernel: Graph, checked: _Checked) -> Record:
        if self.on_kernel:
            self.on_kernel(f"{backend.name} {_ops(kernel)}")
        latency, variant = None, None
        status, message, error, launches = checked.status, checked.message, checked.max_rel_error, checked.launches
        if status == "ok":
            started = time.perf_counter()
            try:
                latency, variant, launches = self._time(checked.built or backend.build(kernel, self.device),
                                                        kernel, checked.variants)
            except Exception as exc:
                status, message = "timing_failed", one_line(exc, MESSAGE_CHARS)
            self.stats.timing_s += time.perf_counter() - started
        self.stats.measured += 1
        return Record(signature=s, device=self.device_key, backend=backend.name,
                      backend_version=self.versions[backend.name], status=status, latency_s=latency,
                      message=message, launches=launches, variant=variant, max_rel_error=error)

    def _time(self, built, kernel: Graph, variants: Sequence[int]) -> tuple[float, dict | None, int]:
        """(median seconds, chosen launch variant among the checked ``variants``, launches); a kernel built by a
        worker is rebuilt here from the compilers' on-disk caches."""
        nbytes = sum(kernel.tensors[n].nbytes for n in (*kernel.inputs, *kernel.outputs))
        self._arena.reset()
        sets = rotation_sets(lambda i: self._arena.inputs(kernel), nbytes, device=self.device)
        variant = None
        if _tunes(built, self.device):  # Triton: keep the fastest launch variant
            built.tune(lambda call: time_kernel(lambda i: call(), device=self.device).median_s, sets[0], variants)
            variant = {"variant": built.variant.describe()}
        seconds = time_kernel(lambda i: built(*sets[i]), device=self.device, rotate=len(sets)).median_s
        return seconds, variant, built.launches


def _tunes(built, device: str) -> bool:
    """Whether ``built`` has launch variants to choose among here (Triton kernels on a GPU; the interpreter's
    timings would choose nothing): only then are its variants checked and timed."""
    return hasattr(built, "tune") and device != "cpu"


# The database signature under which a backend's calling cost is kept (no candidate has it: theirs are hashes).
CALLING_COST = "calling-cost"


def empty_kernel() -> Graph:
    """A kernel that does nothing measurable: one negation of one float."""
    graph = Graph(name="empty")
    graph.add_tensor(Tensor(name="x", shape=(1,), dtype="float32"))
    graph.add_tensor(Tensor(name="y", shape=(1,), dtype="float32"))
    graph.nodes.append(Node(op=Op.NEG, inputs=("x",), outputs=("y",), name="y"))
    graph.inputs, graph.outputs = ["x"], ["y"]
    return graph


def calling_cost_s(backend: Backend, device: str) -> float:
    """The median time of ``backend``'s build of ``empty_kernel``, timed as kernels are (0 if it cannot
    build one: nothing is subtracted)."""
    kernel = empty_kernel()
    try:
        built = backend.build(kernel, device)
        x = [t.to(device) for t in random_inputs(kernel)]
        return time_kernel(lambda i: built(*x), device=device).median_s
    except Exception:  # a backend that builds or runs no such kernel: its kernels keep their measured latency
        return 0.0


def _ops(kernel: Graph) -> str:
    return "+".join(n.op.value for n in kernel.nodes)
