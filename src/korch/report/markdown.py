"""The readable report of an optimize run: what was enumerated, solved and chosen, as Markdown."""

from __future__ import annotations

from collections import Counter

from korch.ir.graph import CONTIGUOUS
from korch.orchestrate.plan import Plan


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def _measurement(m: dict | None) -> list[str]:
    if not m:
        return []
    versions = ", ".join(f"{b} {v}" for b, v in m["backends"].items())
    lines = ["", "## Measurement", "",
             f"- device **{m['device']}**, backends {versions}",
             f"- candidates measured: **{m['signatures_asked']}** distinct kernels of "
             f"{m.get('candidates', '?')} candidates ({m['from_database']} answered by the profile database); "
             f"**{m['kernels_measured']}** kernel builds checked and timed in this run",
             f"- search cost: {m.get('measured_share', 0):.0%} of the {m.get('signatures', '?')} distinct candidate "
             f"kernels measured or looked up"
             + (f" (each round up to {m['measure_ahead']} more than its plan's, those still in reach of a cheaper "
                "plan)" if m.get("measure_ahead") else "")
             + f"; {m.get('build_s', 0):.1f} s building and checking, "
             f"{m.get('timing_s', 0):.1f} s timing"
             + (f"; {m['solves']} solves of the program ({m['proofs']} of them branch and cut) took "
                f"{m['solve_s']:.1f} s" if "solves" in m else "")
             + (f"; {m['dominated']} candidates left out of the last, measured kernels replacing them at no more "
                "cost" if m.get("dominated") else ""),
             *([f"- priced in place: {in_place_summary(m['in_place'])}"] if "in_place" in m else []),
             f"- measurements below their lower bound (raised to it): {m['below_bound']}",
             f"- kernels timed while other processes held the CPU cores (may read slow): {m.get('disturbed', 0)}",
             *([f"- kernels timed inside a replayed CUDA graph: {m['timed_in_graph']} of {m['kernels_measured']} "
                "(the others could not be captured, and were timed as launched)"]
               if "timed_in_graph" in m and not str(m.get("device", "")).startswith("cpu") else []),
             f"- kernels that failed to build or check (dropped, never selected): **{len(m['failures'])}**"]
    if m["failures"]:
        lines += ["", "| signature | ops | backend | status | reason |", "| --- | --- | --- | --- | --- |",
                  *(f"| `{f['signature'][:12]}` | {f['ops']} | {f['backend']} | {f['status']} | "
                    f"{f['message'].replace('|', '/')} |" for f in m["failures"])]
    return lines


def in_place_summary(p: dict) -> str:
    """What pricing the optimum's kernels in sequence took (``backends/in_place.py``)."""
    return (f"{p['planned_kernels']} planned kernels at their times in sequence; "
            + (f"{p['from_database']} prices from earlier searches, " if p.get("from_database") else "")
            + f"{p['sequences']} sequences run, "
            f"{p['kernels_timed']} kernel timings, {p.get('kernels_built', '?')} kernels built here; "
            f"{p['seconds']:.1f} s ({p.get('build_s', 0):.1f} s building)"
            + (f"; a sequence failed, the rest priced alone: {p['failure']}" if p.get("failure") else ""))


