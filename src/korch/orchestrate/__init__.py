"""Kernel orchestration: enumerate candidate kernels, cost them, and select the
cheapest executable set of kernels (the binary linear program of Korch)."""
