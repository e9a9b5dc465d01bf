"""The ``korch`` command line: inspect, fission, optimize, run, bench, zoo and db.

Every problem with the user's input ends the run with one line on stderr and
exit status 2 (``KorchError``); warnings (opaque operators) print as one line
each and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from korch import config
from korch.cli_inputs import input_shapes, input_values, read_npz
from korch.cli_run import cmd_run
from korch.errors import KorchError


def _load(args):
    import onnx

    from korch.pipeline import load_model, resolve_model

    imported, graph, report = load_model(args.model, input_shapes(args), input_values(args))
    # the operator histogram is of the model as given, before folding (zoo exports are cached: no re-export)
    source = onnx.load(str(resolve_model(args.model)), load_external_data=False)
    return source, imported, graph, report


def cmd_inspect(args) -> int:
    from korch.report.model_summary import summarize

    summary = summarize(*_load(args))
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{summary.name}[/bold]  opset {summary.opset}  inputs {summary.inputs}  "
                  f"outputs {summary.outputs}")
    console.print(f"ONNX nodes {summary.onnx_nodes}  ->  primitive nodes {summary.primitive_nodes}  "
                  f"({', '.join(f'{k} {v}' for k, v in summary.primitive_kinds.items())})")
    console.print(f"parameters {summary.parameter_bytes / 2**20:.2f} MiB  FLOPs {summary.flops / 1e9:.3f} G")
    for title, histogram in (("ONNX operators", summary.operator_histogram),
                             ("primitives after fission", summary.primitive_histogram)):
        console.print(f"[bold]{title}[/bold]")
        table = Table()
        table.add_column("op")
        table.add_column("count", justify="right")
        for op, count in histogram.items():
            table.add_row(op, str(count))
        console.print(table)
    if summary.opaque_operators:
        console.print("[yellow]opaque operators[/yellow]: " + "; ".join(
            f"{op} {why}" for op, why in summary.opaque_operators.items()))
    else:
        console.print("opaque operators: none")
    return 0


def cmd_fission(args) -> int:
    import onnx

    from korch.fsutil import atomic_write_bytes
    from korch.ir.serialize import save
    from korch.ir.to_onnx import to_onnx

    _, _, graph, _ = _load(args)
    model = to_onnx(graph)
    onnx.checker.check_model(model)
    atomic_write_bytes(args.output, model.SerializeToString())
    if args.ir:
        save(graph, args.ir)
    print(f"wrote {args.output}: {len(graph.nodes)} primitive nodes ({graph.op_histogram()})")
    return 0


def _progress(quiet: bool):
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True,
                    disable=quiet)


def _gap(plan) -> float:
    """How far the plan may be above the optimum, relative: the segments' gaps weighed by their objectives."""
    total = sum(s.objective_s for s in plan.segments)
    lower = sum(s.objective_s * (1 - s.gap) for s in plan.segments)
    return 0.0 if total <= 0 else (total - lower) / total


def _callbacks(progress, task):
    from korch.pipeline import Progress

    measured = [0]

    def on_kernel(what):
        measured[0] += 1
        progress.update(task, description=f"measure: kernel {measured[0]}: {what[:60]}")

    return Progress(
        on_stage=lambda name: progress.update(task, description=name),
        on_segment=lambda i, n: progress.update(task, description=f"solve: segment {i + 1} of {n}"),
        on_kernel=on_kernel,
        on_build=lambda i, n, k: progress.update(task, description=f"build: kernel {i + 1} of {n}: {k.ops[:50]}"))