def _executable(x: dict | None) -> list[str]:
    if not x:
        return []
    backends = Counter(k["backend"] for k in x.get("kernels", []))
    memory = x.get("memory", {})
    lines = ["", "## Executable", "",
             f"- kernels by backend: {', '.join(f'{b} {n}' for b, n in backends.most_common())}",
             f"- planned memory: **{memory.get('peak_bytes', 0) / 2**20:.2f} MiB** in {memory.get('buffers', 0)} "
             f"buffers for {memory.get('planned_tensors', 0)} tensors written in place "
             f"(one buffer each: {memory.get('naive_bytes', 0) / 2**20:.2f} MiB)",
             f"- CUDA graph: {'yes' if x.get('cuda_graph') and x.get('device') == 'cuda' else 'no'}",
             f"- precision: {x.get('precision', 'fp32')} (float32 products; `--precision`)"]
    if x.get("runs") == "compiled unit":
        lines.append("- runs as **one compiled unit** (the whole plan in one AOTInductor package, `model.pt2`: "
                     "no Python between kernels; Inductor plans its buffers)")
        measured = x.get("unit", {}).get("measured_ms")
        if measured:
            boundaries = x["unit"].get("boundaries")
            layout = f"; values a convolution reads stored {boundaries} between kernels" if boundaries else ""
            pointwise = x["unit"].get("pointwise convolutions")
            if pointwise:
                layout += "; 1x1 convolutions " + {
                    "products": "as products", "library": "by the library",
                    "as planned": "as products, by the library where the plan measured so"}.get(pointwise, pointwise)
            activations = x["unit"].get("products of activations")  # runtime/unit.py's ACTIVATIONS
            if activations:
                layout += f"; products of activations and softmaxes in {activations}"
            lines.append(f"- the unit's weights: {x['unit']['weights']}{layout}; the fastest as measured ("
                         + ", ".join(f"{name} {ms:.3g} ms" for name, ms in measured.items()) + ")")
        for name, why in x.get("unit", {}).get("failed", {}).items():
            lines.append(f"- the unit's variant {name!r} failed to compile: {why}")
    elif x.get("runs"):
        lines.append(f"- runs kernel by kernel: no compiled unit ({x.get('unit', {}).get('why_not', '')})")
    check = x.get("check")
    if check:
        lines.append(f"- vs ONNX Runtime: **{'matches' if check['ok'] else 'DOES NOT match'}**, max abs error "
                     f"{check['max_abs']:.3g}, max rel error {check['max_rel']:.3g} "
                     f"(tolerance: relative norm {check['tolerance']:g})")
    refused = [(k["name"], r) for k in x.get("kernels", []) for r in k.get("refused", [])]
    if refused:
        lines += ["", "| kernel | backend that failed it |", "| --- | --- |",
                  *(f"| {name} | {why.replace('|', '/')} |" for name, why in refused)]
    return lines


def unit_seconds(executable: dict | None) -> float | None:
    """What the executable's compiled unit took a call when it was built (the variant it runs), if it was timed."""
    unit = (executable or {}).get("unit", {})
    measured_ms = unit.get("measured_ms", {}).get(unit.get("variant", unit.get("weights")))
    return measured_ms / 1e3 if measured_ms else None


def predicted_against_measured(cost_model: str, predicted_s: float, measured_s: float | None) -> str:
    """A plan's predicted latency set against what its executable runs in: with roofline costs it is a floor;
    with measured costs it is the objective, which should come within 15% of the run."""
    runs = f"{_us(measured_s)} the executable runs in" if measured_s else ""
    if cost_model != "measured":
        return "a floor (roofline costs: each kernel bounded from below, none timed)" + (
            f", under the {runs}" if runs else "")
    return f"against the {runs}: predicted / measured {predicted_s / measured_s:.2f}" if runs else ""


def challenge_summary(record: dict) -> str:
    """Which plan an unproven measured search kept, and why (``plan_challenge.py``): one sentence."""
    if "failed" in record:
        return f"plan challenge: the floors' plan's unit failed ({record['failed']}): the measured plan is kept"
    ours, floors = record["measured plan ms"], record["floors' plan ms"]
    kept = "the floors' plan is kept (its costs are floors)" if record["kept"] == "floors'" else \
        "the measured plan is kept"
    return f"plan challenge: the measured search's unproven plan ran its unit in {ours} ms, the floors' plan in " \
        f"{floors} ms: {kept}"


def proven(plan: Plan) -> bool:
    """Whether ``plan`` is proven optimal for the costs its search measured: a kept floors' plan is not."""
    challenge = plan.stats.get("plan challenge")
    return all(s.optimal for s in plan.segments) and not (challenge and challenge["kept"] == "floors'")


