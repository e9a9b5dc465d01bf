"""Writing an executable's directory (OUTDIR) through a ``bundle.BundleWriter``.

``write_executable`` writes an assembled executable's files and its reports;
the manifest (with every file's checksum) comes last. Its ``check`` says
whether the executable matched ONNX Runtime: one that did not loads only when
asked to (``korch run --allow-unchecked``). ``write_plan`` writes a plan and its reports alone (no
device to build on, or ``--plan-only``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from korch.orchestrate.plan import Plan
from korch.runtime import bundle
from korch.runtime.assemble import Assembled


def write_executable(outdir: str | os.PathLike, assembled: Assembled, reports: Mapping[str, bytes]) -> Path:
    """Write ``assembled`` and ``reports`` to ``outdir``, the manifest last."""
    writer = bundle.BundleWriter(outdir)
    writer.clear("kernels")
    for name, data in {**assembled.files, **reports}.items():
        writer.write(name, data)
    writer.finish(assembled.manifest)
    return Path(outdir)


def write_plan(outdir: str | os.PathLike, plan: Plan, reports: Mapping[str, bytes]) -> Path:
    writer = bundle.BundleWriter(outdir)
    for name, data in {"plan.json": plan.to_bytes(), **reports}.items():
        writer.write(name, data)
    return Path(outdir)
