"""The readable report of an optimize run: what was enumerated, solved and chosen, as Markdown."""

from __future__ import annotations

from collections import Counter

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
             f"- measurements below their lower bound (raised to it): {m['below_bound']}",
             f"- kernels that failed to build or check (dropped, never selected): **{len(m['failures'])}**"]
    if m["failures"]:
        lines += ["", "| signature | ops | backend | status | reason |", "| --- | --- | --- | --- | --- |",
                  *(f"| `{f['signature'][:12]}` | {f['ops']} | {f['backend']} | {f['status']} | "
                    f"{f['message'].replace('|', '/')} |" for f in m["failures"])]
    return lines


def render_markdown(plan: Plan, rejected: dict[str, int] | None = None) -> str:
    stats = plan.stats
    lines = [
        f"# korch plan: {plan.model}",
        "",
        f"- target **{plan.target}**, cost model **{plan.cost_model}**",
        f"- primitive nodes **{stats.get('primitive_nodes', '?')}**, candidate kernels "
        f"**{stats.get('candidates', '?')}**, segments **{len(plan.segments)}**",
        f"- kernels chosen **{len(plan.kernels)}**, predicted latency **{_us(plan.predicted_latency_s)}** "
        f"({sum(k.measured for k in plan.kernels)} measured, {sum(not k.measured for k in plan.kernels)} bounded)",
        f"- proven optimal: **{'yes' if all(s.optimal for s in plan.segments) else 'no'}**"
        + ("" if all(s.exact for s in plan.segments) else
           f"; {sum(s.dropped for s in plan.segments)} candidates dropped at inexact segment cuts"),
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
        "| kernel | ops | primitives | outputs | cost | bound | measured | backend | launches |",
        "| --- | --- | ---: | --- | ---: | ---: | --- | --- | ---: |",
        *(f"| {k.name} | {k.ops} | {len(k.nodes)} | {', '.join(k.outputs)} | {_us(k.cost_s)} | {_us(k.bound_s)} "
          f"| {k.measured} | {k.backend or '-'} | {k.launches} |" for k in plan.kernels),
    ]
    lines += _measurement(stats.get("measurement"))
    if rejected:
        lines += ["", "## Subgraphs rejected as kernels", "", "| reason | count |", "| --- | ---: |",
                  *(f"| {why} | {n} |" for why, n in sorted(rejected.items(), key=lambda kv: -kv[1]))]
    redundant = Counter(n for k in plan.kernels for n in k.nodes)
    recomputed = sum(1 for c in redundant.values() if c > 1)
    lines += ["", f"Primitives computed by more than one kernel (redundant computation): {recomputed}", ""]
    return "\n".join(lines)
