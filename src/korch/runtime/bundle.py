"""The executable's directory (OUTDIR): what is in it, writing it safely, reading it back checked.

    manifest.json   versions, target, inputs/outputs, kernels, memory, self-check, file checksums
    model.py        the launch sequence (``codegen.launch_module``)
    model.pt2       the compiled unit, if any (``runtime/unit.py``), and the operator libraries it calls
    graph.json      the primitive graph, constants by name only
    weights.npz     the constants (weights), in graph order
    plan.json       the orchestrator's plan
    reference.onnx  the model as given, for ``korch run --check`` against ONNX Runtime
    kernels/        each generated kernel's source, for reading
    report.md, report.html

Every file is written atomically and the manifest last, after the old one is
removed: a directory with a manifest is complete, and a file whose checksum
differs from the manifest's is reported as corrupted, never run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from korch.errors import KorchError
from korch.fsutil import atomic_write_bytes
from korch.ir import serialize
from korch.ir.graph import Graph

FORMAT = "korch-executable"
VERSION = 1
MANIFEST = "manifest.json"
# files the loader reads; their checksums are verified before anything runs
LOADED_FILES = ("model.py", "graph.json", "weights.npz", "plan.json")
# an executable with a compiled unit loads the unit and the launch module's declarations only
UNIT_LOADED_FILES = ("model.py", "model.pt2")
# an executable serving a range of sizes loads each bucket's own directory when first called
FILES_LOADED = {"compiled unit": UNIT_LOADED_FILES, "by size": ()}
# files opened by path, not read into memory: verified by streaming them through the hash
OPENED_BY_PATH = frozenset({"model.pt2"})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def graph_bytes(graph: Graph) -> bytes:
    """``graph`` as JSON without the constants' values (those go to weights.npz)."""
    data = serialize.to_json(graph)
    data["constants"] = {}
    data["constant_names"] = list(graph.constants)
    return json.dumps(data).encode()


def weights_bytes(graph: Graph) -> bytes:
    buffer = io.BytesIO()
    # np.asarray keeps 0-d constants 0-d (np.ascontiguousarray would make them 1-d)
    np.savez(buffer, **{f"w{i}": np.asarray(v, order="C") for i, v in enumerate(graph.constants.values())})
    return buffer.getvalue()


def versions() -> dict[str, str]:
    """The versions an executable was built with (the manifest records them; the loader compares)."""
    import platform

    import torch

    from korch.version import __version__

    found = {"korch": __version__, "python": platform.python_version(), "torch": torch.__version__,
             "numpy": np.__version__}
    for package in ("onnx", "onnxruntime", "triton"):
        version = _version_of(package)
        if version is not None:
            found[package] = version
    return found


def _version_of(package: str) -> str | None:
    """``package.__version__``, from its distribution's record where it is not imported yet (a load need not
    import ONNX Runtime or Triton: 0.1 s of YOLOv4's 0.85 s ``korch.load``); None where it is not installed."""
    import importlib
    import sys
    from importlib import metadata

    if package not in sys.modules:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:  # installed under another name (onnxruntime-gpu), or not at all
            pass
    try:
        return importlib.import_module(package).__version__
    except ImportError:
        return None


class BundleWriter:
    """Writes an OUTDIR: files first (each atomically, checksummed), the manifest last."""

    def __init__(self, outdir: str | os.PathLike):
        self.outdir = Path(outdir)
        if self.outdir.exists() and not self.outdir.is_dir():
            raise KorchError(f"cannot write the executable to {self.outdir}: it is a file, not a directory")
        self.outdir.mkdir(parents=True, exist_ok=True)
        (self.outdir / MANIFEST).unlink(missing_ok=True)  # from here until the end, the directory is incomplete
        self.checksums: dict[str, str] = {}

    def write(self, relative: str, data: bytes) -> Path:
        self.checksums[relative] = _sha256(data)
        return atomic_write_bytes(self.outdir / relative, data)

    def clear(self, relative_dir: str) -> None:
        """Remove the files of an earlier build from ``relative_dir``."""
        folder = self.outdir / relative_dir
        if folder.is_dir():
            for f in folder.iterdir():
                if f.is_file():
                    f.unlink()

    def finish(self, manifest: Mapping) -> Path:
        data = {"format": FORMAT, "version": VERSION, **manifest, "files": dict(sorted(self.checksums.items()))}
        return atomic_write_bytes(self.outdir / MANIFEST, json.dumps(data, indent=1).encode())


