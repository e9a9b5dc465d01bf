"""Costing candidate kernels: device ceilings, the host CPU probe, and the roofline lower bound.

``get_device(target)`` gives a ``Device`` of peak rates; ``kernel_work`` counts
what a candidate kernel must do at the least; ``lower_bound`` turns the two
into seconds no implementation of the kernel can beat (docs/cost.md); ``part_columns`` and
``part_times`` (or ``measured_parts``, the two at once) give the products and convolutions timed alone that
tighten it (``parts.py``).
"""

from korch.cost.devices import GPUS, KNOWN_TARGETS, Device, get_device
from korch.cost.parts import measured_parts, part_columns, part_times
from korch.cost.roofline import KernelWork, candidate_bounds, kernel_work, lower_bound

__all__ = ["GPUS", "KNOWN_TARGETS", "Device", "KernelWork", "candidate_bounds", "get_device", "kernel_work",
           "lower_bound", "measured_parts", "part_columns", "part_times"]