def cmd_optimize(args) -> int:
    from korch.pipeline import optimize

    if args.estimate:
        from korch.search_estimate import estimate

        print(estimate(args.model, target=args.target or "", jobs=args.jobs or 16, input_shapes=input_shapes(args),
                       max_kernel_nodes=args.max_kernel_nodes).describe())
        return 0
    if args.output is None:
        raise KorchError("optimize needs -o OUTDIR (or --estimate)")
    if args.dynamic:
        return _optimize_dynamic(args)
    with _progress(args.quiet) as progress:
        task = progress.add_task("starting", total=None)
        result = optimize(
            args.model, output=args.output, target=args.target, cost=args.cost, db=args.db, jobs=args.jobs,
            input_shapes=input_shapes(args), time_limit=args.time_limit, cut_points=args.cut_points,
            max_kernel_nodes=args.max_kernel_nodes, plan_only=args.plan_only,
            compiled_unit=False if args.kernel_by_kernel else None, progress=_callbacks(progress, task),
            precision=args.precision, cuda_graph=False if args.no_cuda_graph else None,
            tolerance=args.tolerance, check_inputs=read_npz(args.check_inputs, "--check-inputs"),
            input_values=input_values(args), unit_boundaries=args.unit_boundaries,
            blocked_convolutions=args.blocked_convolutions,
            layouts=False if args.no_layouts else None, measure_ahead=args.measure_ahead)
    out = args.output
    plan = result.plan
    challenge = plan.stats.get("plan challenge")
    proof = ", the floors' plan (see below)" if challenge and challenge["kept"] == "floors'" else \
        ", optimal" if all(s.optimal for s in plan.segments) else f", NOT proven optimal: gap {_gap(plan):.1%}"
    print(f"{plan.model}: {len(result.graph.nodes)} primitives, {result.candidates} candidate kernels, "
          f"{len(plan.segments)} segments -> {len(plan.kernels)} kernels, predicted "
          f"{plan.predicted_latency_s * 1e3:.3f} ms on {plan.target} ({plan.cost_model}{proof}); "
          f"plan in {sum(plan.stats['stage_seconds'].values()):.1f} s")
    measurement = plan.stats.get("measurement")
    if measurement:
        print(f"measured {measurement['kernels_measured']} kernels ({measurement['signatures_asked']} distinct "
              f"candidates asked, {measurement['from_database']} answered by the database "
              f"{measurement['device']}); {len(measurement['failures'])} kernels failed and were dropped"
              + (f"; {measurement['in_place']['planned_kernels']} planned kernels priced in place"
                 if "in_place" in measurement else ""))
    if challenge:
        from korch.report.markdown import challenge_summary

        print(challenge_summary(challenge))
    if result.executable is None:
        why = "as asked (--plan-only)" if args.plan_only else f"no {plan.target} device here"
        print(f"wrote {out / 'plan.json'}, {out / 'report.md'} and {out / 'report.html'}; "
              f"no executable: {why}")
        return 0
    memory = result.manifest["memory"]
    runs = result.manifest["runs"]
    if runs != "compiled unit":
        runs += f" ({result.manifest['unit']['why_not']})"
    print(f"executable: {len(plan.kernels)} kernels, {runs}, planned memory {memory['peak_bytes'] / 2**20:.2f} MiB "
          f"(one buffer per tensor: {memory['naive_bytes'] / 2**20:.2f} MiB); "
          f"{result.executable.check.summary()}")
    print(f"wrote {out} (model.py, weights, manifest.json, report.md, report.html); run it with: korch run {out}")
    return 0


def cmd_bench(args) -> int:
    from korch import bench
    from korch.pipeline import optimize

    peers = bench.parse_peers(args.against)
    with _progress(args.quiet) as progress:
        task = progress.add_task("starting", total=None)
        outdir = args.output
        if outdir is None:
            name = Path(args.model).stem.removeprefix("zoo:")
            outdir = Path(config.cache_dir) / "bench" / f"{name}-{args.target or 'auto'}-{args.cost}"
        optimized = optimize(args.model, output=outdir, target=args.target, cost=args.cost, db=args.db,
                             jobs=args.jobs, input_shapes=input_shapes(args), input_values=input_values(args),
                             progress=_callbacks(progress, task), precision=args.precision,
                             cuda_graph=False if args.no_cuda_graph else None)
        if optimized.executable is None:
            raise KorchError(f"korch bench runs on the target's device; no {optimized.plan.target} here")
        executable = optimized.executable
        result = bench.bench(executable, model=args.model, reference_model=optimized.reference,
                             peers=peers, target=executable.manifest["target"], budget_s=args.budget,
                             on_system=lambda n: progress.update(task, description=f"time {n}"), plan=optimized.plan)
    _print_bench(result)
    if args.json:
        bench.write_json(result, args.json)
        print(f"wrote {args.json}")
    from korch.report.html_page import write_html_report

    write_html_report(outdir, optimized.graph, optimized.plan, benchmark=result.ratios(), executable=executable.manifest)
    print(f"benchmark ratios added to {Path(outdir) / 'report.html'}")
    return 0


