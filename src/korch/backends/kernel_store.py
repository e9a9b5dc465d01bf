"""Inductor's CPU kernels kept by korch: a kernel built once is loaded, not compiled, by any later build.

A measured search builds each candidate kernel through Inductor's ``compile_fx`` (``inductor.py``). With
Inductor's own caches warm, that path still traces the kernel again (AOT autograd), freezes its constants,
packs its weights and hashes the frozen graph to find its cached code: 0.2 s of a Candy kernel's 0.28 s build,
most of a warm search's builds. What the path ends with is small: the generated Python module (its
``call(args)`` and the C++ it loads from Inductor's cache) and the constants the freeze bound to it (the
kernel's weights, folded and packed). The store keeps those two under a digest of everything the kernel's
code follows from (``key``): the kernel's graph and constants, the backend and its version, the source of the
korch modules that write it, torch's version, the vector ISA, the torch thread count and Inductor's
environment. A later build with the same digest loads the module with its constants and calls it
directly.

A constant oneDNN packed (a convolution's or a product's weight, an opaque tensor that cannot be saved) is kept
as the call that packed it (``recorded_packs``: the packing op and its arguments, the plain weight among them)
and packed again at load; a tensor is kept once, under the digest of its values, for every entry that names it.
An MLAS kernel's code names the random token its operators open their sessions by (``mlas.py``): a load renames
it to the token the new build drew. Only what Inductor's own wrapper would return unchanged is kept (one
generated module, constants that are plain CPU tensors or packed so); everything else builds as before. Entries
are written whole (``fsutil``) beside Inductor's caches, so removing that directory removes both; a build from an
entry compiles whatever C++ the cache lost. A kernel from the store is checked against the reference executor as
every built kernel is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from korch import precision
from korch.fsutil import atomic_write_bytes
from korch.ir.graph import Graph

STORE_DIR = "korch-kernels"  # under Inductor's cache directory
ENTRIES, BLOBS = "entries", "blobs"  # a kernel's entry; a constant's values, kept once for every entry naming them
_SOURCES = ("backends", "ir")  # korch's packages whose code decides a kernel's generated code
_KORCH = Path(__file__).resolve().parent.parent  # the package they are in
# their files that do: Python, and the C++ of korch's operators (sources and headers), whose namespace a
# generated call names (an MLAS kernel's ``korch_ort_<digest of the C++>::softmax``: kept under the Python alone,
# a kernel stored before the C++ changed called operators no library registers)
_SOURCE_SUFFIXES = (".py", ".cpp", ".h")
_ENV_IGNORED = {"TORCHINDUCTOR_COMPILE_THREADS", "TORCHINDUCTOR_CACHE_DIR"}
# oneDNN's packing ops that freezing folds into a kernel's constants (mkldnn_fusion's weight-pack pass)
_PACKS = ("_reorder_convolution_weight", "_reorder_convolution_transpose_weight", "_reorder_linear_weight")


def source_files() -> list[Path]:
    """korch's source files a kernel's generated code follows from (``_SOURCES``, ``_SOURCE_SUFFIXES``)."""
    return [path for package in _SOURCES for path in sorted((_KORCH / package).rglob("*"))
            if path.suffix in _SOURCE_SUFFIXES and path.is_file()]


@functools.lru_cache(maxsize=1)
def _process_part() -> str:
    """What every kernel's digest shares in this process: korch's code, torch, the vector ISA, Inductor's
    environment."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    digest = hashlib.sha256()
    for path in source_files():
        digest.update(path.relative_to(_KORCH).as_posix().encode() + b"\0" + path.read_bytes())
    environment = sorted((k, v) for k, v in os.environ.items()
                         if k.startswith("TORCHINDUCTOR_") and k not in _ENV_IGNORED)
    digest.update(json.dumps([torch.__version__, str(pick_vec_isa()), environment]).encode())
    return digest.hexdigest()


def enabled() -> bool:
    """Whether builds use the store: not where Inductor's caches are turned off (``force_disable_caches``)."""
    from torch._inductor import config as inductor_config

    return not inductor_config.force_disable_caches


def key(kernel: Graph, backend: str, version: str) -> str:
    """The digest a kernel's entry is kept under: its graph and constants, ``backend`` at ``version``, this
    process's part (``_process_part``), its torch thread count (written into parallel loops) and precision."""
    from korch.ir.serialize import to_json

    structure = to_json(dataclasses.replace(kernel, constants={}))  # the constants' bytes are hashed as they are
    digest = hashlib.sha256(json.dumps(
        [structure, sorted(kernel.constants), backend, version, _process_part(), torch.get_num_threads(),
         precision.current().name]).encode())
    for name in sorted(kernel.constants):
        digest.update(np.ascontiguousarray(kernel.constants[name]).data)
    return digest.hexdigest()


def _path(name: str, kind: str = ENTRIES) -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / STORE_DIR / kind / name[:2] / f"{name}.pt"


def modules_loaded() -> int:
    """How many generated modules this process has loaded: ``new_module`` finds those loaded since."""
    from torch._inductor.codecache import PyCodeCache

    return len(PyCodeCache.modules)


def new_module(since: int):
    """The one generated module with a ``call`` loaded since ``modules_loaded()`` returned ``since``, or None."""
    from torch._inductor.codecache import PyCodeCache

    loaded = [m for m in PyCodeCache.modules[since:] if callable(getattr(m, "call", None))]
    return loaded[0] if len(loaded) == 1 else None


