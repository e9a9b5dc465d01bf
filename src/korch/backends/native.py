"""korch's own C++ operators: built once per machine from the sources in this package, loaded into torch.

A source file here registers operators with ``TORCH_LIBRARY``. ``build``
compiles it against the installed torch (its headers and libraries, its C++
ABI, OpenMP as torch uses it) into korch's cache, keyed by the source and the
torch version, and returns the library's path; the executable that needs it
carries a copy (``korch.load`` compiles nothing). ``load`` opens a library
once per process: torch allows one library per operator namespace.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from korch import config
from korch.errors import KorchError

_LOADED: set[str] = set()  # operator namespaces a library registered in this process


def _flags() -> list[str]:
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return (["-O2", "-std=c++20", "-fopenmp", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
            + [f"-I{p}" for p in cpp_extension.include_paths()])


def _libraries() -> list[str]:
    from torch.utils import cpp_extension

    return [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch_cpu", "-ldl"]


def build(source: Path, namespace: str) -> Path:
    """The shared library compiled from ``source`` (C++), its operators in ``namespace`` (the source's
    ``KORCH_NAMESPACE``), from korch's cache when built before."""
    compiler = os.environ.get("CXX", "g++")
    flags = [*_flags(), f"-DKORCH_NAMESPACE={namespace}"]
    key = hashlib.sha256(source.read_bytes() + f"{torch.__version__} {compiler} {flags}".encode()).hexdigest()
    target = config.cache_dir / "native" / f"{source.stem}-{key[:16]}.so"
    if target.is_file():
        return target
    if shutil.which(compiler) is None:
        raise KorchError(f"building {source.name} needs a C++ compiler ({compiler}, or set CXX)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        done = subprocess.run([compiler, *flags, str(source), "-o", tmp, *_libraries()], capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise KorchError(f"building {source.name} failed: {done.stderr.strip().splitlines()[-1:]}")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def load(namespace: str, library: Path) -> bool:
    """Open ``library`` (which registers the operators of ``namespace``) unless a library registered them in
    this process already; whether it was opened now."""
    if namespace in _LOADED:
        return False
    try:
        torch.ops.load_library(str(library))
    except OSError as exc:
        raise KorchError(f"cannot open {library}: {exc}: run korch optimize again") from None
    _LOADED.add(namespace)
    return True