def _print_bench(result) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result.model} on {result.device} ({result.target}, precision {result.precision})")
    for column in ("system", "median ms", "min ms", "runs", "korch speedup"):
        table.add_column(column, justify="left" if column == "system" else "right")
    k = result.korch
    table.add_row("korch", f"{k.median_s * 1e3:.3f}", f"{k.min_s * 1e3:.3f}", str(k.runs), "1.00x")
    # a peer on another device (ONNX Runtime's CPU provider beside a GPU) is shown apart, below a rule
    elsewhere = [p for p in result.peers if p.note == "CPU provider"]
    for p in [p for p in result.peers if p not in elsewhere] + elsewhere:
        if elsewhere and p is elsewhere[0]:
            table.add_section()
        table.add_row(f"{p.name} {p.note}".strip(), f"{p.median_s * 1e3:.3f}", f"{p.min_s * 1e3:.3f}", str(p.runs),
                      f"{p.median_s / k.median_s:.2f}x")
    Console().print(table)
    if result.predicted_s is not None:
        from korch.report.markdown import predicted_against_measured

        print(f"korch's plan predicted {result.predicted_s * 1e3:.3f} ms, "
              + predicted_against_measured(result.cost_model, result.predicted_s, k.median_s))
    for name, why in result.failed.items():
        print(f"korch: warning: peer {name} failed: {why}", file=sys.stderr)


def cmd_zoo(args) -> int:
    from korch import zoo

    if args.zoo_command == "list":
        width = max(len(m.name) for m in zoo.list_models())
        for m in zoo.list_models():
            shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in m.input_shapes.items())
            print(f"{m.name:{width}} {shapes:28} {m.description}")
        return 0
    path = zoo.export(args.name, args.output)
    print(f"wrote {path}")
    return 0


def cmd_db(args) -> int:
    from korch.backends.db import ProfileDB

    db = ProfileDB(args.db)
    if not db.path.exists():
        print(f"profile database {db.path}: empty (no file yet)")
        return 0
    if args.db_command == "check":
        return _db_check(args)
    if args.db_command == "clear":
        deleted = db.clear(device=args.device)
        print(f"deleted {deleted} records{f' of device {args.device}' if args.device else ''} from {db.path}")
        return 0
    from rich.console import Console
    from rich.table import Table

    stats = db.stats()
    console = Console()
    size = stats["file_bytes"]
    console.print(f"[bold]{db.path}[/bold]  {stats['rows']} records ({stats['ok']} ok, {stats['failed']} failed)  "
                  + (f"{size / 2**20:.2f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"), soft_wrap=True)
    if stats["rows"]:
        table = Table()
        for column in ("device", "backend", "records", "ok", "failed"):
            table.add_column(column, justify="left" if column in ("device", "backend") else "right")
        for group in stats["by_device_backend"]:
            table.add_row(group["device"], group["backend"], str(group["rows"]), str(group["ok"]),
                          str(group["failed"]))
        console.print(table)
    return 0


def _optimize_dynamic(args) -> int:
    from korch.dynamic import optimize_dynamic
    from korch.frontend.inputs import parse_dynamic

    dynamic = parse_dynamic(args.dynamic)
    refused = [flag for flag, given in (("--plan-only", args.plan_only), ("--kernel-by-kernel", args.kernel_by_kernel),
                                        ("--check-inputs", args.check_inputs)) if given]
    if refused:
        raise KorchError(f"--dynamic builds and checks one compiled unit per range of sizes: {refused[0]} does not "
                         "apply to it")
    with _progress(args.quiet) as progress:
        task = progress.add_task("starting", total=None)
        result = optimize_dynamic(
            args.model, dynamic, output=args.output, target=args.target, input_shapes=input_shapes(args),
            input_values=input_values(args), tolerance=args.tolerance, progress=_callbacks(progress, task),
            cost=args.cost, db=args.db, jobs=args.jobs, time_limit=args.time_limit, cut_points=args.cut_points,
            max_kernel_nodes=args.max_kernel_nodes, precision=args.precision)
    dim, low, high = dynamic
    for bucket in result.manifest["buckets"]:
        ends = " and ".join(sorted({str(bucket["low"]), str(bucket["high"])}, key=int))
        print(f"{dim}={bucket['low']}..{bucket['high']}: {bucket['kernels']} kernels, predicted "
              f"{bucket['predicted_ms']:.3f} ms at {dim}={bucket['high']}, max rel error "
              f"{bucket['check']['max_rel']:.3g} at {dim}={ends}")
    print(f"wrote {args.output}: one executable for {dim}={low}..{high} in {len(result.manifest['buckets'])} "
          f"compiled units, each matching ONNX Runtime; run it with: korch run {args.output} --dim {dim}=SIZE")
    return 0


