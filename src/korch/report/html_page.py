"""The report of an optimize run as ONE self-contained HTML page: numbers, the primitive graph, the kernels.

Owns ``OUTDIR/report.html``. The page needs no network: CSS, JS and the SVG
drawing (``drawing``) are inline. It shows the plan's header numbers (and
the measurement and benchmark numbers when there are some), the primitive
graph with every chosen kernel as a coloured group, the kernels in execution
order (row ``id="kernel-NAME"``, matching the drawing's ``data-kernel="NAME"``)
and the primitives computed by more than one kernel (redundant computation).

The inline script adds zoom, pan and kernel highlighting, records any script
error in ``body[data-errors]`` and ends by setting ``body[data-ready="yes"]``,
so a headless browser's DOM dump shows whether the page came up whole.
"""

from __future__ import annotations

import dataclasses
import html
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from korch.cost.roofline import KernelWork, kernel_work
from korch.fsutil import atomic_write_bytes
from korch.ir.graph import Graph
from korch.ir.ops import Kind, Op
from korch.orchestrate.plan import Plan, PlannedKernel
from korch.report.drawing import kernel_colour, kernels_by_node, render_svg
from korch.report.markdown import challenge_summary, in_place_summary, predicted_against_measured, proven


def _e(value) -> str:
    return html.escape(str(value), quote=True)


# ---------------------------------------------------------------- formatting


def _time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:,.3f} ms"
    return f"{seconds * 1e6:,.1f} µs"


def _scaled(value: float, unit: str, step: int = 1000) -> str:
    """``value`` with a metric prefix (binary prefixes, KiB, MiB, when ``step`` is 1024)."""
    binary = "i" if step == 1024 else ""
    for prefix in ("", "K", "M", "G", "T"):
        if abs(value) < step or prefix == "T":
            return f"{value:,.1f} {prefix}{binary}{unit}" if prefix else f"{value:,.0f} {unit}"
        value /= step
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- what a kernel is


def kernel_class(ops: Sequence[Op]) -> str:
    """The kind of work that dominates a kernel: matmul, conv, window, reduction, elementwise, layout or opaque."""
    kinds = {op.kind for op in ops}
    if Kind.LINEAR in kinds:
        return "matmul" if Op.MATMUL in ops else "conv"
    for kind, name in ((Kind.OPAQUE, "opaque"), (Kind.WINDOW, "window"), (Kind.REDUCE, "reduction"),
                       (Kind.ELEMENTWISE, "elementwise")):
        if kind in kinds:
            return name
    return "layout"


@dataclasses.dataclass(frozen=True)
class _KernelRow:
    kernel: PlannedKernel
    colour: str
    cls: str
    work: KernelWork


def _kernel_rows(graph: Graph, plan: Plan) -> list[_KernelRow]:
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    rows = []
    for number, k in enumerate(plan.kernels):
        nodes = [index[n] for n in k.nodes if n in index]
        work = kernel_work(graph, nodes, k.inputs, k.outputs, fast_convolution=False)  # the FLOPs a direct kernel does
        rows.append(_KernelRow(k, kernel_colour(number), kernel_class([graph.nodes[i].op for i in nodes]), work))
    return rows


# ---------------------------------------------------------------- the page sections


def _table(head: Sequence[str], body: Sequence[Sequence[str]], cls: str = "",
           row_attrs: Sequence[str] | None = None) -> str:
    """A table of already-escaped cells; a head cell starting with '>' is a right-aligned number column."""
    right = [h.startswith(">") for h in head]
    ths = "".join(f'<th class="num">{h[1:]}</th>' if r else f"<th>{h}</th>" for h, r in zip(head, right))
    attrs = row_attrs or [""] * len(body)
    trs = "".join(f"<tr{a}>" + "".join(f'<td class="num">{c}</td>' if r else f"<td>{c}</td>"
                                       for c, r in zip(row, right)) + "</tr>" for row, a in zip(body, attrs))
    return f'<table class="{cls}"><thead><tr>{ths}</tr></thead><tbody>{trs}</tbody></table>'


