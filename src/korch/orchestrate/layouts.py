"""Data layout as a decision of the program: the layout each value between kernels is stored in.

A convolution reads an image fastest channels-last on a CPU (oneDNN; a 3x3
depthwise one 28x faster than on NCHW), an instance normalisation reduces
fastest over contiguous rows, and a value between the two is stored once. So
which layout each value takes is part of the orchestration, and the program
chooses it with the kernels, to the same proven optimum.

How, without a new kind of constraint (docs/orchestration.md, "Layouts"):

* ``with_layouts`` gives every candidate of a graph with convolutions or
  pools that reads or writes a value with layouts (``ir.subgraph.has_layouts``:
  a 4-D floating-point activation) a second column: the same primitives with every such value stored
  channels-last (its signature suffixed, measured on its own).
* In the program a value in a layout is a tensor id of its own
  (``stored_name``): a contiguous kernel needs and writes ``t``, a
  channels-last one ``t`` stored channels-last.
* ``conversions`` are columns too: each copies one value into the other layout
  (it needs the value as a kernel wrote it in one, and writes it in the other).
  A graph input, an output, and a value crossing segments are contiguous.

The executable honours the chosen layouts where it compiles the plan as one
unit (``runtime/unit.py``); the kernel-by-kernel executables read and write
contiguous values (correct, and what their own plans price).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from korch.cost import Device, KernelWork, lower_bound
from korch.ir.graph import CHANNELS_LAST, CONTIGUOUS, Graph, other_layout
from korch.ir.ops import WINDOW, Op
from korch.ir.subgraph import has_layouts
from korch.orchestrate.candidates import Candidate, CandidateSet


# the operations whose libraries read images faster in one layout than another
SPATIAL = frozenset({Op.CONV, Op.CONV_TRANSPOSE, *WINDOW})


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A copy of ``tensor`` into layout ``to`` from the other one."""

    tensor: str
    to: str

    @property
    def source(self) -> str:
        return other_layout(self.to)


def laid_out(graph: Graph, candidate: Candidate) -> tuple[str, ...]:
    """The inputs and outputs of ``candidate`` that have layouts (constants are the backends' to lay out)."""
    return tuple(t for t in dict.fromkeys((*candidate.inputs, *candidate.outputs))
                 if t not in graph.constants and has_layouts(graph.tensors[t]))


def with_layouts(graph: Graph, candidates: CandidateSet) -> CandidateSet:
    """``candidates`` and, after them, a channels-last column of each one that reads or writes a value with
    layouts (a new id, the signature suffixed with the layout). A graph without convolutions or pools has none:
    its 4-D values are attention's heads, which no library reads faster channels-last, and measuring them twice
    would only cost time."""
    if not any(node.op in SPATIAL for node in graph.nodes):
        return candidates
    found = list(candidates.candidates)
    for c in candidates.candidates:
        if c.layout == CONTIGUOUS and laid_out(graph, c):
            found.append(dataclasses.replace(c, id=len(found), signature=f"{c.signature}@{CHANNELS_LAST}",
                                             layout=CHANNELS_LAST))
    return CandidateSet(candidates=found, rejected=candidates.rejected)


def stored_name(tensor: str, layout: str) -> str:
    """The program's name of ``tensor`` stored in ``layout`` (the tensor's own name when contiguous)."""
    return tensor if layout == CONTIGUOUS else f"{tensor}\0{layout}"  # no tensor name holds a NUL


def conversions(graph: Graph, candidates: Iterable[Candidate]) -> list[Conversion]:
    """Every conversion a selection of ``candidates`` could use: each value a channels-last one reads or
    writes, into channels-last and back."""
    tensors = dict.fromkeys(t for c in candidates if c.layout != CONTIGUOUS for t in laid_out(graph, c))
    return [Conversion(t, to) for t in tensors for to in (CHANNELS_LAST, CONTIGUOUS)]


def conversion_floor(graph: Graph, conversion: Conversion, device: Device) -> float:
    """Seconds no conversion can beat: the value read once and written once."""
    size = graph.tensors[conversion.tensor].nbytes
    return lower_bound(device, KernelWork(bytes_read=size, bytes_written=size, vector_flops=0, matrix_flops=0))


def contiguous_columns(candidates: CandidateSet, ids, moves) -> list[bool] | None:
    """Which columns of a segment's program (``problem.segment_problem``: candidates ``ids``, then ``moves``)
    are contiguous kernels, the smaller program whose optimum starts the search (``Solver.solve``'s
    ``first``); None for a program without layout columns."""
    if not moves:
        return None
    return [candidates.candidates[c].layout == CONTIGUOUS for c in ids] + [False] * len(moves)
