"""The GPU campaign: everything a lent GPU's session must measure, in phases that each fit one device command.

A lent H100/H200 comes with 15 minutes of device time and 10 minutes per command, so
the work is cut in phases, each run by one call, each writing its results as it
goes (a command killed at its limit still returns what it finished):

* ``facts``: the device's measured ceilings (``device_facts.py``: copy bandwidth, matrix
  rates, one kernel's time launched and in a replayed CUDA graph, the seconds the measured
  search's timer spends on a kernel, by step);
* ``smoke``: the environment (GPU, versions) and ``pytest -m gpu`` (every kernel
  class on CUDA, each launch variant, a zoo executable replayed from its CUDA graph);
* ``small``: the small zoo models, ``korch optimize`` (roofline costs) and
  ``korch bench`` against every GPU peer, fp32;
* ``tf32``: the same under the tf32 policy (all peers but max-autotune, which
  compiles for minutes per model);
* ``large``: the large zoo models and the ``transformers`` architectures, fp32;
* ``measured``: a measured search (kernels built, checked and timed), with what
  fraction of the candidates it measured, how long it took, and the kernels it
  measured below their floors (``korch db check``).

Every model's row also holds its plan's gap (a measured search stopped by its time limit
is unproven) and each kernel's time as the executable runs it beside the plan's cost for
it (``zoo_bench.kernels_in_place``): where a prediction misses, which kernels miss.

Each phase stops starting models once less than ``--reserve`` seconds remain
before ``--deadline`` (seconds from the start): it records them as skipped. A
measured search gets what the deadline leaves less the reserve, and then plans
from what it measured (its gap recorded).
Results: at most seven files under ``--out`` (``campaign.json`` and one per
phase), within the device's limit of 8 files returned. Models are exported where the campaign runs (the GPU machine's
torch is its own); ``highspy`` must be importable there (``docs/gpu.md``: carried
as a wheel).

``--dry-run`` runs every phase's code on this CPU in a few minutes: the same
files, a tiny model instead of the zoo, the CPU target, the CPU's peers, short
budgets (``tests/test_gpu_campaign.py`` runs it).

    python benchmarks/gpu_campaign.py --out $OUT --phases smoke,small --deadline 540
    python benchmarks/gpu_campaign.py --dry-run --out /tmp/campaign
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("facts", "smoke", "small", "tf32", "large", "measured")
SMALL = ("bert_layer", "vit_block", "candy", "yolox_nano", "segformer_b0")
LARGE = ("efficientvit", "yolov4", "hf_bert", "hf_gpt2", "hf_llama", "hf_vit", "hf_whisper_encoder")
MEASURED = ("bert_layer", "candy")
GPU_PEERS = ["eager", "eager-cuda-graph", "compile", "compile-reduce-overhead", "compile-max-autotune", "ort"]
# max-autotune compiles for minutes per model: the tf32 pass leaves it out to fit its call
CPU_PEERS = ["eager", "compile", "ort"]


@dataclasses.dataclass(frozen=True)
class Model:
    ref: str                   # "zoo:NAME" or an ONNX path
    torch_model: object = None  # the nn.Module the PyTorch peers run (None: what ``ref`` names)

    @property
    def name(self) -> str:
        return Path(self.ref).stem.removeprefix("zoo:")


@dataclasses.dataclass(frozen=True)
class Setting:
    target: str
    models: dict[str, tuple[Model, ...]]      # per phase (smoke has none)
    precisions: dict[str, tuple[str, ...]]    # per phase
    peers: dict[str, list[str]]               # per phase
    budget_s: float
    smoke_tests: list[str]                    # pytest arguments
    measured_time_limit_s: float | None       # a measured search's seconds at most (None: what the deadline leaves)
    smoke_workers: int                        # pytest-xdist processes (0: none): Triton compiles on every core
    db: Path                                  # the measured phase's profile database (not a result: not in --out)
    timer_kernels: int = 4                    # kernels per backend the facts phase times as the search does (their
                                              # builds: an estimated minute of a GPU call)


def gpu_setting() -> Setting:
    from korch.pipeline import detect_target

    zoo = lambda names: tuple(Model(f"zoo:{n}") for n in names)  # noqa: E731
    fast_peers = [p for p in GPU_PEERS if p != "compile-max-autotune"]
    return Setting(target=detect_target(),
                   models={"small": zoo(SMALL), "tf32": zoo(SMALL), "large": zoo(LARGE), "measured": zoo(MEASURED)},
                   precisions={"small": ("fp32",), "tf32": ("tf32",), "large": ("fp32",), "measured": ("fp32",)},
                   peers={"small": GPU_PEERS, "tf32": fast_peers, "large": GPU_PEERS, "measured": fast_peers},
                   budget_s=2.0, smoke_tests=["-m", "gpu", "tests/gpu", "tests/test_gpu_marker.py"],
                   measured_time_limit_s=None, smoke_workers=min(8, os.cpu_count() or 1),
                   db=Path(tempfile.gettempdir()) / "korch-campaign-profile.sqlite")  # kept while the machine is


def dry_setting(workdir: Path) -> Setting:
    tiny = Model(str(_tiny_model(workdir)), TinyNet().eval())
    return Setting(target="cpu", models={phase: (tiny,) for phase in PHASES[1:]},
                   precisions={phase: ("fp32",) for phase in PHASES[1:]},  # a CPU computes float32 exactly
                   peers={phase: CPU_PEERS for phase in PHASES[1:]}, budget_s=0.05,
                   smoke_tests=["-m", "gpu", "tests/gpu", "tests/test_gpu_marker.py"], measured_time_limit_s=60,
                   smoke_workers=0,
                   db=workdir / "profile.sqlite", timer_kernels=1)


class TinyNet(torch.nn.Module):
    """A convolution, a normalisation and a matrix product: one of each kind of kernel, tiny."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return torch.softmax(self.head(self.norm(h)), dim=-1)


