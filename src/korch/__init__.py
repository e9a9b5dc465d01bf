"""korch: optimal kernel orchestration for tensor programs.

The pipeline, one sub-package per stage:
``frontend`` (ONNX / PyTorch import) -> ``fission`` (operators to primitives,
the ``ir``) -> ``orchestrate`` (candidate kernels, binary linear program)
-> ``cost`` (lower bounds, measured latencies) -> ``backends`` (kernel
generators) -> ``runtime`` (executables).

    exe = korch.optimize("model.onnx", target="cpu")     # or an nn.Module with example_inputs
    y = exe(x)                                            # numpy arrays or torch tensors
    exe = korch.load("OUTDIR")                            # what ``korch optimize -o OUTDIR`` wrote
"""

from korch import threads

threads.settle()  # before anything imports torch: see korch/threads.py

from korch.errors import KorchError  # noqa: E402
from korch.version import __version__  # noqa: E402

__all__ = ["KorchError", "__version__", "load", "optimize"]


def optimize(model, example_inputs=None, **options):
    """See ``korch.api.optimize``."""
    from korch.api import optimize as _optimize

    return _optimize(model, example_inputs, **options)


def load(outdir, device=None, target=None, allow_unchecked=False):
    """See ``korch.api.load``."""
    from korch.api import load as _load

    return _load(outdir, device, target, allow_unchecked)
