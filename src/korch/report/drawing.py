"""The primitive graph of a plan drawn as inline SVG, with each chosen kernel as a coloured group.

Owns the layout and the drawing for ``html_page``. Nodes go into columns by
topological depth (longest path from the graph's inputs), and each node sits
near the mean row of its predecessors, pushed apart from its neighbours, so
chains draw as straight rows. Models are long and thin (a 546-primitive YOLO
is 500 columns deep but a few rows high), so the columns wrap into bands laid
out top to bottom, like lines of text, with as many bands as bring the drawing
closest to a landscape page.

SVG structure, in paint order: band backgrounds; edges (tensors between
primitives; ``in`` when both ends share a kernel, ``wrap`` when the edge
crosses a band); one ``<g class="kernel" data-kernel=NAME>`` per kernel with a
rect per node it computes (a node of n kernels gets n vertical stripes, one in
each kernel's group); one ``<g class="node">`` per primitive with its frame,
label, a ``<title>`` tooltip and, when computed by several kernels, a count badge.
"""

from __future__ import annotations

import colorsys
import dataclasses
import html
import math

from korch.ir.graph import Graph, Node
from korch.ir.ops import Op
from korch.orchestrate.plan import Plan

# Geometry in SVG user units (pixels at zoom 1).
NODE_W, NODE_H = 84, 20
COLUMN, ROW = 118, 28
MARGIN, BAND_GAP = 24, 36
MIN_BAND_COLUMNS = 8
ASPECT = 1.6  # the width / height the band count aims for


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def kernel_colour(index: int) -> str:
    """A light colour for kernel ``index``; stepping hue by the golden ratio keeps neighbours apart."""
    hue = (index * 0.381966) % 1.0
    r, g, b = colorsys.hls_to_rgb(hue, 0.74, 0.62 if index % 2 else 0.85)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def kernels_by_node(plan: Plan) -> dict[str, list[str]]:
    """Primitive node name -> the kernels (by name, in plan order) that compute it."""
    owners: dict[str, list[str]] = {}
    for k in plan.kernels:
        for n in dict.fromkeys(k.nodes):
            owners.setdefault(n, []).append(k.name)
    return owners


# ---------------------------------------------------------------- layout


@dataclasses.dataclass(frozen=True)
class Layout:
    """Top-left corner of each node (by index into graph.nodes), its band, and the drawing's size."""

    x: list[float]
    y: list[float]
    band: list[int]
    band_tops: list[float]
    predecessors: list[list[int]]
    width: float
    height: float


def _predecessors(graph: Graph) -> list[list[int]]:
    producer: dict[str, int] = {}
    preds = []
    for i, node in enumerate(graph.nodes):
        preds.append(list(dict.fromkeys(producer[t] for t in node.inputs if t in producer)))
        producer.update((out, i) for out in node.outputs)
    return preds


def _place_column(members: list[int], wanted: dict[int, float]) -> dict[int, float]:
    """Rows for one column: each node as near its wanted row as one row of space between nodes allows."""
    order = sorted(members, key=lambda i: (wanted[i], i))
    placed: dict[int, float] = {}
    last = float("-inf")
    for i in order:
        last = placed[i] = max(wanted[i], last + 1.0)
    drift = sum(placed[i] - wanted[i] for i in order) / len(order)
    return {i: y - drift for i, y in placed.items()}


def columns_and_rows(preds: list[list[int]]) -> tuple[list[int], list[float]]:
    """Each node's column (longest path from a source) and row (barycenter of its predecessors, spread out)."""
    column: list[int] = []
    for p in preds:
        column.append(max((column[j] + 1 for j in p), default=0))
    members: list[list[int]] = [[] for _ in range(max(column, default=-1) + 1)]
    for i, c in enumerate(column):
        members[c].append(i)
    row = [0.0] * len(preds)
    for nodes in members:
        wanted = {i: (sum(row[j] for j in preds[i]) / len(preds[i]) if preds[i] else float(n))
                  for n, i in enumerate(nodes)}
        for i, y in _place_column(nodes, wanted).items():
            row[i] = y
    return column, row


