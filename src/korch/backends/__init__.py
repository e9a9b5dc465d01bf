"""Kernel backends: build, check and time each candidate kernel (Triton generator, TorchInductor, torch libraries)."""