class _RecordingOps:
    """``torch.ops.mkldnn`` as ``mkldnn_fusion`` sees it while packs are recorded: its packing ops list each
    weight they pack, every other op is the namespace's."""

    def __init__(self, namespace, packed: list):
        self._namespace, self._packed = namespace, packed

    def __getattr__(self, name: str):
        op = getattr(self._namespace, name)
        if name not in _PACKS:
            return op

        def pack(*args):
            result = op(*args)
            self._packed.append((result, name, args))
            return result
        return pack


@contextlib.contextmanager
def recorded_packs() -> Iterator[list[tuple[torch.Tensor, str, tuple]]]:
    """While active, each weight freezing packs for oneDNN is listed as (the packed tensor, the packing op's name,
    its arguments): the weight-pack pass (``mkldnn_fusion``) puts the op it finds in its module's ``mkldnn`` into
    the graph, and freezing's constant folding calls it."""
    from torch._inductor.fx_passes import mkldnn_fusion

    packed: list[tuple[torch.Tensor, str, tuple]] = []
    namespace = getattr(mkldnn_fusion, "mkldnn", None)  # absent without oneDNN
    if namespace is None:
        yield packed
        return
    mkldnn_fusion.mkldnn = _RecordingOps(namespace, packed)
    try:
        yield packed
    finally:
        mkldnn_fusion.mkldnn = namespace


def _blob(tensor: torch.Tensor) -> dict[str, str]:
    """A reference to ``tensor`` kept once under the digest of its values: a model's weight is a constant of
    hundreds of its candidate kernels (the ViT block's store held 4 GB of copies before)."""
    values = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    digest = hashlib.sha256(json.dumps([str(tensor.dtype), list(tensor.shape), list(tensor.stride())]).encode())
    digest.update(values.data)
    name = digest.hexdigest()
    path = _path(name, BLOBS)
    if not path.exists():
        buffer = io.BytesIO()
        torch.save(tensor.detach().clone(), buffer)  # a clone: a view would save all of its base's storage
        atomic_write_bytes(path, buffer.getvalue())
    return {"blob": name}


def _resolved(value):
    """``value`` with each blob reference (``_blob``) read back."""
    if isinstance(value, dict) and set(value) == {"blob"}:
        path = _path(value["blob"], BLOBS)
        try:
            return torch.load(path, weights_only=True)
        except Exception:
            path.unlink(missing_ok=True)  # damaged: the build that follows keeps it again
            raise
    if isinstance(value, (list, tuple)):
        return type(value)(_resolved(v) for v in value)
    return value


def _kept(value):
    """``value`` (dicts, lists and tuples of them) as an entry keeps it: FX's immutable lists as plain ones (what
    a weights-only load reads back), tensors as blob references."""
    if isinstance(value, torch.Tensor):
        return _blob(value)
    if isinstance(value, dict):
        return {k: _kept(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_kept(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_kept(v) for v in value)
    return value


def save(entry_key: str, module, source: str, launches: int, packed: list[tuple[torch.Tensor, str, tuple]],
         token: int | None = None) -> bool:
    """Keep ``module`` (Inductor's, for ``source``) with its constants under ``entry_key``, each packed one as
    the call in ``packed`` that made it; False (nothing written) where a constant is neither a plain CPU tensor
    nor packed there. ``token``: a number ``source`` names that a load renames (``load``)."""
    constants, packs = {}, {}
    for name, value in vars(module).items():
        if not isinstance(value, torch.Tensor):
            continue
        if value.is_mkldnn:
            made = [(op, args) for result, op, args in packed if result is value]
            if not made:
                return False
            packs[name] = made[0]
        elif value.layout != torch.strided or value.device.type != "cpu":
            return False
        else:
            constants[name] = value
    entry = {"source": source, "constants": _kept(constants), "packs": _kept(packs), "launches": launches,
             "token": token}
    buffer = io.BytesIO()
    torch.save(entry, buffer)
    atomic_write_bytes(_path(entry_key), buffer.getvalue())
    return True


def load(entry_key: str, token: int | None = None) -> tuple[Callable, str, int] | None:
    """(the kernel's function of its inputs, its generated source, its launches) kept under ``entry_key``, or
    None where there is no such entry, or it cannot be read. The token the kept source names, if any, is renamed
    ``token`` (the MLAS backend's operators open their sessions by it: two kernels must not share one)."""
    from torch._inductor.codecache import PyCodeCache

    path = _path(entry_key)
    if not path.exists():
        return None
    try:
        entry = torch.load(path, weights_only=True)
        source = entry["source"]
        if entry.get("token") is not None:
            if token is None:
                return None
            source = source.replace(str(entry["token"]), str(token))
        constants = {name: _resolved(value) for name, value in entry["constants"].items()}
        constants.update({name: getattr(torch.ops.mkldnn, op)(*_resolved(args))
                          for name, (op, args) in entry["packs"].items()})
        module_key, module_path = PyCodeCache.write(source)
        # attributes given: a module of its own, not one another kernel with the same code shares
        module = PyCodeCache.load_by_key_path(module_key, module_path, attrs=constants)
    except Exception:  # a damaged entry is rebuilt (and written again), not an error
        return None
    return direct_call(module), source, int(entry["launches"])


def direct_call(module) -> Callable:
    """The kernel's function of its inputs: the generated module's ``call``, without the wrappers ``compile_fx``
    returns it in (AOT autograd's and Inductor's, for aliased or mutated inputs, which korch's kernels have
    none of). Timed through those, a kernel built in a search's worker read 1.37x (median) what it reads loaded
    from the store: a product or convolution timed alone then set floors above the kernels that hold it
    (YOLOX-Nano, a 2-core Xeon, 2026-12-07)."""
    call = module.call
    return lambda *inputs: call(list(inputs))
