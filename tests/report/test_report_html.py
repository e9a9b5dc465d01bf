"""report.html: every kernel in the table and the drawing, redundancy marked, no network, and it loads in Chromium."""

import dataclasses
import itertools
import re
import shutil
import subprocess
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from korch.fission.builder import Builder
from korch.ir import Graph, Op, Tensor, verify
from korch.orchestrate.plan import Plan, PlannedKernel
from korch.report.drawing import NODE_H, NODE_W, layout
from korch.report.html_page import kernel_class, render_html, write_html_report


class _Elements(HTMLParser):
    """Every start tag with its attributes, in document order."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def values(self, attr: str, tag: str | None = None, cls: str | None = None) -> list[str]:
        return [a[attr] for t, a in self.tags if attr in a and tag in (None, t)
                and (cls is None or cls in a.get("class", "").split())]

    def body(self) -> dict:
        return next(a for t, a in self.tags if t == "body")


def _stripe_widths(page: str, kernel: str) -> list[float]:
    group = page.split(f'<g class="kernel" data-kernel="{kernel}"', 1)[1].split("</g>", 1)[0]
    return [float(w) for w in _Elements(group).values("width", "rect")]


def _tiny() -> tuple[Graph, Plan]:
    """x -> Exp -> {Relu -> MatMul(w), Neg}: Exp is recomputed by both kernels (redundant computation)."""
    graph = Graph(name="tiny")
    graph.add_tensor(Tensor(name="x", shape=(4, 8), dtype="float32"))
    graph.inputs.append("x")
    b = Builder(graph, "t")
    e = b.emit(Op.EXP, "x")
    m = b.emit(Op.MATMUL, b.emit(Op.RELU, e), b.const(np.ones((8, 3), np.float32)))
    n = b.emit(Op.NEG, e)
    graph.outputs += [m, n]
    verify(graph)
    exp, relu, matmul, neg = (node.name for node in graph.nodes)
    w = graph.nodes[2].inputs[1]
    kernels = (
        PlannedKernel(name="k0", nodes=(exp, relu, matmul), ops="Exp+Relu+MatMul", inputs=("x", w), outputs=(m,),
                      signature="a" * 16, cost_s=3e-6, bound_s=2e-6, measured=True, backend="triton"),
        PlannedKernel(name="k1", nodes=(exp, neg), ops="Exp+Neg", inputs=("x",), outputs=(n,),
                      signature="b" * 16, cost_s=1e-6, bound_s=1e-6, measured=False),
    )
    failure = {"signature": "c" * 16, "ops": "Exp+Relu", "backend": "triton", "status": "build",
               "message": "no <good> reason"}
    stats = {"primitive_nodes": 4, "candidates": 9, "stage_seconds": {"solve": 0.25},
             "measurement": {"device": "cpu", "backends": {"triton": "3.6"}, "candidates": 9, "signatures_asked": 5,
                             "from_database": 2, "kernels_measured": 3, "below_bound": 0, "failures": [failure]}}
    return graph, Plan(model="tiny", target="cpu", cost_model="measured", kernels=kernels, stats=stats)


def test_every_kernel_is_in_the_table_and_the_drawing_and_redundancy_is_marked(tmp_path):
    graph, plan = _tiny()
    page = render_html(graph, plan, benchmark={"korch_s": 5e-6, "peers": {"ort": 2e-5}})
    dom = _Elements(page)
    assert dom.values("id", "tr") == ["kernel-k0", "kernel-k1"]
    assert dom.values("data-kernel", "g", "kernel") == ["k0", "k1"]
    exp = graph.nodes[0].name
    assert dom.values("data-node", "g", "redundant") == [exp]
    assert dom.values("data-kernels", "g", "redundant") == ["k0 k1"]
    assert len(dom.values("cx", "circle", "badge")) == 1
    # Exp is drawn as two half-width stripes, one in each kernel's group
    assert _stripe_widths(page, "k0") == [NODE_W / 2, NODE_W, NODE_W]
    assert _stripe_widths(page, "k1") == [NODE_W / 2, NODE_W]
    assert re.search(r"<title>t/Exp\d*\nop: Exp\nout \S+: \[4, 8\] float32\nkernel\(s\): k0, k1 \(computed 2 times",
                     page)
    assert 'id="redundant"' in page and f"<code>{exp}</code>" in page
    assert "1 primitives are computed by more than one kernel" in page
    assert "no &lt;good&gt; reason" in page and "<good>" not in page       # failures table, escaped
    assert "predicted total <b>4.0 µs</b>, against the 5.0 µs the executable runs in: predicted / measured 0.80" in page
    roofline = render_html(graph, dataclasses.replace(plan, cost_model="roofline"), benchmark={"korch_s": 5e-6})
    assert "predicted total <b>4.0 µs</b>, a floor" in roofline
    assert roofline.count("a floor (roofline costs") == 2 and "a floor" not in page  # the header says so too
    assert "4.00×" in page                                                  # ort 20 µs / korch 5 µs
    assert "1 measured, 1 bounded" in page
    assert not re.search(r"https?://", page), "the page must not reach the network"
    path = write_html_report(tmp_path / "out", graph, plan)
    assert path == tmp_path / "out" / "report.html" and path.read_text() == render_html(graph, plan)
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]


def test_kernel_classes_follow_op_kinds():
    assert kernel_class([Op.EXP, Op.MATMUL]) == "matmul"
    assert kernel_class([Op.PAD, Op.CONV, Op.ADD]) == "conv"
    assert kernel_class([Op.REDUCE_MAX, Op.SUB, Op.EXP]) == "reduction"
    assert kernel_class([Op.MAX_POOL, Op.RELU]) == "window"
    assert kernel_class([Op.TRANSPOSE, Op.ADD]) == "elementwise"
    assert kernel_class([Op.TRANSPOSE, Op.RESHAPE]) == "layout"


@pytest.fixture(scope="module")
def candy():
    from korch.pipeline import optimize

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = optimize("zoo:candy", target="cpu", cost="roofline")
    return result.graph, result.plan


def test_layout_keeps_nodes_apart_and_edges_forward_within_a_band(candy):
    graph, _ = candy
    lay = layout(graph)
    boxes = sorted(zip(lay.y, lay.x))
    for (y1, x1), (y2, x2) in itertools.pairwise(boxes):
        assert y2 - y1 >= NODE_H or x2 - x1 >= NODE_W, "two nodes overlap"
    assert max(lay.x) + NODE_W <= lay.width and max(lay.y) + NODE_H <= lay.height
    assert max(lay.band) > 0, "a 200-node chain should wrap into bands"
    for i, preds in enumerate(lay.predecessors):
        for j in preds:
            assert lay.band[j] < lay.band[i] or (lay.band[j] == lay.band[i] and lay.x[j] < lay.x[i])


def _chromium() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    assert found, "chromium is missing: `make test` installs it (apt-get install chromium)"
    return found


def _dump_dom(page: Path, profile: Path) -> _Elements:
    done = subprocess.run([_chromium(), "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile}",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "<body" in done.stdout, done.stderr[-2000:]
    return _Elements(done.stdout)


def test_candy_report_loads_in_headless_chromium_with_every_kernel(candy, tmp_path):
    graph, plan = candy
    plan.save(tmp_path / "plan.json")
    names = [k.name for k in Plan.load(tmp_path / "plan.json").kernels]
    executable = {"device": "cpu", "kernels": [{"name": n, "backend": "inductor"} for n in names],
                  "memory": {"peak_bytes": 3 << 20, "buffers": 4, "planned_tensors": 9, "naive_bytes": 9 << 20},
                  "check": {"ok": True, "max_abs": 1e-6, "max_rel": 2e-7, "tolerance": 2e-3}}
    page = write_html_report(tmp_path, graph, plan, benchmark={"korch_s": 0.3, "peers": {"ort": 0.25}},
                             executable=executable)
    text = page.read_text()
    assert 'id="executable"' in text and "inductor " + str(len(names)) in text and 'id="check"' in text
    assert 'id="benchmark"' in text and "0.83×" in text
    dom = _dump_dom(page, tmp_path / "profile")
    body = dom.body()
    assert "data-errors" not in body, body["data-errors"]
    assert body.get("data-ready") == "yes" and body.get("data-kernels-drawn") == str(len(names))
    assert sorted(dom.values("id", "tr")) == sorted(f"kernel-{n}" for n in names)
    assert sorted(dom.values("data-kernel", "g", "kernel")) == sorted(names)
    assert len(dom.values("data-node", "g", "node")) == len(graph.nodes)


def test_chromium_check_sees_a_script_error(candy, tmp_path):
    graph, plan = candy
    page = render_html(graph, plan).replace('<g class="kernel" data-kernel="k0"', '<g class="kernel" data-kernel="x"')
    (tmp_path / "broken.html").write_text(page)
    body = _dump_dom(tmp_path / "broken.html", tmp_path / "profile").body()
    assert "kernels without a drawing: k0" in body.get("data-errors", "") and "data-ready" not in body


def test_chosen_layouts_and_conversions_are_marked():
    """A value stored channels-last and a value converted are marked in the drawing, with their layout in the
    tooltip, and each kernel's layout is in the table."""
    import dataclasses

    from korch.orchestrate.plan import PlannedConversion

    graph, plan = _tiny()
    first, second = plan.kernels
    plan = dataclasses.replace(plan, kernels=(dataclasses.replace(first, layout="channels_last"), second),
                               conversions=(PlannedConversion(tensor=second.outputs[0], to="channels_last",
                                                              cost_s=1e-6, before="k1"),))
    page = render_html(graph, plan)
    elements = _Elements(page)
    assert elements.values("data-node", "g", cls="channels-last") == [graph.nodes[2].name]
    assert elements.values("data-node", "g", cls="converted") == [graph.nodes[3].name]
    assert "stored channels_last" in page and "converted to channels_last before k1" in page
    assert page.count("<td>channels-last</td>") == 1 and page.count("<td>contiguous</td>") == 1
