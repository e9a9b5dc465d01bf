"""korch's own Triton generator: one Triton kernel per candidate, for NVIDIA GPUs (and the interpreter on CPUs)."""