def _db_check(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from korch.dbcheck import check_floors
    from korch.pipeline import detect_target

    result = check_floors(args.model, target=args.target or detect_target(), db=args.db,
                          input_shapes=input_shapes(args))
    console = Console()
    console.print(f"{result.records} measured kernels of {result.signatures} distinct candidate kernels "
                  f"({result.candidates} candidates) on {result.device}: "
                  + (f"[bold red]{len(result.below)} faster than their floor[/bold red]" if result.below
                     else "none faster than its floor"), soft_wrap=True)
    if result.below:
        table = Table()
        for column in ("signature", "ops", "backend", "measured µs", "floor µs", "measured / floor"):
            table.add_column(column, justify="left" if column in ("signature", "ops", "backend") else "right")
        for b in result.below:
            table.add_row(b.signature[:12], b.ops[:60], b.backend, f"{b.measured_s * 1e6:.2f}",
                          f"{b.floor_s * 1e6:.2f}", f"{b.measured_s / b.floor_s:.2f}")
        console.print(table)
    return 1 if result.below else 0


def build_parser() -> argparse.ArgumentParser:
    from korch.version import __version__

    parser = argparse.ArgumentParser(prog="korch", description="Optimal kernel orchestration for tensor programs.")
    parser.add_argument("--version", action="version", version=f"korch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p):
        p.add_argument("model", help="an ONNX file, or zoo:NAME for a bundled model")
        p.add_argument("--input-shape", action="append", metavar="NAME=1x3x224x224",
                       help="static shape for a graph input with symbolic dimensions (repeatable)")
        p.add_argument("--dim", action="append", metavar="NAME=SIZE",
                       help="size of every input dimension the model calls NAME, such as seq=128 (repeatable)")
        p.add_argument("--input-value", action="append", metavar="NAME=VALUE",
                       help="a value for an input that steers the model (an If on a sample rate), used where "
                            "shapes are probed and in the check; NAME=N1,N2,... for several (repeatable)")

    p = sub.add_parser("inspect", help="operator and primitive histograms, opaque operators, bytes and FLOPs")
    model_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(run=cmd_inspect)

    p = sub.add_parser("fission", help="write the primitive graph as an ONNX model")
    model_args(p)
    p.add_argument("output", help="where to write the primitive graph (.onnx)")
    p.add_argument("--ir", metavar="OUT.json", help="also write korch's JSON form of the graph")
    p.set_defaults(run=cmd_fission)

    def tolerance_arg(p):
        p.add_argument("--tolerance", type=float, metavar="REL",
                       help="relative-norm tolerance of the check against ONNX Runtime (default: 2e-3 for fp32, "
                            "5e-2 for tf32; widened per output to twice ONNX Runtime's own spread)")

    def plan_args(p):
        p.add_argument("--target", help="cpu, h100, h200, a100 or v100 (default: the GPU present, else cpu)")
        p.add_argument("--cost", default="measured",
                       help="measured (kernels built, checked and timed; default) or roofline (lower bounds, fast)")
        p.add_argument("--db", type=Path, metavar="PATH",
                       help="profile database of measured kernels (default: profile.sqlite in the korch cache)")
        p.add_argument("--jobs", type=int, metavar="N",
                       help="processes compiling kernels in parallel (default: cores, at most 8)")
        p.add_argument("--precision", choices=("fp32", "tf32"),
                       help="how a GPU computes float32 products, korch's kernels, the libraries and the peers "
                            "alike: fp32 (exact; default) or tf32 (tensor cores, operands rounded to TF32)")
        p.add_argument("--no-cuda-graph", action="store_true",
                       help="on a GPU, launch the kernels one at a time instead of replaying a CUDA graph")
        p.add_argument("-q", "--quiet", action="store_true", help="no progress display")

    p = sub.add_parser("optimize", help="choose the optimal kernels and write the executable to OUTDIR")
    model_args(p)
    p.add_argument("-o", "--output", type=Path, metavar="OUTDIR", help="where to write the executable (required)")
    plan_args(p)
    p.add_argument("--estimate", action="store_true",
                   help="for a GPU target: count the compiles and timings a measured search would run and estimate "
                        "its minutes on --jobs cores (default 16) from compile times measured here; writes nothing")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="seconds for the search: the solves and, with --cost measured, the measuring; past it, the "
                        "cheapest plan so far, with its gap to the optimum (default: none)")
    p.add_argument("--measure-ahead", type=int, metavar="N",
                   help="with --cost measured, candidate kernels each round may measure beside its plan's, those "
                        "still in reach of a cheaper plan: fewer rounds, more kernels measured (default "
                        f"{config.measure_ahead}; 0: only what each round's plan selects)")
    p.add_argument("--cut-points", metavar="FILE.toml", help="the Korch paper's cut points instead of automatic ones")
    p.add_argument("--max-kernel-nodes", type=int, metavar="N", help="largest candidate kernel, in primitives")
    p.add_argument("--plan-only", action="store_true", help="write the plan and the reports, no executable")
    p.add_argument("--kernel-by-kernel", action="store_true",
                   help="on a CPU, run the kernels one call at a time instead of compiling the plan into one unit")
    p.add_argument("--unit-boundaries", choices=config.UNIT_BOUNDARIES,
                   help="on a CPU, how the compiled unit stores the values a convolution reads between kernels "
                        "(default: measured, the faster of both)")
    p.add_argument("--blocked-convolutions", choices=config.BLOCKED_CONVOLUTIONS,
                   help="on a CPU, whether the compiled unit runs its convolutions in ONNX Runtime's blocked layout, "
                        "keeping their values blocked between kernels (default: measured, the faster of both)")
    p.add_argument("--no-layouts", action="store_true",
                   help="on a CPU with measured costs, store every value contiguous instead of choosing each "
                        "value's layout with the kernels")
    p.add_argument("--check-inputs", type=Path, metavar="FILE.npz",
                   help="inputs (by name) for the check against ONNX Runtime; others are seeded random")
    p.add_argument("--dynamic", metavar="NAME=LOW..HIGH",
                   help="one executable serving every size of the input dimension NAME from LOW to HIGH "
                        "(a compiled unit per power-of-two bucket; CPU targets), such as seq=1..512")
    tolerance_arg(p)
    p.set_defaults(run=cmd_optimize)

    p = sub.add_parser("run", help="run an executable written by korch optimize (and check it with --check)")
    p.add_argument("outdir", type=Path, metavar="OUTDIR")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="an input array (repeatable); inputs not given are seeded random")
    p.add_argument("--inputs", type=Path, metavar="FILE.npz", help="input arrays by name, in one .npz file")
    p.add_argument("--dim", action="append", metavar="NAME=SIZE",
                   help="for an executable built with --dynamic: the size to run (and check) at")
    p.add_argument("--check", action="store_true",
                   help="compare with ONNX Runtime on the original model; exit 1 on a mismatch")
    tolerance_arg(p)
    p.add_argument("--allow-unchecked", action="store_true",
                   help="run an executable that did not match ONNX Runtime when it was built")
    p.add_argument("--save-outputs", type=Path, metavar="DIR", help="write each output to DIR/NAME.npy")
    p.add_argument("--target", help="fail unless the executable was built for this target")
    p.set_defaults(run=cmd_run)

    p = sub.add_parser("bench", help="time korch against eager PyTorch, torch.compile and ONNX Runtime")
    model_args(p)
    plan_args(p)
    p.add_argument("--against", default="eager,compile,ort", metavar="PEERS",
                   help="comma-separated: eager, eager-cuda-graph (GPU), compile, compile-reduce-overhead, "
                        "compile-max-autotune, ort (default: eager,compile,ort)")
    p.add_argument("-o", "--output", type=Path, metavar="OUTDIR",
                   help="where to write korch's executable (default: under the korch cache)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    p.add_argument("--budget", type=float, default=2.0, metavar="S", help="seconds of timed runs per system")
    p.set_defaults(run=cmd_bench)

    p = sub.add_parser("zoo", help="the bundled benchmark models")
    zsub = p.add_subparsers(dest="zoo_command", required=True)
    zsub.add_parser("list", help="list the models")
    e = zsub.add_parser("export", help="export a model to ONNX")
    e.add_argument("name")
    e.add_argument("output")
    p.set_defaults(run=cmd_zoo)

    p = sub.add_parser("db", help="the profile database of measured kernels")
    dsub = p.add_subparsers(dest="db_command", required=True)
    db_path_help = "the database file (default: profile.sqlite in the korch cache directory)"
    d = dsub.add_parser("stats", help="records by device and backend, ok and failed, file size")
    d.add_argument("--db", type=Path, metavar="PATH", help=db_path_help)
    d = dsub.add_parser("check", help="every measured kernel of MODEL against its floor; exit 1 if one beats it")
    model_args(d)
    d.add_argument("--target", help="cpu, h100, h200, a100 or v100 (default: the GPU present, else cpu)")
    d.add_argument("--db", type=Path, metavar="PATH", help=db_path_help)
    d = dsub.add_parser("clear", help="delete records (all, or one device's)")
    d.add_argument("--db", type=Path, metavar="PATH", help=db_path_help)
    d.add_argument("--device", metavar="NAME", help="delete only this device's records")
    p.set_defaults(run=cmd_db)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"korch: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.showwarning = _one_line_warning
    try:
        return args.run(args)
    except KorchError as exc:
        print(f"korch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("korch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