def _tiny_model(workdir: Path) -> Path:
    from korch.frontend.torch_module import export_module

    return export_module(TinyNet().eval(), (torch.rand(1, 3, 8, 8),), workdir / "tiny.onnx", input_names=["x"])


class Campaign:
    def __init__(self, out: Path, setting: Setting, deadline_s: float, reserve_s: float, jobs: int | None,
                 smoke_limit_s: float | None = None, peers: list[str] | None = None):
        self.out, self.setting, self.reserve_s, self.jobs = out, setting, reserve_s, jobs
        self.smoke_limit_s, self.peers = smoke_limit_s, peers
        self.started = time.monotonic()
        self.deadline = self.started + deadline_s
        out.mkdir(parents=True, exist_ok=True)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def write(self, name: str, data) -> None:
        from korch.fsutil import atomic_write_bytes

        atomic_write_bytes(self.out / f"{name}.json", json.dumps(data, indent=1, default=str).encode())

    def environment(self, phases: list[str], dry_run: bool) -> dict:
        from korch.runtime import bundle

        return {"date": time.strftime("%Y-%m-%d"), "dry_run": dry_run, "target": self.setting.target,
                "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                "versions": bundle.versions(), "phases": phases,
                "command": " ".join(["python", "benchmarks/gpu_campaign.py", *sys.argv[1:]])}

    def facts(self) -> dict:
        from device_facts import measure  # beside this script

        result = measure(self.setting.timer_kernels)
        self.write("facts", result)
        return result

    def smoke(self) -> dict:
        # korch from source and its tests, before what the caller's path holds (a carried wheel's directory)
        path = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": path}
        workers = ["-n", str(self.setting.smoke_workers)] if self.setting.smoke_workers else []
        command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *workers,
                   *self.setting.smoke_tests]
        limit = max(self.left_s() - self.reserve_s, 30)
        start = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=min(limit, self.smoke_limit_s or limit))
            status, output, errors = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            status, output, errors = "timed out", _text(exc.stdout), _text(exc.stderr)
        # pytest's summary is stdout's last line; stderr (plugins' warnings) comes after it in the record
        result = {"command": " ".join(command[1:]), "exit": status, "seconds": time.perf_counter() - start,
                  "summary": output.strip().splitlines()[-1] if output.strip() else "", "tail": output[-6000:],
                  "stderr_tail": errors[-2000:]}
        self.write("smoke", result)
        return result

    def models(self, phase: str, cost: str) -> list[dict]:
        from zoo_bench import run_model  # beside this script

        rows: list[dict] = []
        runs = len(self.setting.precisions[phase]) * len(self.setting.models[phase])
        for precision in self.setting.precisions[phase]:
            for model in self.setting.models[phase]:
                row = {"model": model.ref if model.ref.startswith("zoo:") else model.name, "precision": precision,
                       "cost": cost}
                if self.left_s() < self.reserve_s:
                    row["skipped"] = f"deadline: {self.left_s():.0f} s left"
                else:
                    print(f"{phase}: {model.name} ({precision}, {cost}) ...", flush=True)
                    try:
                        row.update(run_model(model.ref, self.setting.target, cost, str(self.setting.db),
                                             self.peers or self.setting.peers[phase],
                                             self.setting.budget_s, self.jobs, precision, model.torch_model,
                                             self._search_limit_s(runs - len(rows)) if cost == "measured" else None))
                        if cost == "measured":
                            row["below_floor"] = _below_floor(model.ref, self.setting)
                    except Exception as exc:  # a model that fails is recorded and the phase goes on
                        from korch.errors import one_line

                        row["error"] = one_line(exc)
                        row["traceback"] = traceback.format_exc()[-3000:]
                rows.append(row)
                self.write(phase, rows)
                print(f"  {_summary(row)}", flush=True)
        return rows

    def _search_limit_s(self, runs_left: int) -> float:
        """Seconds a measured search may take: its share of what is left before the deadline once every run
        still to start has its reserve (the plan's build and the peers' runs), never under 30 s (a measured
        search with no limit ran past its device call's end on an H200, 2026-11-26, and left no row)."""
        runs_left = max(runs_left, 1)
        limit = max((self.left_s() - self.reserve_s * runs_left) / runs_left, 30.0)
        return min(limit, self.setting.measured_time_limit_s or limit)


