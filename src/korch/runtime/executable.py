"""A loaded korch executable: the built kernels, the planned buffers and the launch sequence, callable.

``Executable`` is what ``korch.load`` and ``korch.optimize`` return. Call it
with one array or tensor per graph input (positionally or by name), numpy or
torch, CPU or CUDA: it checks each input's shape and dtype (a mismatch is a
``KorchError``, one line), runs the launch sequence and returns the outputs
as the caller's kind (a tensor on the executable's device, or numpy), one
value for one output, else a tuple. ``run(feeds)`` maps names to numpy arrays
both ways. Outputs are copies: a later call never changes them.

On CUDA the launch sequence is captured in a CUDA graph after warm-up and
replayed from then on (inputs copied into the captured input tensors); a
sequence that cannot be captured (an opaque primitive runs in ONNX Runtime on
the CPU) runs kernel by kernel, and ``cuda_graph`` says which. A capture that
fails is an error (``CudaGraphFailed``), never a silent switch to kernel by
kernel: ``korch optimize --no-cuda-graph`` builds one that does not capture.

With a compiled unit (``runtime/unit.py``: the whole plan in one AOTInductor
package) the unit runs instead of ``launch``: no Python between kernels, and
its outputs are fresh tensors, returned without a copy.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from korch import precision
from korch.errors import KorchError, one_line
from korch.ir import dtypes

WARMUP_CALLS = 2


class CudaGraphFailed(KorchError):
    """The launch sequence could not be captured in a CUDA graph."""


class Executable:
    def __init__(self, module: types.ModuleType, kernels: Sequence, constants: Mapping[str, torch.Tensor],
                 device: str, *, manifest: dict | None = None, use_cuda_graph: bool = True, unit=None):
        self.module, self.kernels, self.device = module, list(kernels), torch.device(device)
        self.unit = unit  # runtime.unit.CompiledUnit, or None: kernel by kernel
        self.manifest = manifest or {}
        self.check = None  # the ModelCheck against ONNX Runtime, when this process made one
        self.input_names = [name for name, _, _ in module.INPUTS]
        self.output_names = [name for name, _, _ in module.OUTPUTS]
        self.input_specs = {name: (tuple(shape), dtype) for name, shape, dtype in module.INPUTS}
        buffers = [] if unit is not None else [torch.empty(n, dtype=torch.uint8, device=self.device)
                                                for n in module.BUFFER_BYTES]
        self._slots = [] if unit is not None else [_view(buffers[b], shape, dtype)
                                                   for _, b, shape, dtype in module.SLOTS]
        self._constants = dict(constants)
        self._calls = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static_inputs: list[torch.Tensor] = []
        self._static_outputs: tuple[torch.Tensor, ...] = ()
        self.cuda_graph = use_cuda_graph and self.device.type == "cuda" and unit is None

    @property
    def precision(self) -> precision.Policy:
        """The float32 arithmetic it was built and checked under (the manifest's; older ones are fp32)."""
        return precision.get(self.manifest.get("precision", precision.DEFAULT))

    @property
    def calls_until_replay(self) -> int:
        """Calls after which this one replays its CUDA graph (0 without one): a check of a replayed call makes
        this many calls first."""
        return max(WARMUP_CALLS - self._calls, 0) if self.cuda_graph else 0

    # -- calling -------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        values = self._bind(args, kwargs)
        as_numpy = any(isinstance(v, np.ndarray) for v in values)
        tensors = [self._as_input(name, v) for name, v in zip(self.input_names, values)]
        outputs = self._launch(tensors)
        results = tuple(o.cpu().numpy() if as_numpy else o for o in outputs)
        return results[0] if len(results) == 1 else results

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Graph inputs by name -> graph outputs by name, as numpy arrays."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise KorchError(f"missing input(s) {', '.join(missing)}; the executable takes {self.describe_inputs()}")
        unknown = [n for n in feeds if n not in self.input_specs]
        if unknown:
            raise KorchError(f"unknown input(s) {', '.join(unknown)}; the executable takes {self.describe_inputs()}")
        tensors = [self._as_input(n, feeds[n]) for n in self.input_names]
        return {name: o.cpu().numpy() for name, o in zip(self.output_names, self._launch(tensors))}

    def _launch(self, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        # torch's TF32 switches are global: a GPU executable sets its own for its call (a CPU ignores them)
        with torch.inference_mode(), precision.applied(self.precision) if self.device.type == "cuda" \
                else contextlib.nullcontext():
            if self.unit is not None:
                self.size_of(inputs)  # inputs that disagree on a dynamic dimension fail here, not in the unit
                return self.unit(*inputs)
            if self.cuda_graph and self._calls >= WARMUP_CALLS:
                outputs = self._replay(inputs)
            else:
                outputs = self.launch_sequence(self.kernels, inputs)
            self._calls += 1
            return tuple(o.clone() for o in outputs)

    def launch_sequence(self, kernels: Sequence, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The plan's launch sequence once with ``kernels``: its own, or stand-ins in the same order
        (``kernel_times`` stamps each call). No graph, no precision switches, outputs not copied."""
        if self.unit is not None:
            raise KorchError("a compiled unit runs its kernels as one library call")
        return self.module.launch(kernels, self._slots, self._constants, *inputs)

    def _replay(self, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if self._graph is None:
            self._static_inputs = [x.clone() for x in inputs]
            try:
                graph = torch.cuda.CUDAGraph()
                torch.cuda.synchronize(self.device)
                with torch.cuda.graph(graph):
                    self._static_outputs = self.launch_sequence(self.kernels, self._static_inputs)
            except Exception as exc:  # never a silent fallback: the timings and the manifest would not be its
                raise CudaGraphFailed(f"CUDA graph capture failed ({one_line(exc)}); run korch optimize with "
                                      "--no-cuda-graph to run kernel by kernel") from None
            self._graph = graph
        for static, x in zip(self._static_inputs, inputs):
            static.copy_(x)
        self._graph.replay()
        return self._static_outputs

    # -- inputs --------------------------------------------------------------------------

    def describe_inputs(self) -> str:
        return ", ".join(f"{n} {self._describe_shape(n, s)} {d}" for n, (s, d) in self.input_specs.items())

    def _bind(self, args: Sequence, kwargs: Mapping) -> list:
        if len(args) > len(self.input_names):
            raise KorchError(f"{len(args)} inputs given; the executable takes {len(self.input_names)}: "
                             f"{self.describe_inputs()}")
        bound = dict(zip(self.input_names, args))
        for name, value in kwargs.items():
            if name not in self.input_specs:
                raise KorchError(f"unknown input {name!r}; the executable takes {self.describe_inputs()}")
            if name in bound:
                raise KorchError(f"input {name!r} given twice")
            bound[name] = value
        missing = [n for n in self.input_names if n not in bound]
        if missing:
            raise KorchError(f"missing input(s) {', '.join(missing)}; the executable takes {self.describe_inputs()}")
        return [bound[n] for n in self.input_names]

    def _as_input(self, name: str, value) -> torch.Tensor:
        shape, dtype = self.input_specs[name]
        if isinstance(value, torch.Tensor):
            got_dtype = str(value.dtype).removeprefix("torch.")
        else:
            value = np.asarray(value)
            got_dtype = value.dtype.name
        if tuple(value.shape) != self._expected_shape(name, shape, tuple(value.shape)) or got_dtype != dtype:
            raise KorchError(f"input {name!r}: got {'x'.join(map(str, value.shape)) or 'scalar'} {got_dtype}, "
                             f"expected {self._describe_shape(name, shape)} {dtype}")
        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value, order="C"))
        return tensor.to(self.device).contiguous()

    # -- a unit serving a range of sizes (korch optimize --dynamic) ------------------------

    @property
    def size_range(self) -> dict | None:
        """``{"dim", "low", "high", "axes": {input: [axis, ...]}}`` when the executable serves a range of sizes
        of one dimension (its declared shapes are at ``high``), else None."""
        return self.manifest.get("sizes")

    def _expected_shape(self, name: str, shape: tuple[int, ...], got: tuple[int, ...]) -> tuple[int, ...]:
        sizes = self.size_range
        axes = sizes["axes"].get(name, ()) if sizes else ()
        if not axes or len(got) != len(shape) or not sizes["low"] <= got[axes[0]] <= sizes["high"]:
            return shape
        return tuple(got[axes[0]] if axis in axes else d for axis, d in enumerate(shape))

    def _describe_shape(self, name: str, shape: tuple[int, ...]) -> str:
        sizes = self.size_range
        axes = sizes["axes"].get(name, ()) if sizes else ()
        span = f"{sizes['dim']}({sizes['low']}..{sizes['high']})" if axes else ""
        return "x".join(span if axis in axes else str(d) for axis, d in enumerate(shape)) or "scalar"

    def size_of(self, tensors: Sequence[torch.Tensor]) -> int | None:
        """The size of the dimension in ``tensors`` (one per input, already checked one by one), None without
        a range; inputs that disagree on it are a ``KorchError``."""
        sizes = self.size_range
        if not sizes:
            return None
        found = {f"{name} axis {axis}": int(x.shape[axis]) for name, x in zip(self.input_names, tensors)
                 for axis in sizes["axes"].get(name, ())}
        if len(set(found.values())) > 1:
            raise KorchError(f"the inputs disagree on {sizes['dim']}: "
                             + ", ".join(f"{where} is {size}" for where, size in found.items()))
        return next(iter(found.values()), None)


def _view(buffer: torch.Tensor, shape: Sequence[int], dtype: str) -> torch.Tensor:
    torch_dtype = dtypes.torch_dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return buffer[:count * torch_dtype.itemsize].view(torch_dtype).view(tuple(shape))
