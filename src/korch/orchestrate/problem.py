"""The solver's plain ``Problem`` (costs, and the tensor ids each candidate needs and produces), and how a
segment of the primitive graph becomes one: tensors become ids.

Given tensors (graph inputs, constants, and whatever earlier segments wrote)
are always available; required tensors are the ones the segment writes for
later segments or as graph outputs.

Every primitive of a segment lies on a path to a required tensor (fission
leaves no dead code), so every valid plan computes each primitive in some
kernel. Saying so makes the program's LP relaxation far tighter (Candy: the
root LP is integral, 0.07 s instead of minutes of branch and bound), and it
needs no new kind of constraint: each primitive becomes a pseudo-tensor,
"computed(v)", that every candidate containing it produces and that is
required.

With layout columns (``layouts.py``) a value stored channels-last is a tensor
id of its own, and the conversions between layouts are columns after the
candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from korch.ir import Graph
from korch.ir.graph import CONTIGUOUS
from korch.orchestrate.candidates import CandidateSet
from korch.orchestrate.layouts import Conversion, conversions, laid_out, stored_name
from korch.orchestrate.partition import Segment


@dataclass(frozen=True)
class Problem:
    """The program's data. Tensor ids are arbitrary ints; given tensors (graph inputs,
    constants) appear in no ``needs``. A cost of ``math.inf`` excludes a candidate.
    ``computed``: the required pseudo-tensors that stand for primitives (one per primitive,
    produced by every candidate that computes it); empty where the problem has none."""

    costs: tuple[float, ...]
    needs: tuple[tuple[int, ...], ...]
    produces: tuple[tuple[int, ...], ...]
    required: tuple[int, ...]
    computed: tuple[int, ...] = ()

    def __post_init__(self):
        n = len(self.costs)
        if len(self.needs) != n or len(self.produces) != n:
            raise ValueError(f"problem has {n} costs, {len(self.needs)} needs and "
                             f"{len(self.produces)} produces: one of each per candidate")
        for c, cost in enumerate(self.costs):
            if not cost >= 0:  # also catches NaN
                raise ValueError(f"candidate {c} has cost {cost}: costs must be >= 0 "
                                 "(math.inf excludes a candidate)")


def segment_problem(graph: Graph, candidates: CandidateSet, segment: Segment, costs: Sequence[float],
                    conversion_costs: Callable[[Conversion], float] | None = None) \
        -> tuple[Problem, list[int], list[Conversion]]:
    """The segment's problem, the global candidate id of each of its first local candidates, and the layout
    conversions its last ones are (``layouts.py``; none unless a candidate is channels-last, and then
    ``conversion_costs`` prices them)."""
    inside = {out for i in segment.nodes for out in graph.nodes[i].outputs}
    read_after = {t for i, node in enumerate(graph.nodes) if i not in segment.nodes for t in node.inputs}
    required = sorted(t for t in inside if t in read_after or t in graph.outputs)
    tensor_id: dict[str, int] = {}

    def tid(name: str) -> int:
        return tensor_id.setdefault(name, len(tensor_id))

    ids = list(segment.candidate_ids)
    moves = conversions(graph, (candidates.candidates[c] for c in ids))
    converted = {m.tensor for m in moves}
    needs, produces = [], []
    for cid in ids:
        cand = candidates.candidates[cid]
        stored = set(laid_out(graph, cand)) if cand.layout != CONTIGUOUS else set()

        def name(t: str) -> str:
            return stored_name(t, cand.layout) if t in stored else t

        # a value from outside the segment is given contiguous: stored otherwise, a conversion writes it
        needs.append(tuple(tid(name(t)) for t in cand.inputs if t in inside or t in stored))
        produces.append(tuple(tid(name(t)) for t in cand.outputs)
                        + tuple(tid(_written(t, cand.layout if t in stored else CONTIGUOUS))
                                for t in cand.outputs if t in converted)
                        + tuple(tid(_computed(v)) for v in sorted(cand.nodes)))
    move_costs = []
    for move in moves:
        # a conversion copies what a kernel wrote, never what the opposite conversion wrote: two conversions
        # feeding each other would be a cycle that a fractional solution rides (YOLOv4: 85 s to solve, not 3)
        needs.append((tid(_written(move.tensor, move.source)),) if move.tensor in inside else
                     (tid(stored_name(move.tensor, move.source)),) if move.source != CONTIGUOUS else ())
        produces.append((tid(stored_name(move.tensor, move.to)),))
        move_costs.append(conversion_costs(move))
    computed = [tid(_computed(v)) for v in sorted(segment.nodes)]
    problem = Problem(costs=tuple(costs[c] for c in ids) + tuple(move_costs), needs=tuple(needs),
                      produces=tuple(produces), required=tuple(tid(t) for t in required) + tuple(computed),
                      computed=tuple(computed))
    return problem, ids, moves


def _written(tensor: str, layout: str) -> str:
    """The program's name of ``tensor`` as a kernel (not a conversion) wrote it in ``layout``."""
    return f"\0written:{layout}:{tensor}"


def _computed(node_index: int) -> str:
    # a name no tensor has: tensor names never contain a NUL
    return f"\0computed:{node_index}"