def _below_floor(ref: str, setting: Setting) -> list[dict]:
    """``korch db check`` over the measured phase's database: each kernel measured faster than its floor (the
    worst 40), so the floor model can be corrected from the returned files (the database stays on the machine)."""
    from korch.dbcheck import check_floors

    found = check_floors(ref, target=setting.target, db=setting.db)
    return [dataclasses.asdict(b) for b in found.below[:40]]


def _text(captured) -> str:
    return captured.decode(errors="replace") if isinstance(captured, bytes) else (captured or "")


def _summary(row: dict) -> str:
    if "skipped" in row or "error" in row:
        return row.get("skipped") or row["error"]
    k = row["korch"]["median_s"]
    ratios = ", ".join(f"{p['name']} {p['median_s'] / k:.2f}x" for p in row["peers"])
    in_place = row.get("kernels_in_place", {})
    less = in_place.get("run_less_stamps_s", 0.0)
    kernels = (f"; kernels in place {in_place['run_s'] * 1e3:.3f} ms ({less * 1e3:.3f} less the events), "
               f"predicted {in_place['predicted_s'] * 1e3:.3f}"
               if "run_s" in in_place else f"; kernels in place: {in_place.get('error', 'not timed')}")
    rate = in_place.get("memory_bound", {}).get("Bps")
    moved = f"; memory-bound kernels {rate / 1e9:.0f} GB/s" if rate else ""
    return f"korch {k * 1e3:.3f} ms ({ratios}); check {'ok' if row['check']['ok'] else 'FAILED'}{kernels}{moved}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the result files go ($OUT on the device)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    parser.add_argument("--deadline", type=float, default=540, help="seconds from the start to stop starting work")
    parser.add_argument("--reserve", type=float, default=90, help="seconds a model may need; none starts with less left")
    parser.add_argument("--jobs", type=int, help="kernel-building processes (default: korch's)")
    parser.add_argument("--smoke-limit", type=float, help="seconds the smoke phase's tests may take at most")
    parser.add_argument("--models", help="comma-separated zoo names for every model phase instead of each phase's own")
    parser.add_argument("--measured-models", help="comma-separated zoo names for the measured phase (after --models)")
    parser.add_argument("--peers", help="comma-separated peers for every model phase instead of each phase's own")
    parser.add_argument("--dry-run", action="store_true", help="every phase on this CPU, a tiny model, minutes")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        parser.error(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(PHASES)}")
    try:
        import highspy  # noqa: F401 - the solver; missing on the GPU machine unless carried (docs/gpu.md)
    except ImportError:
        parser.error("highspy is not importable: carry its wheel (docs/gpu.md)")
    with tempfile.TemporaryDirectory(prefix="korch-campaign-") as workdir:
        setting = dry_setting(Path(workdir)) if args.dry_run else gpu_setting()
        if args.models:
            chosen = tuple(Model(f"zoo:{name}") for name in args.models.split(","))
            setting = dataclasses.replace(setting, models={phase: chosen for phase in setting.models})
        if args.measured_models:
            measured = tuple(Model(f"zoo:{name}") for name in args.measured_models.split(","))
            setting = dataclasses.replace(setting, models={**setting.models, "measured": measured})
        if not args.dry_run and setting.target == "cpu":
            parser.error("no GPU here: use --dry-run on a CPU")
        campaign = Campaign(args.out, setting, args.deadline, 0 if args.dry_run else args.reserve, args.jobs,
                            args.smoke_limit, args.peers.split(",") if args.peers else None)
        record = campaign.environment(phases, args.dry_run)
        campaign.write("campaign", record)
        for phase in phases:
            started = time.perf_counter()
            if phase == "facts":
                facts = campaign.facts()
                outcome = (f"copy {facts['copy_bandwidth_Bps'] / 1e9:.0f} GB/s, matmul "
                           + ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in facts["matmul_flops"].items()))
            elif phase == "smoke":
                outcome = campaign.smoke()["summary"]
            else:
                rows = campaign.models(phase, "measured" if phase == "measured" else "roofline")
                outcome = f"{sum('korch' in r for r in rows)} of {len(rows)} runs done"
            record.setdefault("phase_results", {})[phase] = {"seconds": time.perf_counter() - started,
                                                              "outcome": outcome}
            campaign.write("campaign", record)
            print(f"{phase}: {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