def _band_spans(column: list[int], row: list[float], per_band: int) -> list[tuple[float, float]]:
    """(lowest row, highest row) of each band when ``per_band`` columns share a band."""
    bands = max(column, default=0) // per_band + 1
    low, high = [math.inf] * bands, [-math.inf] * bands
    for c, r in zip(column, row):
        b = c // per_band
        low[b], high[b] = min(low[b], r), max(high[b], r)
    return [(lo, hi) if lo <= hi else (0.0, 0.0) for lo, hi in zip(low, high)]


def _band_height(span: tuple[float, float]) -> float:
    return (span[1] - span[0]) * ROW + NODE_H


def _size(spans: list[tuple[float, float]], per_band: int) -> tuple[float, float]:
    width = 2 * MARGIN + (per_band - 1) * COLUMN + NODE_W
    return width, 2 * MARGIN + sum(map(_band_height, spans)) + BAND_GAP * (len(spans) - 1)


def _columns_per_band(column: list[int], row: list[float]) -> int:
    """The band width whose drawing's shape is closest to ASPECT (all columns in one band when that is best)."""
    columns = max(column, default=0) + 1
    best, best_score = columns, math.inf
    for bands in range(1, max(1, columns // MIN_BAND_COLUMNS) + 1):
        per_band = math.ceil(columns / bands)
        width, height = _size(_band_spans(column, row, per_band), per_band)
        score = abs(math.log(width / height / ASPECT))
        if score < best_score:
            best, best_score = per_band, score
    return best


def layout(graph: Graph) -> Layout:
    preds = _predecessors(graph)
    column, row = columns_and_rows(preds)
    per_band = _columns_per_band(column, row)
    spans = _band_spans(column, row, per_band)
    tops = [float(MARGIN)]
    for span in spans[:-1]:
        tops.append(tops[-1] + _band_height(span) + BAND_GAP)
    band = [c // per_band for c in column]
    x = [MARGIN + (c % per_band) * COLUMN for c in column]
    y = [tops[b] + (r - spans[b][0]) * ROW for b, r in zip(band, row)]
    width, height = _size(spans, min(per_band, max(column, default=0) + 1))
    return Layout(x, y, band, tops, preds, width, height)


# ---------------------------------------------------------------- drawing


def _label(node: Node) -> str:
    return str(node.attrs.get("op_type", node.op.value)) if node.op is Op.OPAQUE else node.op.value


def _tooltip(graph: Graph, node: Node, owners: list[str]) -> str:
    shapes = "; ".join(f"{out}: {list(graph.tensors[out].shape)} {graph.tensors[out].dtype}"
                       for out in node.outputs if out in graph.tensors)
    redundant = f" (computed {len(owners)} times: redundant)" if len(owners) > 1 else ""
    return f"{node.name}\nop: {_label(node)}\nout {shapes}\nkernel(s): {', '.join(owners) or 'none'}{redundant}"


def _band_backgrounds(lay: Layout) -> list[str]:
    bottoms = lay.band_tops[1:] + [lay.height - MARGIN + BAND_GAP]
    return [f'<rect x="0" y="{top - BAND_GAP / 2:.0f}" width="{lay.width:.0f}" height="{bottom - top:.0f}"/>'
            for top, bottom in zip(lay.band_tops, bottoms)]


def _edges(graph: Graph, lay: Layout, owners: dict[str, list[str]]) -> list[str]:
    paths = []
    half = NODE_H / 2
    for i, node in enumerate(graph.nodes):
        x2, y2 = lay.x[i], lay.y[i] + half
        for j in lay.predecessors[i]:
            x1, y1 = lay.x[j] + NODE_W, lay.y[j] + half
            classes = []
            if set(owners.get(node.name, ())) & set(owners.get(graph.nodes[j].name, ())):
                classes.append("in")
            if lay.band[i] != lay.band[j]:
                classes.append("wrap")
                c1, c2 = x1 + COLUMN / 2, x2 - COLUMN / 2
            else:
                c1 = c2 = (x1 + x2) / 2
            cls = f' class="{" ".join(classes)}"' if classes else ""
            paths.append(f'<path{cls} d="M{x1:.0f} {y1:.1f}C{c1:.0f} {y1:.1f} {c2:.0f} {y2:.1f} {x2:.0f} {y2:.1f}"/>')
    return paths


def _kernel_groups(graph: Graph, plan: Plan, lay: Layout, colours: dict[str, str],
                   owners: dict[str, list[str]]) -> list[str]:
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    groups = []
    for k in plan.kernels:
        rects = []
        for name in dict.fromkeys(n for n in k.nodes if n in index):
            i, share = index[name], owners[name]
            width = NODE_W / len(share)
            rects.append(f'<rect x="{lay.x[i] + share.index(k.name) * width:.1f}" y="{lay.y[i]:.1f}" '
                         f'width="{width:.1f}" height="{NODE_H}"/>')
        groups.append(f'<g class="kernel" data-kernel="{_e(k.name)}" fill="{colours[k.name]}">'
                      f'<title>{_e(k.name)}: {_e(k.ops)}</title>{"".join(rects)}</g>')
    return groups


def _node_marks(graph: Graph, plan: Plan, lay: Layout, owners: dict[str, list[str]]) -> list[str]:
    outputs = set(graph.outputs)
    stored = plan.stored_layouts()
    converted = {c.tensor: c for c in plan.conversions}
    marks = []
    for i, node in enumerate(graph.nodes):
        x, y = lay.x[i], lay.y[i]
        share = owners.get(node.name, [])
        classes = ["node"] + (["redundant"] if len(share) > 1 else []) + (["orphan"] if not share else []) \
            + (["output"] if outputs.intersection(node.outputs) else []) \
            + (["channels-last"] if any(t in stored for t in node.outputs) else []) \
            + (["converted"] if any(t in converted for t in node.outputs) else [])
        notes = [f"stored {stored[t]}" for t in node.outputs if t in stored] + \
                [f"converted to {converted[t].to} before {converted[t].before}" for t in node.outputs if t in converted]
        badge = ""
        if len(share) > 1:
            badge = (f'<circle class="badge" cx="{x + NODE_W:.0f}" cy="{y:.0f}" r="7"/>'
                     f'<text class="badge" x="{x + NODE_W:.0f}" y="{y + 3.5:.1f}">{len(share)}</text>')
        marks.append(f'<g class="{" ".join(classes)}" data-node="{_e(node.name)}" '
                     f'data-kernels="{_e(" ".join(share))}">'
                     f'<title>{_e(chr(10).join([_tooltip(graph, node, share), *notes]))}</title>'
                     f'<rect x="{x:.0f}" y="{y:.1f}" width="{NODE_W}" height="{NODE_H}" rx="3"/>'
                     f'<text x="{x + NODE_W / 2:.0f}" y="{y + 14:.1f}">{_e(_label(node)[:12])}</text>{badge}</g>')
    return marks


def render_svg(graph: Graph, plan: Plan, colours: dict[str, str] | None = None) -> str:
    """The primitive graph as an inline ``<svg id="graph">``; ``colours`` maps kernel name -> fill."""
    colours = colours or {k.name: kernel_colour(n) for n, k in enumerate(plan.kernels)}
    lay = layout(graph)
    owners = kernels_by_node(plan)
    w, h = f"{lay.width:.0f}", f"{lay.height:.0f}"
    return (f'<svg id="graph" viewBox="0 0 {w} {h}" width="{w}" height="{h}" data-width="{w}" data-height="{h}">'
            f'<g class="bands">{"".join(_band_backgrounds(lay))}</g>'
            f'<g class="edges">{"".join(_edges(graph, lay, owners))}</g>'
            f'<g class="kernels">{"".join(_kernel_groups(graph, plan, lay, colours, owners))}</g>'
            f'<g class="nodes">{"".join(_node_marks(graph, plan, lay, owners))}</g></svg>')
