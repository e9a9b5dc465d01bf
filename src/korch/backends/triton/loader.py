"""Generated Triton source -> importable module.

``triton.jit`` reads a kernel's source back from its file, so generated code
must live in a real file: each source is written once (atomically) under the
cache directory, named by its hash, and imported from there. The interpreter
(``TRITON_INTERPRET=1``, for CPUs and CI) needs the same.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from korch import config
from korch.fsutil import atomic_write_bytes


def source_dir() -> Path:
    return Path(config.cache_dir) / "triton-src"


def load_module(source: str, *, compiled: bool | None = None) -> ModuleType:
    """The module of ``source`` (written to the cache on first use; one module per distinct source).

    ``compiled=True`` loads it with the interpreter off, whatever ``TRITON_INTERPRET``
    says (for compiling ahead for a GPU that is not here); None follows the environment.
    """
    digest = hashlib.blake2b(source.encode(), digest_size=12).hexdigest()
    name = f"korch_triton_{digest}" + ("_compiled" if compiled else "")
    module = sys.modules.get(name)
    if module is not None:
        return module
    path = source_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        atomic_write_bytes(path, source.encode())
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    saved = os.environ.get("TRITON_INTERPRET")
    try:
        if compiled:
            os.environ["TRITON_INTERPRET"] = "0"  # triton.jit reads it when decorating
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        if compiled:
            if saved is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = saved
    return module
