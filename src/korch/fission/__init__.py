"""Operator fission: every ONNX operator rewritten into primitives of ``korch.ir``.

One file per operator family registers its rules (``registry.fission_rule``);
importing this package registers them all. ``fission(imported)`` runs them
over a model.
"""

from korch.fission import elementwise  # noqa: F401  (registers rules)
from korch.fission import normalization, reduce  # noqa: F401  (registers rules)
from korch.fission import linear, pooling  # noqa: F401  (registers rules)
from korch.fission import layout, resize  # noqa: F401  (registers rules)
from korch.fission.convert import FissionReport, OpaqueOperatorWarning, fission, fission_with_report
from korch.fission.registry import claimed_ops, find_rule, fission_rule

__all__ = ["FissionReport", "OpaqueOperatorWarning", "claimed_ops", "find_rule", "fission", "fission_rule",
           "fission_with_report"]
