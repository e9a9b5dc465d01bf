"""Running a plan kernel by kernel with the reference executor.

Each kernel is cut out of the primitive graph (``ir.subgraph.extract``) and run
on nothing but its declared inputs; only its declared outputs reach the
kernels after it. So a plan whose kernels read something no earlier kernel
wrote, or that forgets a graph output, fails here instead of computing
something else.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from korch.ir.graph import Graph
from korch.ir.subgraph import extract
from korch.orchestrate.plan import Plan
from korch.ir import interpret


def run_plan(graph: Graph, plan: Plan, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    env: dict[str, np.ndarray] = {name: np.asarray(feeds[name]) for name in graph.inputs}
    for kernel in plan.kernels:
        missing = [t for t in kernel.inputs if t not in env and t not in graph.constants]
        if missing:
            raise RuntimeError(f"kernel {kernel.name} ({kernel.ops}) reads {missing}, which no earlier kernel wrote")
        sub = extract(graph, [index[n] for n in kernel.nodes], kernel.inputs, kernel.outputs, name=kernel.name)
        env.update(interpret.run(sub, {t: env[t] for t in sub.inputs}))
    missing = [t for t in graph.outputs if t not in env]
    if missing:
        raise RuntimeError(f"the plan never writes graph outputs {missing}")
    return {name: env[name] for name in graph.outputs}
