"""Many of Inductor's C++ kernels in one compiler run: the build workers' way to compile a batch of candidates.

Inductor compiles each CPU kernel it writes as its own shared library, one
``g++`` run each. On this project's CPUs a run costs 0.5 s before it compiles
anything of the kernel (loading the 155 MB precompiled header of ATen's
vector types, linking against libtorch), most of a small kernel's build. While
``deferred_compiles`` is active, a kernel Inductor loads is not compiled: it
becomes a ``_Deferred`` callable (Inductor's wrapper calls it as it would the
kernel) and its source joins the batch. ``CompileBatch.compile`` then builds
every pending kernel whose compiler command is the same into one library,
each kernel's source in a namespace of its own with its C symbols renamed,
and gives each kernel the file Inductor looks for (its cache key's ``.so``): a
stub library that links to the batch's and exports the kernel's module entry
point under the name Python's importer asks for. Later builds of the same
kernel, in any process, find that file in Inductor's cache and compile
nothing. A batch is one large translation unit, compiled with GCC's inliner
limits raised (``inlining.py``) so that its kernels inline ATen's vector
helpers as each would compiled alone.

Whatever the batch cannot do (a command it cannot parse, a compiler error)
it leaves undone: a deferred kernel still compiles itself, alone, the first
time it is called, so batching changes how long a build takes, never what
it computes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from korch.backends.inlining import with_raised_limits

BATCH_DIR = "korch-batches"  # under Inductor's cache directory
_ENTRY, _INIT = re.compile(r"\bkernel(?=\s*\()"), re.compile(r"\bPyInit_kernel\b")
_HOISTED = re.compile(r"\s*#\s*(include\b|define\s+PY_SSIZE_T_CLEAN\b)")
_SOURCE, _TARGET = "\0source\0", "\0target\0"  # placeholders in a command


class _Pending:
    """One kernel whose compilation Inductor handed to ``submit_fn``: its compiler command, source and target."""

    def __init__(self):
        self.builders = None

    def capture(self, compile_fn):
        # Inductor's compile_fn is functools.partial(_worker_compile_cpp, lock_path, builders); calling it later
        # builds whatever target is still missing, so it stays the fallback
        self.builders = compile_fn.args[1] if len(getattr(compile_fn, "args", ())) == 2 else None
        done = concurrent.futures.Future()  # nothing to wait for: the batch compiles later
        done.set_result(None)
        return done

    def command(self) -> tuple[str, str, str] | None:
        """(source, target, the command with both left out), or None when this kernel cannot join a batch."""
        if not self.builders or len(self.builders) != 1:
            return None  # a kernel compiled in parts (Inductor's -O1 wrapper plus -O3 kernel) is left alone
        builder = self.builders[0]  # its private fields may differ in another torch: CompileBatch.compile catches
        sources, output = builder._sources_args.strip(), builder._output.strip()
        command, target = builder.get_command_line(), builder.get_target_file_path()
        if " " in sources or not output.endswith(target) or command.count(sources) != 1:
            return None
        return sources, target, command.replace(sources, _SOURCE).replace(output, f"-o {_TARGET}")


class _Deferred:
    """Stands in for a compiled kernel in Inductor's wrapper: loads (and if need be compiles) it on first call."""

    def __init__(self, load):
        self._load, self._kernel = load, None

    def __call__(self, *args):
        if self._kernel is None:
            self._kernel = self._load()
        return self._kernel(*args)


class CompileBatch:
    """The kernels deferred while ``deferred_compiles`` was active, until ``compile``."""

    def __init__(self):
        self.pending: list[_Pending] = []
        self.compiled = 0     # kernels this batch compiled
        self.runs = 0         # compiler runs that compiled them (stubs not counted)

    def compile(self) -> None:
        """Compile every pending kernel that can share a compiler run with another; see the module docstring."""
        groups: dict[str, list[tuple[str, str]]] = {}
        for pending in self.pending:
            try:
                command = pending.command()
            except Exception:  # noqa: BLE001 - a builder this cannot read (another torch's): it compiles alone
                command = None
            if command is not None and not os.path.exists(command[1]):
                groups.setdefault(command[2], []).append(command[:2])
        self.pending = []
        for command, kernels in groups.items():
            if len(kernels) > 1:
                try:
                    _compile_together(command, kernels)
                except Exception:  # noqa: BLE001 - each kernel then compiles alone, when first called
                    continue
                self.compiled += len(kernels)
                self.runs += 1


def _compile_together(command: str, kernels: list[tuple[str, str]]) -> None:
    command = with_raised_limits(command)  # a batch is a translation unit of many kernels (inlining.py)
    sources = [Path(source).read_text() for source, _ in kernels]
    tag = hashlib.sha256("\0".join([command, *sources]).encode()).hexdigest()[:16]
    includes, bodies = {}, []  # includes in order of first appearance, once each
    for i, source in enumerate(sources):
        name = f"{tag}_{i}"
        lines = source.splitlines()
        includes.update(dict.fromkeys(line.strip() for line in lines if _HOISTED.match(line)))
        body = "\n".join(line for line in lines if not _HOISTED.match(line))
        body = _ENTRY.sub(f"kernel_{name}", _INIT.sub(f"PyInit_kernel_{name}", body))
        bodies.append(f"namespace korch_batch_{name} {{\n{body}\n}}\n")
    directory = Path(kernels[0][1]).parent.parent / BATCH_DIR
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / f"batch_{tag}.so"
    if not library.exists():
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            source = Path(tmp) / "batch.cpp"
            source.write_text("\n".join(includes) + "\n" + "".join(bodies))
            built = Path(tmp) / library.name
            words = [w.replace(_SOURCE, str(source)).replace(_TARGET, str(built)) for w in shlex.split(command)]
            subprocess.run(words, check=True, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.replace(built, library)
    for i, (_, target) in enumerate(kernels):
        _stub(library, f"{tag}_{i}", Path(target))


def _stub(library: Path, name: str, target: Path) -> None:
    """``target``: a library whose ``PyInit_kernel`` is the batch library's ``PyInit_kernel_<name>``."""
    stub = f"extern void *PyInit_kernel_{name}(void);\nvoid *PyInit_kernel(void) {{ return PyInit_kernel_{name}(); }}\n"
    temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(temporary), "-x", "c", "-", "-x", "none", str(library),
                    f"-Wl,-rpath,{library.parent}"], input=stub.encode(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.replace(temporary, target)


@contextlib.contextmanager
def deferred_compiles() -> Iterator[CompileBatch]:
    """While active, Inductor's C++ kernels wait for ``CompileBatch.compile`` (see the module docstring)."""
    import torch._inductor.config
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    batch = CompileBatch()
    load_async = CppPythonBindingsCodeCache.load_pybinding_async

    def load_pybinding(cls, *args, **kwargs):
        pending = _Pending()
        kwargs["submit_fn"] = pending.capture
        load = load_async.__func__(cls, *args, **kwargs)
        if pending.builders is None:
            return load()  # compiled already (or never to be batched): as Inductor would
        batch.pending.append(pending)
        return _Deferred(load)

    original = CppPythonBindingsCodeCache.__dict__["load_pybinding"]
    CppPythonBindingsCodeCache.load_pybinding = classmethod(load_pybinding)
    try:
        # one compile thread: Inductor then loads each kernel through load_pybinding (with more, it compiles in
        # a pool of its own, which this cannot defer)
        with torch._inductor.config.patch(compile_threads=1):
            yield batch
    finally:
        CppPythonBindingsCodeCache.load_pybinding = original
