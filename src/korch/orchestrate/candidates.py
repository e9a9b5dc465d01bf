"""Candidate kernels: every convex, connected set of primitives a backend could run as one kernel.

A candidate is a weakly connected set of at most ``max_nodes`` primitive nodes
(connected through the tensors one produces and another reads) that is
**convex** (no path leaves the set and comes back: a kernel must be able to run
all at once) and that the *predicate* accepts. ``enumerate_candidates`` lists
all of them, each once.

How: nodes are bits of Python ints. Every connected set is grown from its
smallest node ``v`` by the ESU scheme (Wernicke 2006): a set is extended only by
nodes above ``v`` from the *exclusive* neighbourhood of the node just added,
which produces each connected set exactly once. Convexity is tested on each set
with ancestor/descendant bitsets: S is convex iff ``anc(S) & desc(S)`` lies in
S. Convexity is not monotone (adding the nodes of a detour restores it), so a
non-convex set is still extended, except when no valid superset can exist:
every convex superset of S contains ``anc(S) & desc(S)`` (it is a subset of
anc(T) & desc(T) for any T containing S), so S's branch is cut when S plus
those forced nodes exceeds ``max_nodes``, leaves the allowed nodes, or holds a
pair of nodes that conflict.

Predicates return None for a buildable set, else the reason it is not; every
reason of a tested set is counted in ``CandidateSet.rejected``. A predicate may
offer two speed-ups, both used by ``default_predicate``:

* ``predicate.bind(graph)`` returns a callable ``(nodes) -> reason | None``
  equal to ``predicate(graph, nodes)`` that precomputes what it needs once;
* the bound callable may have ``grow(mask, w) -> reason | None`` (``mask`` a
  bitset of nodes, ``w`` a node outside it) with the promise that when it
  returns a reason, every set holding ``mask`` and ``w`` is rejected. The
  enumeration then never grows ``mask`` by ``w`` (it counts the reason once).

Hubs. Connected sets around a node with many neighbours explode
combinatorially: a Concat of 20 branches has ~10^6 connected sets of 8 nodes,
almost all accepted. The default predicate therefore lets a kernel hold at most
``HUB_NEIGHBOURS`` neighbours of a node that has more than ``HUB_DEGREE``
(producers of its inputs plus readers of its outputs). No node of the zoo
models has more than 6, so the rule only guards against such graphs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator

from korch.errors import KorchError
from korch.ir.graph import CONTIGUOUS, Graph
from korch.ir.ops import Kind
from korch.orchestrate.signature import Signer

# The default predicate rejects kernels writing more than this many tensors
# (a single primitive is always accepted). Candidate for korch.config.
MAX_OUTPUTS = 4
# A node with more than HUB_DEGREE neighbours is a hub: a kernel of the default
# predicate holds at most HUB_NEIGHBOURS of its neighbours. Candidates for korch.config.
HUB_DEGREE = 8
HUB_NEIGHBOURS = 3

Predicate = Callable[[Graph, frozenset[int]], "str | None"]

NOT_CONVEX = "not convex"


@dataclasses.dataclass(frozen=True)
class Candidate:
    id: int                          # index in CandidateSet.candidates
    nodes: frozenset[int]            # indices into graph.nodes
    inputs: tuple[str, ...]          # tensors read from outside the kernel, in order of first use
    outputs: tuple[str, ...]         # tensors written and read outside it (or graph outputs), topological order
    signature: str                   # canonical structural hash (signature.py), with the layout's suffix
    layout: str = CONTIGUOUS         # how its laid-out inputs and outputs are stored (layouts.py)


@dataclasses.dataclass
class CandidateSet:
    candidates: list[Candidate]
    rejected: dict[str, int]         # reason -> count of tested sets rejected for it


def bits(mask: int) -> Iterator[int]:
    """The indices of the set bits of ``mask``, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class GraphIndex:
    """Producers, readers and reachability of one graph's nodes, as bitsets over node indices."""

    def __init__(self, graph: Graph):
        self.graph = graph
        n = len(graph.nodes)
        self.producer: dict[str, int] = {}
        self.readers: dict[str, int] = {}   # tensor -> bitset of the nodes reading it
        self.preds = [0] * n                 # direct producers of a node's inputs (not constants, graph inputs)
        self.succs = [0] * n
        self.node_inputs = [tuple(t for t in node.inputs if t) for node in graph.nodes]
        for i, node in enumerate(graph.nodes):
            for t in self.node_inputs[i]:
                self.readers[t] = self.readers.get(t, 0) | (1 << i)
                p = self.producer.get(t)
                if p is not None:
                    self.preds[i] |= 1 << p
                    self.succs[p] |= 1 << i
            for t in node.outputs:
                self.producer[t] = i
        self.graph_outputs = frozenset(graph.outputs)
        self._anc: list[int] | None = None
        self._desc: list[int] | None = None

    @property
    def anc(self) -> list[int]:
        """Strict ancestors of each node."""
        if self._anc is None:
            anc = [0] * len(self.preds)
            for i, preds in enumerate(self.preds):
                a = preds
                for p in bits(preds):
                    a |= anc[p]
                anc[i] = a
            self._anc = anc
        return self._anc

    @property
    def desc(self) -> list[int]:
        """Strict descendants of each node."""
        if self._desc is None:
            desc = [0] * len(self.succs)
            for i in range(len(self.succs) - 1, -1, -1):
                d = self.succs[i]
                for s in bits(self.succs[i]):
                    d |= desc[s]
                desc[i] = d
            self._desc = desc
        return self._desc

    def outputs(self, mask: int) -> tuple[str, ...]:
        """Tensors produced in ``mask`` and read outside it or graph outputs, topological order."""
        outs = []
        for i in bits(mask):
            for t in self.graph.nodes[i].outputs:
                if t in self.graph_outputs or self.readers.get(t, 0) & ~mask:
                    outs.append(t)
        return tuple(outs)

    def inputs(self, mask: int) -> tuple[str, ...]:
        """Tensors read by ``mask`` and produced outside it, deduplicated, in order of first use."""
        seen: dict[str, None] = {}
        for i in bits(mask):
            for t in self.node_inputs[i]:
                p = self.producer.get(t)
                if (p is None or not mask >> p & 1) and t not in seen:
                    seen[t] = None
        return tuple(seen)


