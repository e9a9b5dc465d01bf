"""Primitive node counts of the zoo models next to the Korch paper's (Table 2).

    .venv/bin/python benchmarks/primitive_counts.py > benchmarks/results/primitive_counts.md
"""

from __future__ import annotations

import warnings

from korch import zoo
from korch.pipeline import load_model


def main() -> None:
    print("| model | ONNX nodes (exported) | korch primitives | elementwise | reduce | window | layout | linear | opaque | paper |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in zoo.list_models():
        path = zoo.export(m.name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imported, graph, _ = load_model(str(path))
        kinds = {k: 0 for k in ("elementwise", "reduce", "window", "layout", "linear", "opaque")}
        for node in graph.nodes:
            kinds[node.op.kind.value] += 1
        paper = m.paper_primitive_nodes or "-"
        import onnx

        onnx_nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
        print(f"| {m.name} | {onnx_nodes} | {len(graph.nodes)} | " + " | ".join(str(v) for v in kinds.values())
              + f" | {paper} |")


if __name__ == "__main__":
    main()
