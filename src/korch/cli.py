"""The ``korch`` command line: inspect, fission, optimize, zoo and db.

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

from korch.errors import KorchError


def _input_shapes(specs: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    from korch.frontend import parse_input_shape

    return dict(parse_input_shape(s) for s in specs or ())


def _load(args):
    import onnx

    from korch.summary import load_model, resolve_model

    imported, graph, report = load_model(args.model, _input_shapes(args.input_shape))
    # the operator histogram is of the model as given, before folding (zoo exports are cached: no re-export)
    source = onnx.load(str(resolve_model(args.model)), load_external_data=False)
    return source, imported, graph, report


def cmd_inspect(args) -> int:
    from korch.summary import summarize

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


def cmd_optimize(args) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from korch.fsutil import atomic_write_bytes
    from korch.optimize import optimize
    from korch.orchestrate.report import render_markdown
    from korch.orchestrate.report_html import write_html_report

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  transient=True, disable=args.quiet) as progress:
        task = progress.add_task("starting", total=None)

        def on_stage(name):
            progress.update(task, description=name)

        def on_segment(i, n):
            progress.update(task, description=f"solve: segment {i + 1} of {n}")

        measured = [0]

        def on_kernel(what):
            measured[0] += 1
            progress.update(task, description=f"measure: kernel {measured[0]}: {what[:60]}")

        result = optimize(args.model, target=args.target, cost=args.cost, time_limit=args.time_limit,
                          cut_points=args.cut_points, input_shapes=_input_shapes(args.input_shape),
                          max_kernel_nodes=args.max_kernel_nodes, on_stage=on_stage, on_segment=on_segment,
                          db=args.db, jobs=args.jobs, on_kernel=on_kernel)
    plan = result.plan
    out = args.output
    plan.save(out / "plan.json")
    atomic_write_bytes(out / "report.md", render_markdown(plan, result.rejected).encode())
    write_html_report(out, result.graph, plan)
    optimal = all(s.optimal for s in plan.segments)
    print(f"{plan.model}: {len(result.graph.nodes)} primitives, {result.candidates} candidate kernels, "
          f"{len(plan.segments)} segments -> {len(plan.kernels)} kernels, predicted "
          f"{plan.predicted_latency_s * 1e3:.3f} ms on {plan.target} ({plan.cost_model}"
          f"{', optimal' if optimal else ', NOT proven optimal'}); "
          f"total {sum(result.stage_seconds.values()):.1f} s")
    measurement = plan.stats.get("measurement")
    if measurement:
        print(f"measured {measurement['kernels_measured']} kernels ({measurement['signatures_asked']} distinct "
              f"candidates asked, {measurement['from_database']} answered by the database "
              f"{measurement['device']}); {len(measurement['failures'])} kernels failed and were dropped")
    print(f"wrote {out / 'plan.json'}, {out / 'report.md'} and {out / 'report.html'}")
    return 0


def cmd_zoo(args) -> int:
    from korch import zoo

    if args.zoo_command == "list":
        for m in zoo.list_models():
            shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in m.input_shapes.items())
            print(f"{m.name:14} {shapes:28} {m.description}")
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


def build_parser() -> argparse.ArgumentParser:
    from korch import __version__

    parser = argparse.ArgumentParser(prog="korch", description="Optimal kernel orchestration for tensor programs.")
    parser.add_argument("--version", action="version", version=f"korch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p):
        p.add_argument("model", help="an ONNX file, or zoo:NAME for a bundled model")
        p.add_argument("--input-shape", action="append", metavar="NAME=1x3x224x224",
                       help="static shape for a graph input with symbolic dimensions (repeatable)")

    p = sub.add_parser("inspect", help="operator and primitive histograms, opaque operators, bytes and FLOPs")
    model_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(run=cmd_inspect)

    p = sub.add_parser("fission", help="write the primitive graph as an ONNX model")
    model_args(p)
    p.add_argument("output", help="where to write the primitive graph (.onnx)")
    p.add_argument("--ir", metavar="OUT.json", help="also write korch's JSON form of the graph")
    p.set_defaults(run=cmd_fission)

    p = sub.add_parser("optimize", help="choose the optimal kernels: writes OUTDIR/plan.json and a report")
    model_args(p)
    p.add_argument("-o", "--output", type=Path, required=True, metavar="OUTDIR")
    p.add_argument("--target", default="cpu", help="cpu, h100, h200, a100 or v100 (default: cpu)")
    p.add_argument("--cost", default="roofline", help="roofline (lower bounds) or measured")
    p.add_argument("--time-limit", type=float, metavar="S", help="solver time limit in seconds (default: none)")
    p.add_argument("--cut-points", metavar="FILE.toml", help="the Korch paper's cut points instead of automatic ones")
    p.add_argument("--max-kernel-nodes", type=int, metavar="N", help="largest candidate kernel, in primitives")
    p.add_argument("--db", type=Path, metavar="PATH",
                   help="profile database for --cost measured (default: profile.sqlite in the korch cache directory)")
    p.add_argument("--jobs", type=int, metavar="N", help="processes compiling kernels in parallel (default: cores, at most 8)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.set_defaults(run=cmd_optimize)

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