# -- the default predicate --------------------------------------------------------------

def _node_class(graph: Graph, index: int) -> Hashable:
    node = graph.nodes[index]
    kind = node.op.kind
    if kind is Kind.REDUCE:
        return ("reduce", graph.tensors[node.inputs[0]].shape, tuple(node.attrs["axes"]))
    if kind in (Kind.ELEMENTWISE, Kind.LAYOUT):
        return ("free",)
    return (kind.value,)


def _clash(a: Hashable, b: Hashable) -> str | None:
    ka, kb = a[0], b[0]
    if ka == "opaque" or kb == "opaque":
        return "opaque primitive with others"
    if ka == "free" or kb == "free":
        return None
    if ka == kb:
        if ka == "reduce":
            return None if a == b else "reductions of different shapes or axes"
        return f"two {ka} primitives"
    first, second = sorted((ka, kb))
    return f"{first} with {second}"


class KernelRules:
    """``default_predicate`` bound to one graph.

    An opaque primitive only alone; at most one linear primitive, and with it
    only elementwise and layout ones; at most one window primitive, likewise;
    reductions only with elementwise, layout and reductions of inputs of the
    same shape over the same axes (one reduction group: softmax, layer norm);
    at most ``HUB_NEIGHBOURS`` neighbours of a hub; at most ``MAX_OUTPUTS``
    outputs. A single primitive is always accepted.
    """

    def __init__(self, graph: Graph, index: GraphIndex | None = None):
        self.index = index = index or GraphIndex(graph)
        n = len(graph.nodes)
        self.classes = [_node_class(graph, i) for i in range(n)]
        self._clashes: dict[tuple, str | None] = {}
        members: dict[Hashable, int] = {}
        for i, c in enumerate(self.classes):
            members[c] = members.get(c, 0) | (1 << i)
        against = {a: sum(m for b, m in members.items() if self.clash(a, b) is not None) for a in members}
        self.conflicts = [against[c] & ~(1 << i) for i, c in enumerate(self.classes)]
        self.neighbours = [index.preds[i] | index.succs[i] for i in range(n)]
        self.hubs = sum(1 << i for i in range(n) if self.neighbours[i].bit_count() > HUB_DEGREE)
        self.hub_reason = f"more than {HUB_NEIGHBOURS} neighbours of a node with more than {HUB_DEGREE}"

    def clash(self, a: Hashable, b: Hashable) -> str | None:
        key = (a, b)
        if key not in self._clashes:
            self._clashes[key] = _clash(a, b)
        return self._clashes[key]

    def grow(self, mask: int, w: int) -> str | None:
        """Why no kernel can hold ``mask`` and node ``w`` together, or None (monotone rules only)."""
        both = self.conflicts[w] & mask
        if both:
            j = (both & -both).bit_length() - 1
            return self.clash(self.classes[w], self.classes[j])
        if self.hubs:
            new = mask | (1 << w)
            for h in bits((self.neighbours[w] & mask | 1 << w) & self.hubs):
                if (self.neighbours[h] & new).bit_count() > HUB_NEIGHBOURS:
                    return self.hub_reason
        return None

    def __call__(self, nodes: frozenset[int]) -> str | None:
        if len(nodes) <= 1:
            return None
        counts = Counter(self.classes[i] for i in nodes)
        reasons = [r for a, count in counts.items() for b in counts
                   if (a != b or count > 1) and (r := self.clash(a, b)) is not None]
        if reasons:
            return min(reasons)
        mask = sum(1 << i for i in nodes)
        if any((self.neighbours[h] & mask).bit_count() > HUB_NEIGHBOURS for h in bits(mask & self.hubs)):
            return self.hub_reason
        if len(self.index.outputs(mask)) > MAX_OUTPUTS:
            return f"more than {MAX_OUTPUTS} outputs"
        return None