def manifest_path(outdir: str | os.PathLike) -> Path:
    """``outdir``'s manifest file, or a one-line error where ``outdir`` is no executable at all (cheap: the CLI
    asks before it imports torch)."""
    outdir = Path(outdir)
    if not outdir.is_dir():
        raise KorchError(f"no korch executable at {outdir}: no such directory")
    path = outdir / MANIFEST
    if not path.is_file():
        raise KorchError(f"{outdir} is not a korch executable (no {MANIFEST}; write one with korch optimize -o)")
    return path


def read_manifest(outdir: str | os.PathLike) -> tuple[dict, dict[str, bytes]]:
    """The manifest of ``outdir`` and the verified contents of the files the loader reads, after checking the
    directory is a complete, uncorrupted executable (each file is read once; those in ``OPENED_BY_PATH`` are
    verified and left on disk for their loader). ``reference.onnx`` is verified where it is used
    (``verified_path``): a check needs it, running does not."""
    outdir = Path(outdir)
    path = manifest_path(outdir)
    try:
        manifest = json.loads(path.read_bytes())
    except ValueError as exc:
        raise KorchError(f"{path} is corrupted: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise KorchError(f"{path} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise KorchError(f"{outdir} is a {FORMAT} v{manifest.get('version')}; this korch reads v{VERSION}: "
                         "run korch optimize again")
    verified, libraries = {}, unit_libraries(manifest)
    for name in (*FILES_LOADED.get(manifest.get("runs"), LOADED_FILES), *libraries):
        if name in OPENED_BY_PATH or name in libraries:
            verified_path(outdir, name, manifest)
        else:
            verified[name] = _verified(outdir, name, manifest, read=True)
    return manifest, verified


def unit_libraries(manifest: Mapping) -> list[str]:
    """The operator libraries (files in the directory) an executable's compiled unit calls."""
    if manifest.get("runs") != "compiled unit":
        return []
    return list(manifest.get("unit", {}).get("libraries", []))


def verified_path(outdir: str | os.PathLike, name: str, manifest: Mapping) -> Path:
    """The path of ``outdir``'s file ``name`` once its checksum matches the manifest's (the file is hashed
    in chunks, never held in memory whole)."""
    return _verified(Path(outdir), name, manifest, read=False)


def _verified(outdir: Path, name: str, manifest: Mapping, *, read: bool) -> bytes | Path:
    """The file's bytes (``read``) or its path, after its checksum was compared with the manifest's."""
    checksum = manifest.get("files", {}).get(name)
    if checksum is None:
        raise KorchError(f"{outdir} is incomplete: the manifest lists no {name}")
    path = outdir / name
    try:
        if read:
            result = path.read_bytes()
            digest = _sha256(result)
        else:
            with open(path, "rb") as f:
                result, digest = path, hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        raise KorchError(f"{outdir} is incomplete: {name} is missing") from None
    if digest != checksum:
        raise KorchError(f"{path} is corrupted (its checksum differs from the manifest's)")
    return result


def graph_from_bytes(graph_json: bytes, weights_npz: bytes) -> Graph:
    """The graph ``graph_bytes`` and ``weights_bytes`` wrote."""
    data = json.loads(graph_json)
    names = data.pop("constant_names")
    graph = serialize.from_json(data)
    with np.load(io.BytesIO(weights_npz)) as weights:
        for i, name in enumerate(names):
            graph.constants[name] = weights[f"w{i}"]
    return graph


def read_graph(outdir: str | os.PathLike) -> Graph:
    outdir = Path(outdir)
    return graph_from_bytes((outdir / "graph.json").read_bytes(), (outdir / "weights.npz").read_bytes())


def read_plan(outdir: str | os.PathLike):
    """The plan an OUTDIR's executable was built from (``plan.json``), unverified, for benchmarks and tools."""
    from korch.orchestrate.plan import Plan

    return Plan.from_bytes((Path(outdir) / "plan.json").read_bytes())
