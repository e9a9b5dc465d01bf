"""The executable acceptance run: ``korch optimize`` then ``korch run --check`` for every zoo model (the
``transformers`` architectures included) and the nine ``onnx`` light models, through the command line.

Writes ``benchmarks/results/run_check_<target>_<cost>.md`` (and .json): per model, exit codes, the max
errors printed by ``korch run --check``, kernels, and the seconds each command took.

    python benchmarks/run_check_all.py --target cpu --cost roofline
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def models() -> list[str]:
    import onnx.backend.test

    sys.path.insert(0, str(ROOT / "src"))
    from korch import zoo

    light = sorted(glob.glob(os.path.join(os.path.dirname(onnx.backend.test.__file__), "data", "light", "*.onnx")))
    return [f"zoo:{m.name}" for m in zoo.list_models()] + light


def korch(*args: str) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "korch", *args], capture_output=True, text=True, env=env)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--cost", default="roofline")
    parser.add_argument("--models", help="comma-separated subset (zoo:NAME or light model file names)")
    args = parser.parse_args()
    chosen = models()
    if args.models:
        wanted = args.models.split(",")
        chosen = [m for m in chosen if m in wanted or os.path.basename(m) in wanted]
    rows = []
    for model in chosen:
        name = model.removeprefix("zoo:") if model.startswith("zoo:") else os.path.basename(model)
        with tempfile.TemporaryDirectory(prefix="korch-check-") as tmp:
            out = os.path.join(tmp, "out")
            rc_opt, log_opt, s_opt = korch("optimize", model, "-o", out, "--target", args.target, "--cost",
                                           args.cost, "-q")
            rc_run, log_run, s_run = korch("run", out, "--check") if rc_opt == 0 else (None, "", 0.0)
        kernels = re.search(r"-> (\d+) kernels", log_opt)
        errors = re.search(r"max abs error (\S+), max rel error (\S+) over", log_run)
        row = {"model": name, "optimize_rc": rc_opt, "run_check_rc": rc_run, "optimize_s": round(s_opt, 1),
               "run_s": round(s_run, 1), "kernels": int(kernels.group(1)) if kernels else None,
               "max_abs": errors.group(1) if errors else None, "max_rel": errors.group(2) if errors else None,
               "log": (log_opt + log_run)[-600:] if rc_opt or rc_run else "",
               "date": datetime.date.today().isoformat()}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "log"}), flush=True)
    results = ROOT / "benchmarks" / "results"
    stem = f"run_check_{args.target}_{args.cost}"
    earlier = results / f"{stem}.json"
    if args.models and earlier.exists():  # a subset run replaces its models' rows, keeps the others
        names = [r["model"] for r in rows]
        kept = [r for r in json.loads(earlier.read_text()) if r["model"] not in names]
        order = {m.removeprefix("zoo:") if m.startswith("zoo:") else os.path.basename(m): i
                 for i, m in enumerate(models())}
        rows = sorted(kept + rows, key=lambda r: order.get(r["model"], 99))
    import torch

    command = " ".join(sys.argv[1:]) if not args.models else f"--target {args.target} --cost {args.cost}"
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    lines = [f"# `korch optimize --target {args.target} --cost {args.cost}` then `korch run --check`", "",
             f"- date {datetime.date.today().isoformat()}, machine: {machine}",
             f"- command: `python benchmarks/run_check_all.py {command}`",
             f"- passed: **{sum(r['optimize_rc'] == 0 and r['run_check_rc'] == 0 for r in rows)} of {len(rows)}**",
             "- a run with `--models` replaces those rows and keeps the others (each row's date says when it ran)",
             "", "| model | optimize exit | run --check exit | kernels | max abs err | max rel err | optimize s "
             "| run s | date |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['model']} | {r['optimize_rc']} | {r['run_check_rc']} | {r['kernels']} | {r['max_abs']} | "
              f"{r['max_rel']} | {r['optimize_s']} | {r['run_s']} | {r.get('date', '')} |" for r in rows]
    sys.path.insert(0, str(ROOT / "src"))
    from korch.fsutil import atomic_write_bytes

    atomic_write_bytes(results / f"{stem}.md", ("\n".join(lines) + "\n").encode())
    atomic_write_bytes(results / f"{stem}.json", json.dumps(rows, indent=1).encode())
    print(f"wrote {results / stem}.md")
    return 0 if all(r["optimize_rc"] == 0 and r["run_check_rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