def default_predicate(graph: Graph, nodes: frozenset[int]) -> str | None:
    """None when the conservative default backend can build ``nodes`` as one kernel, else why not."""
    return KernelRules(graph)(frozenset(nodes))


default_predicate.bind = KernelRules  # type: ignore[attr-defined]


# -- enumeration ------------------------------------------------------------------------

def enumerate_candidates(graph: Graph, *, max_nodes: int = 8, predicate: Predicate = default_predicate,
                         nodes: Iterable[int] | None = None) -> CandidateSet:
    """All candidate kernels of ``graph`` (or of the sub-range ``nodes``), each once, with signatures."""
    if max_nodes < 1:
        raise KorchError(f"max_nodes must be at least 1, got {max_nodes}")
    index = GraphIndex(graph)
    masks, rejected = _search(graph, index, max_nodes, predicate, nodes)
    signer = Signer(graph)
    candidates = []
    for mask in masks:
        members = frozenset(bits(mask))
        outputs = index.outputs(mask)
        candidates.append(Candidate(id=len(candidates), nodes=members, inputs=index.inputs(mask),
                                    outputs=outputs, signature=signer(members, outputs)))
    return CandidateSet(candidates=candidates, rejected=dict(rejected.most_common()))


def _search(graph: Graph, index: GraphIndex, max_nodes: int, predicate: Predicate,
            nodes: Iterable[int] | None) -> tuple[list[int], Counter]:
    """The bitsets of all candidates, in ESU order, and the rejection counts."""
    n = len(graph.nodes)
    if nodes is None:
        allowed = (1 << n) - 1
    else:
        allowed = 0
        for i in nodes:
            if not 0 <= i < n:
                raise KorchError(f"node index {i} out of range for a graph of {n} nodes")
            allowed |= 1 << i
    bind = getattr(predicate, "bind", None)
    check = bind(graph) if bind is not None else (lambda s: predicate(graph, s))
    grow = getattr(check, "grow", None)
    nbr = [(index.preds[i] | index.succs[i]) & allowed for i in range(n)]
    anc, desc = index.anc, index.desc
    found: list[int] = []
    rejected: Counter = Counter()

    def hopeless(forced: int, new: int) -> bool:
        """Whether no valid set holds ``new`` and the nodes ``forced`` that convexity then requires."""
        if (new | forced).bit_count() > max_nodes or forced & ~allowed:
            return True
        if grow is not None:
            for f in bits(forced):
                if grow(new, f) is not None:
                    return True
                new |= 1 << f
        return False

    def test(mask: int) -> None:
        reason = check(frozenset(bits(mask)))
        if reason is None:
            found.append(mask)
        else:
            rejected[reason] += 1

    def extend(sub: int, size: int, ext: int, closed: int, anc_s: int, desc_s: int, higher: int) -> None:
        while ext:
            low = ext & -ext
            ext ^= low
            w = low.bit_length() - 1
            if grow is not None and (reason := grow(sub, w)) is not None:
                rejected[reason] += 1
                continue
            new = sub | low
            a, d = anc_s | anc[w], desc_s | desc[w]
            forced = a & d & ~new
            if forced:
                rejected[NOT_CONVEX] += 1
                if hopeless(forced, new):
                    continue
            else:
                test(new)
            if size + 1 < max_nodes:
                extend(new, size + 1, ext | (nbr[w] & ~closed & higher), closed | nbr[w], a, d, higher)

    for v in bits(allowed):
        bit = 1 << v
        test(bit)
        if max_nodes > 1:
            higher = allowed & ~((bit << 1) - 1)
            extend(bit, 1, nbr[v] & higher, nbr[v] | bit, anc[v], desc[v], higher)
    return found, rejected