def _facts(pairs: Sequence[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def _header(graph: Graph, plan: Plan) -> str:
    stats = plan.stats
    optimal = proven(plan)
    dropped = sum(s.dropped for s in plan.segments)
    measured = sum(k.measured for k in plan.kernels)
    floor = predicted_against_measured(plan.cost_model, plan.predicted_latency_s, None)  # none for a measured plan
    facts = [
        ("model", _e(plan.model)), ("target", _e(plan.target)), ("cost model", _e(plan.cost_model)),
        ("primitives", _e(stats.get("primitive_nodes", len(graph.nodes)))),
        ("candidate kernels", _e(stats.get("candidates", "?"))), ("segments", _e(len(plan.segments))),
        ("kernels chosen", _e(len(plan.kernels))),
        ("predicted latency", f"<b>{_e(_time(plan.predicted_latency_s))}</b>" + (f", {_e(floor)}" if floor else "")),
        ("kernel costs", f"{measured} measured, {len(plan.kernels) - measured} bounded"),
        ("proven optimal", ("yes" if optimal else '<span class="bad">no</span>')
         + (f"; {dropped} candidates dropped at inexact segment cuts" if dropped else "")),
        *((("plan challenge", _e(challenge_summary(stats["plan challenge"]).split(": ", 1)[1])),)
          if "plan challenge" in stats else ()),
        *(("graph rewrite", _e(line)) for line in stats.get("rewrites", ())),
    ]
    stages = stats.get("stage_seconds", {})
    stage_table = _table(["stage", ">seconds"], [(_e(n), f"{s:.2f}") for n, s in stages.items()]
                         + [("<b>total</b>", f"<b>{sum(stages.values()):.2f}</b>")]) if stages else ""
    return f'<section id="summary"><h2>Summary</h2><div class="row">{_facts(facts)}{stage_table}</div></section>'


def _measurement(m: dict | None) -> str:
    if not m:
        return ""
    versions = ", ".join(f"{b} {v}" for b, v in m.get("backends", {}).items())
    facts = [("device", _e(m.get("device", "?"))), ("backends", _e(versions or "-")),
             ("candidates measured", (f"<b>{_e(m.get('signatures_asked', '?'))}</b> distinct kernels of "
                                      f"{_e(m.get('candidates', '?'))} candidates "
                                      f"({_e(m.get('from_database', 0))} from the profile database)")),
             ("builds checked and timed", _e(m.get("kernels_measured", "?"))),
             ("search cost", _e(f"{m.get('measured_share', 0):.0%} of {m.get('signatures', '?')} distinct kernels; "
                                f"{m.get('build_s', 0):.1f} s building, {m.get('timing_s', 0):.1f} s timing")),
             *([("priced in place", _e(in_place_summary(m["in_place"])))] if "in_place" in m else []),
             ("below their bound (raised)", _e(m.get("below_bound", 0))),
             ("timed beside other processes (may read slow)", _e(m.get("disturbed", 0))),
             ("failed kernels (dropped)", f"<b>{len(m.get('failures', []))}</b>")]
    failures = m.get("failures", [])
    table = _table(["signature", "ops", "backend", "status", "reason"],
                   [(f"<code>{_e(f['signature'][:12])}</code>", _e(f["ops"]), _e(f["backend"]), _e(f["status"]),
                     _e(f["message"])) for f in failures], "failures") if failures else ""
    return f'<section id="measurement"><h2>Measurement</h2>{_facts(facts)}{table}</section>'


def _executable(x: dict | None) -> str:
    """The executable's section: backends, planned memory, CUDA graph and the check against ONNX Runtime."""
    if not x:
        return ""
    backends = Counter(k["backend"] for k in x.get("kernels", []))
    memory, check = x.get("memory", {}), x.get("check")
    facts = [("kernels by backend", _e(", ".join(f"{b} {n}" for b, n in backends.most_common()) or "-")),
             ("planned memory", f"<b>{_e(_scaled(memory.get('peak_bytes', 0), 'B', 1024))}</b> in "
                                f"{_e(memory.get('buffers', 0))} buffers for {_e(memory.get('planned_tensors', 0))} "
                                f"tensors (one buffer each: {_e(_scaled(memory.get('naive_bytes', 0), 'B', 1024))})"),
             ("CUDA graph", "yes" if x.get("cuda_graph") and x.get("device") == "cuda" else "no")]
    if check:
        verdict = "matches" if check["ok"] else '<span class="bad">DOES NOT match</span>'
        facts.append(("vs ONNX Runtime", f'<span id="check">{verdict}</span>: max abs error '
                                         f"{check['max_abs']:.3g}, max rel error {check['max_rel']:.3g}"))
    return f'<section id="executable"><h2>Executable</h2>{_facts(facts)}</section>'


def _benchmark(plan: Plan, benchmark: dict | None) -> str:
    if not benchmark or "korch_s" not in benchmark:
        return ""
    korch_s = float(benchmark["korch_s"])
    predicted = plan.predicted_latency_s
    line = (f'<p id="predicted-vs-measured">predicted total <b>{_e(_time(predicted))}</b>, '
            f'{_e(predicted_against_measured(plan.cost_model, predicted, korch_s))}</p>'
            if predicted > 0 else f"<p>measured total <b>{_e(_time(korch_s))}</b></p>")
    peers = benchmark.get("peers", {})
    table = _table(["system", ">latency", ">korch speedup"],
                   [("<b>korch</b>", _e(_time(korch_s)), "1.00×")]
                   + [(_e(name), _e(_time(s)), f"{s / korch_s:.2f}×") for name, s in peers.items()],
                   "speedups") if peers and korch_s > 0 else ""
    return f'<section id="benchmark"><h2>Benchmark</h2>{line}{table}</section>'


def _redundant(graph: Graph, plan: Plan) -> str:
    ops = {node.name: node.op.value for node in graph.nodes}
    shared = [(n, ks) for n, ks in kernels_by_node(plan).items() if len(ks) > 1]
    body = [(f"<code>{_e(n)}</code>", _e(ops.get(n, "?")), _e(len(ks)),
             " ".join(f'<a href="#kernel-{_e(k)}">{_e(k)}</a>' for k in ks)) for n, ks in shared]
    table = _table(["primitive", "op", ">kernels", "computed by"], body, "redundant") if shared else ""
    return (f'<section id="redundant"><h2>Redundant computation</h2><p>{len(shared)} primitives are computed by '
            f"more than one kernel (drawn striped, with a count badge).</p>{table}</section>")


def _kernel_cells(r: _KernelRow) -> list[str]:
    k, w = r.kernel, r.work
    tag = "measured" if k.measured else "bound"
    return [f'<span class="swatch" style="background:{r.colour}"></span>', f"<b>{_e(k.name)}</b>",
            _e(k.ops), _e(len(k.nodes)), _e(r.cls), _e(k.backend or "-"), _e(k.layout.replace("_", "-")),
            f'{_e(_time(k.cost_s))} <span class="tag {tag}">{tag}</span>', _e(_time(k.bound_s)),
            (f'<span title="read {w.bytes_read:,} B, written {w.bytes_written:,} B">'
             f'{_e(_scaled(w.bytes_moved, "B", 1024))}</span>'),
            (f'<span title="vector {w.vector_flops:,}, matrix {w.matrix_flops:,}">'
             f'{_e(_scaled(w.vector_flops + w.matrix_flops, "FLOP"))}</span>'), _e(k.launches)]


def _kernel_table(rows: list[_KernelRow]) -> str:
    head = ["", "kernel", "ops", ">primitives", "class", "backend", "layout", ">latency", ">bound", ">bytes moved",
            ">FLOPs", ">launches"]
    attrs = [f' id="kernel-{_e(r.kernel.name)}" data-kernel="{_e(r.kernel.name)}"' for r in rows]
    table = _table(head, [_kernel_cells(r) for r in rows], "kernels", attrs)
    return f'<section id="kernels"><h2>Kernels in execution order</h2>{table}</section>'


def _graph_section(svg: str, graph: Graph) -> str:
    return ('<section id="graph-section"><h2>Primitive graph</h2>'
            f'<p class="hint">{len(graph.nodes)} primitives in columns by topological depth, wrapped into bands '
            '(read like text; dashed edges cross bands); fill = kernel, red dashed outline + count badge = '
            'computed by several kernels (one stripe each), white = in no kernel, '
            'thick edge = tensor kept inside a kernel, blue outline = value stored channels-last, orange '
            'outline = value converted to the other layout. Hover a node for details; '
            'click a node or a kernel row to jump between them; Ctrl+wheel or the buttons zoom, drag pans.</p>'
            '<div class="tools"><button data-zoom="0.8">−</button><button data-zoom="1.25">+</button>'
            '<button data-zoom="fit">fit</button><button data-zoom="1">1:1</button> '
            '<span id="zoom-level">100%</span> <span id="js-status"></span></div>'
            f'<div id="viewport">{svg}</div></section>')


# ---------------------------------------------------------------- the page

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 1.5em 3em;color:#222}
h1{font-size:1.5em;margin:.6em 0 .2em}h2{font-size:1.15em;margin:1.2em 0 .4em}
.row{display:flex;gap:2em;flex-wrap:wrap;align-items:flex-start}
dl{display:grid;grid-template-columns:max-content auto;gap:.15em 1em;margin:0}dt{color:#666}dd{margin:0}
table{border-collapse:collapse;margin:.4em 0}th,td{padding:2px 8px;border-bottom:1px solid #e4e4e4;text-align:left}
th{background:#f4f4f4;position:sticky;top:0}.num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b00;font-weight:bold}code{font-size:.92em}
.swatch{display:inline-block;width:1.6em;height:1em;border:1px solid #555;vertical-align:middle}
.tag{font-size:.75em;padding:0 4px;border-radius:3px}.tag.measured{background:#d6f5d6}.tag.bound{background:#eee}
table.kernels tr{cursor:pointer}table.kernels tr.hl td{background:#fff6c8}
#viewport{overflow:auto;max-height:75vh;border:1px solid #ccc;background:#fcfcfc;cursor:grab}
#viewport.drag{cursor:grabbing}.tools{margin:.3em 0}.tools button{min-width:2.4em}.hint{color:#555;margin:.2em 0}
svg .bands rect{fill:#fff}svg .bands rect:nth-child(even){fill:#f1f4f8}
svg .edges path{fill:none;stroke:#9a9a9a;stroke-width:1;opacity:.7}svg .edges path.in{stroke:#444;stroke-width:1.6}
svg .edges path.wrap{stroke-dasharray:5 4;opacity:.35}
svg .node rect{fill:transparent;stroke:#333;stroke-width:.8}svg .node text{font:10px sans-serif;text-anchor:middle;
pointer-events:none}svg .node.redundant rect{stroke:#c00;stroke-width:2.2;stroke-dasharray:4 2}
svg .node.orphan rect{fill:#fff;stroke-dasharray:2 2}svg .node.output rect{stroke-width:2}
svg .node.channels-last rect{stroke:#1565c0;stroke-width:2.5}svg .node.converted rect{stroke:#ef6c00;stroke-width:3}
svg circle.badge{fill:#c00;stroke:#fff}svg text.badge{fill:#fff;font:bold 9px sans-serif}
svg .node{cursor:pointer}svg.focus .kernel{opacity:.18}svg.focus .kernel.hl{opacity:1}
svg .kernel.hl rect{stroke:#000;stroke-width:1.5}
"""

# Errors are collected before anything else runs, into body[data-errors], so a headless browser's DOM shows them.
_ERROR_JS = """
window.korchErrors=[];window.addEventListener('error',function(e){window.korchErrors.push(String(e.message));
if(document.body)document.body.setAttribute('data-errors',window.korchErrors.join(' | '));});
"""

_JS = """
(function(){
var svg=document.getElementById('graph'),vp=document.getElementById('viewport');
var W=+svg.dataset.width,H=+svg.dataset.height,zoom=1;
function setZoom(z,cx,cy){var r=vp.getBoundingClientRect();cx=cx==null?r.width/2:cx;cy=cy==null?r.height/2:cy;
 var fx=(vp.scrollLeft+cx)/zoom,fy=(vp.scrollTop+cy)/zoom;zoom=Math.max(0.02,Math.min(8,z));
 svg.setAttribute('width',W*zoom);svg.setAttribute('height',H*zoom);
 vp.scrollLeft=fx*zoom-cx;vp.scrollTop=fy*zoom-cy;
 document.getElementById('zoom-level').textContent=Math.round(zoom*100)+'%';}
function view(){var r=vp.getBoundingClientRect();return {w:r.width||800,h:r.height||innerHeight*0.75||600};}
function fit(){var v=view();setZoom(Math.min(1,v.w/W,v.h/H));}
function fitWidth(){setZoom(Math.min(1,Math.max(0.6,view().w/W)));}
document.querySelectorAll('[data-zoom]').forEach(function(b){b.addEventListener('click',function(){
 var z=b.dataset.zoom;if(z==='fit')fit();else if(z==='1')setZoom(1);else setZoom(zoom*(+z));});});
vp.addEventListener('wheel',function(e){if(!(e.ctrlKey||e.metaKey))return;e.preventDefault();
 var r=vp.getBoundingClientRect();
 setZoom(zoom*(e.deltaY<0?1.15:1/1.15),e.clientX-r.left,e.clientY-r.top);},{passive:false});
var drag=null;vp.addEventListener('mousedown',function(e){
 drag={x:e.clientX,y:e.clientY,l:vp.scrollLeft,t:vp.scrollTop,moved:false};vp.classList.add('drag');});
addEventListener('mousemove',function(e){if(!drag)return;var dx=e.clientX-drag.x,dy=e.clientY-drag.y;
 if(Math.abs(dx)+Math.abs(dy)>3)drag.moved=true;vp.scrollLeft=drag.l-dx;vp.scrollTop=drag.t-dy;});
addEventListener('mouseup',function(){setTimeout(function(){drag=null;},0);vp.classList.remove('drag');});
var groups={},rows={};
svg.querySelectorAll('g.kernel').forEach(function(g){groups[g.dataset.kernel]=g;});
document.querySelectorAll('table.kernels tr[data-kernel]').forEach(function(r){rows[r.dataset.kernel]=r;});
function highlight(names){svg.classList.toggle('focus',names.length>0);
 Object.keys(groups).forEach(function(k){groups[k].classList.toggle('hl',names.indexOf(k)>=0);});
 Object.keys(rows).forEach(function(k){rows[k].classList.toggle('hl',names.indexOf(k)>=0);});}
function showKernel(k){var g=groups[k];if(!g)return;var b=g.getBBox(),r=vp.getBoundingClientRect();
 vp.scrollLeft=(b.x+b.width/2)*zoom-r.width/2;vp.scrollTop=(b.y+b.height/2)*zoom-r.height/2;
 vp.scrollIntoView({block:'nearest'});highlight([k]);}
Object.keys(rows).forEach(function(k){var r=rows[k];
 r.addEventListener('mouseenter',function(){highlight([k]);});r.addEventListener('click',function(){showKernel(k);});});
svg.querySelectorAll('g.node').forEach(function(n){var ks=n.dataset.kernels?n.dataset.kernels.split(' '):[];
 n.addEventListener('mouseenter',function(){highlight(ks);});
 n.addEventListener('click',function(){if(drag&&drag.moved||!ks.length)return;highlight(ks);
  rows[ks[0]].scrollIntoView({block:'center'});});});
svg.addEventListener('mouseleave',function(){highlight([]);});
var missing=Object.keys(rows).filter(function(k){return !groups[k];});
document.body.dataset.kernelsDrawn=Object.keys(groups).length;document.body.dataset.kernelRows=Object.keys(rows).length;
document.getElementById('js-status').textContent=Object.keys(groups).length+' kernels drawn'+
 (missing.length?', missing: '+missing.join(' '):'');
if(missing.length)throw new Error('kernels without a drawing: '+missing.join(' '));
fitWidth();document.body.dataset.ready='yes';
})();
"""


def render_html(graph: Graph, plan: Plan, *, benchmark: dict | None = None, executable: dict | None = None) -> str:
    """The whole report page for ``plan`` of ``graph``; ``benchmark`` is {"korch_s": s, "peers": {name: s}};
    ``executable`` is the executable's manifest (with its "check")."""
    rows = _kernel_rows(graph, plan)
    svg = render_svg(graph, plan, {r.kernel.name: r.colour for r in rows})
    title = f"korch plan: {plan.model}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<style>{_CSS}</style><script>{_ERROR_JS}</script></head><body>'
            f'<h1>{_e(title)}</h1>{_header(graph, plan)}{_measurement(plan.stats.get("measurement"))}'
            f'{_executable(executable)}{_benchmark(plan, benchmark)}{_graph_section(svg, graph)}{_kernel_table(rows)}'
            f'{_redundant(graph, plan)}'
            f"<script>{_JS}</script></body></html>\n")


def write_html_report(outdir: str | os.PathLike, graph: Graph, plan: Plan, benchmark: dict | None = None,
                      executable: dict | None = None) -> Path:
    """Write ``OUTDIR/report.html`` atomically; returns its path."""
    page = render_html(graph, plan, benchmark=benchmark, executable=executable)
    return atomic_write_bytes(Path(outdir) / "report.html", page.encode())
