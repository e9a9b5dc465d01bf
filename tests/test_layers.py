"""korch's packages form layers, and no module imports a higher one (in the spirit of Inductor's
op-completeness tests: a rule of the design, checked on every module, every time).

Lowest first: the utilities every layer uses, then ``ir < frontend (and the zoo, models written with
it) < fission < cost < orchestrate < backends < runtime < report < the API and the CLI``. Imports are
read with ``ast``, function-level ones included, so a lazy import cannot hide an upward dependency.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS = [
    {"korch.errors", "korch.config", "korch.fsutil", "korch.version", "korch.precision", "korch.workers", "korch.threads",
     "korch.heap", "korch.vector_math"},
    {"korch.ir"},
    {"korch.frontend", "korch.zoo"},
    {"korch.fission"},
    {"korch.cost"},
    {"korch.orchestrate"},
    {"korch.backends"},
    {"korch.runtime"},
    {"korch.report"},
    {"korch", "korch.__main__", "korch.api", "korch.bench", "korch.cli", "korch.cli_inputs", "korch.cli_run",
     "korch.dynamic", "korch.dbcheck", "korch.onnx2torch_opsets", "korch.pipeline", "korch.plan_challenge",
     "korch.search_estimate"},
]


def layer_of(module: str) -> int:
    """The layer of a module: that of the longest listed package or module it is in."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        for rank, members in enumerate(LAYERS):
            if prefix in members:
                return rank
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, src: Path) -> set[str]:
    """The korch modules ``path`` imports (``from korch import config`` is ``korch.config``)."""
    module = module_name(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                is_module = (src / Path(*candidate.split("."))).with_suffix(".py").exists() or \
                    (src / Path(*candidate.split("."))).is_dir()
                found.add(candidate if is_module else base)
    return {name for name in found if name == "korch" or name.startswith("korch.")}


def upward_imports(src: Path) -> list[str]:
    problems = []
    for path in sorted((src / "korch").rglob("*.py")):
        module = module_name(path, src)
        for imported in sorted(imports_of(path, src)):
            if layer_of(imported) > layer_of(module):
                problems.append(f"{module} imports {imported}")
    return problems


def test_no_module_imports_a_higher_layer():
    assert upward_imports(SRC) == []


def test_a_planted_upward_import_is_caught(tmp_path):
    (tmp_path / "korch" / "ir").mkdir(parents=True)
    (tmp_path / "korch" / "runtime").mkdir()
    (tmp_path / "korch" / "__init__.py").write_text("")
    (tmp_path / "korch" / "runtime" / "__init__.py").write_text("")
    (tmp_path / "korch" / "runtime" / "executable.py").write_text("")
    (tmp_path / "korch" / "ir" / "graph.py").write_text("def f():\n    from korch.runtime import executable\n")
    (tmp_path / "korch" / "ir" / "shapes.py").write_text("from ..runtime.executable import x\n")
    assert upward_imports(tmp_path) == ["korch.ir.graph imports korch.runtime.executable",
                                        "korch.ir.shapes imports korch.runtime.executable"]


def test_every_package_and_top_module_has_a_layer():
    for path in (SRC / "korch").iterdir():
        if path.name != "__pycache__" and (path.is_dir() or path.suffix == ".py"):
            layer_of(module_name(path / "__init__.py" if path.is_dir() else path, SRC))


def test_reports_live_in_the_report_package():
    misplaced = [str(p.relative_to(SRC)) for p in (SRC / "korch").rglob("*report*.py")
                 if p.parent.name != "report"]
    assert misplaced == []
