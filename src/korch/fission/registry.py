"""The table of fission rules: which function rewrites which ONNX operator at which opset.

A rule is registered with ``@fission_rule("Softmax", since=13)``. Lookup picks
the rule with the largest ``since`` not above the model's opset. The rule's
keyword-only parameters are the ONNX attributes it honours, with the spec's
defaults; ``const_inputs`` lists the input positions that must be constants
(a Reshape's shape, a Slice's starts). A rule returns ``NotImplemented`` to
decline a case it cannot express; the node then stays opaque, with a warning.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable

RuleFn = Callable[..., object]


@dataclasses.dataclass(frozen=True)
class Rule:
    op_type: str
    since: int
    fn: RuleFn
    const_inputs: tuple[int, ...] = ()
    domain: str = ""

    @property
    def attributes(self) -> frozenset[str]:
        """The ONNX attributes the rule honours: its keyword-only parameters."""
        params = inspect.signature(self.fn).parameters.values()
        return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


_RULES: dict[tuple[str, str], list[Rule]] = {}


def fission_rule(op_type: str, *, since: int = 1, const_inputs: tuple[int, ...] = (), domain: str = ""):
    """Register ``fn(builder, *inputs, **attributes)`` as the rule for ``op_type`` from opset ``since``."""

    def register(fn: RuleFn) -> RuleFn:
        rules = _RULES.setdefault((domain, op_type), [])
        if any(r.since == since for r in rules):
            warnings.warn(f"fission rule for {op_type} since opset {since} registered twice; the last one wins",
                          stacklevel=2)
            rules[:] = [r for r in rules if r.since != since]
        rules.append(Rule(op_type, since, fn, tuple(const_inputs), domain))
        rules.sort(key=lambda r: r.since)
        return fn

    return register


def find_rule(op_type: str, opset: int, domain: str = "") -> Rule | None:
    """The rule for ``op_type`` with the largest ``since`` <= ``opset``, or None."""
    domain = "" if domain == "ai.onnx" else domain
    candidates = [r for r in _RULES.get((domain, op_type), ()) if r.since <= opset]
    return candidates[-1] if candidates else None


def claimed_ops(domain: str = "") -> frozenset[str]:
    """ONNX operator types that have at least one rule."""
    return frozenset(op for (d, op) in _RULES if d == domain)