def render_markdown(plan: Plan, rejected: dict[str, int] | None = None, executable: dict | None = None) -> str:
    stats = plan.stats
    versus = predicted_against_measured(plan.cost_model, plan.predicted_latency_s, unit_seconds(executable))
    lines = [
        f"# korch plan: {plan.model}",
        "",
        f"- target **{plan.target}**, cost model **{plan.cost_model}**",
        f"- primitive nodes **{stats.get('primitive_nodes', '?')}**, candidate kernels "
        f"**{stats.get('candidates', '?')}**, segments **{len(plan.segments)}**",
        f"- kernels chosen **{len(plan.kernels)}**, predicted latency **{_us(plan.predicted_latency_s)}** "
        f"({sum(k.measured for k in plan.kernels)} measured, {sum(not k.measured for k in plan.kernels)} bounded)"
        + (f"; {versus}" if versus else ""),
        f"- proven optimal: **{'yes' if proven(plan) else 'no'}**"
        + ("" if all(s.exact for s in plan.segments) else
           f"; {sum(s.dropped for s in plan.segments)} candidates dropped at inexact segment cuts"),
        *([f"- {challenge_summary(stats['plan challenge'])}"] if "plan challenge" in stats else []),
        *(["", "## Graph rewrites", "", *(f"- {line}" for line in stats["rewrites"])] if "rewrites" in stats else []),
        "",
        "## Stages",
        "",
        "| stage | seconds |",
        "| --- | ---: |",
        *(f"| {name} | {sec:.2f} |" for name, sec in stats.get("stage_seconds", {}).items()),
        "",
        "## Segments",
        "",
        "| # | nodes | candidates | exact | dropped | kernels | objective | solver s | optimal | gap | cycle cuts |",
        "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
        *(f"| {i} | {s.nodes} | {s.candidates} | {s.exact} | {s.dropped} | {s.kernels} | {_us(s.objective_s)} "
          f"| {s.seconds:.2f} | {s.optimal} | {s.gap:.2g} | {s.cycle_cuts} |" for i, s in enumerate(plan.segments)),
        "",
        "## Kernel kinds",
        "",
        "| ops | kernels |",
        "| --- | ---: |",
        *(f"| {ops} | {n} |" for ops, n in Counter(k.ops for k in plan.kernels).most_common()),
        "",
        "## Kernels in execution order",
        "",
        "| kernel | ops | primitives | outputs | cost | bound | measured | backend | launches | layout |",
        "| --- | --- | ---: | --- | ---: | ---: | --- | --- | ---: | --- |",
        *(f"| {k.name} | {k.ops} | {len(k.nodes)} | {', '.join(k.outputs)} | {_us(k.cost_s)} | {_us(k.bound_s)} "
          f"| {k.measured} | {k.backend or '-'} | {k.launches} | {k.layout} |" for k in plan.kernels),
    ]
    if stats.get("layouts") == "chosen":
        lines += ["", f"Layouts chosen by the program: {sum(k.layout != CONTIGUOUS for k in plan.kernels)} kernels "
                      f"channels-last, {len(plan.conversions)} conversions.", ""]
        if plan.conversions:
            lines += ["| value | to | cost | before |", "| --- | --- | ---: | --- |",
                      *(f"| {c.tensor} | {c.to} | {_us(c.cost_s)} | {c.before} |" for c in plan.conversions)]
    lines += _measurement(stats.get("measurement"))
    lines += _executable(executable)
    if rejected:
        lines += ["", "## Subgraphs rejected as kernels", "", "| reason | count |", "| --- | ---: |",
                  *(f"| {why} | {n} |" for why, n in sorted(rejected.items(), key=lambda kv: -kv[1]))]
    redundant = Counter(n for k in plan.kernels for n in k.nodes)
    recomputed = sum(1 for c in redundant.values() if c > 1)
    lines += ["", f"Primitives computed by more than one kernel (redundant computation): {recomputed}", ""]
    return "\n".join(lines)


def render_buckets(manifest: dict) -> str:
    """report.md of an executable serving a range of sizes (``korch optimize --dynamic``): one row per bucket,
    each bucket's own report.md in its directory."""
    sizes = manifest["sizes"]
    verdict = "matches" if manifest["check"]["ok"] else "DOES NOT match"
    lines = [
        f"# korch executable: {manifest['model']}, {sizes['dim']} = {sizes['low']}..{sizes['high']}",
        "",
        f"- target **{manifest['target']}**, {len(manifest['buckets'])} compiled units, one per range of "
        f"{sizes['dim']}; each {verdict} ONNX Runtime at its smallest and largest size "
        f"(max rel error {manifest['check']['max_rel']:.3g})",
        "",
        f"| {sizes['dim']} | kernels | predicted at the largest | unit's weights | max rel error | directory |",
        "| --- | ---: | ---: | --- | ---: | --- |",
        *(f"| {b['low']}..{b['high']} | {b['kernels']} | {_us(b['predicted_ms'] / 1e3)} | {b['unit']} "
          f"| {b['check']['max_rel']:.3g}{'' if b['check']['ok'] else ' FAILED'} | [{b['dir']}]({b['dir']}/report.md) |"
          for b in manifest["buckets"]),
        "",
    ]
    return "\n".join(lines)
