"""The IR's interpreter (the reference executor): runs a primitive graph op by op with torch on the CPU.

It is the ground truth every generated kernel is checked against, so each op is
written the plainest way its semantics (``korch/ir/ops.py``) allow: windows by
``unfold``, pads and slices by explicit index maps. Opaque nodes run in ONNX
Runtime, one node at a time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from korch import vector_math
from korch.ir import dtypes
from korch.ir.graph import Graph, Node
from korch.ir.ops import Op

vector_math.start()  # before any eager operation of the interpreter's runs on torch's threads

Kernel = Callable[..., torch.Tensor]
_TABLE: dict[Op, Kernel] = {}


def _register(*op_list: Op):
    def wrap(fn: Kernel) -> Kernel:
        for op in op_list:
            _TABLE[op] = fn
        return fn
    return wrap


def _simple(op: Op, fn: Callable) -> None:
    _TABLE[op] = lambda node, *xs: fn(*xs)


for _op, _fn in {
    Op.NEG: torch.neg, Op.ABS: torch.abs, Op.EXP: torch.exp, Op.LOG: torch.log, Op.SQRT: torch.sqrt,
    Op.RECIPROCAL: torch.reciprocal, Op.TANH: torch.tanh, Op.ERF: torch.erf, Op.SIGMOID: torch.sigmoid,
    Op.RELU: torch.relu, Op.SOFTPLUS: F.softplus, Op.FLOOR: torch.floor, Op.CEIL: torch.ceil, Op.ROUND: torch.round,
    Op.SIGN: torch.sign, Op.NOT: torch.logical_not, Op.SIN: torch.sin, Op.COS: torch.cos,
    Op.ISNAN: torch.isnan, Op.ISINF: torch.isinf,
    Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.MAX: torch.maximum, Op.MIN: torch.minimum,
    Op.EQUAL: torch.eq, Op.LESS: torch.lt, Op.LESS_EQUAL: torch.le, Op.GREATER: torch.gt,
    Op.GREATER_EQUAL: torch.ge, Op.AND: torch.logical_and, Op.OR: torch.logical_or, Op.XOR: torch.logical_xor,
    Op.WHERE: torch.where, Op.MATMUL: torch.matmul,
}.items():
    _simple(_op, _fn)


@_register(Op.DIV)
def _div(node, a, b):
    return torch.div(a, b, rounding_mode="trunc") if not a.is_floating_point() else a / b


@_register(Op.POW)
def _pow(node, a, b):
    return torch.pow(a, b).to(a.dtype)


@_register(Op.MOD)
def _mod(node, a, b):
    return torch.fmod(a, b) if node.attrs["fmod"] else torch.remainder(a, b)


@_register(Op.CAST)
def _cast(node, x):
    return x.to(dtypes.torch_dtype(node.attrs["to"]))


_REDUCE_IDENTITY = {Op.REDUCE_SUM: 0, Op.REDUCE_MEAN: float("nan"), Op.REDUCE_PROD: 1,
                    Op.REDUCE_MAX: -float("inf"), Op.REDUCE_MIN: float("inf")}


@_register(*_REDUCE_IDENTITY)
def _reduce(node, x):
    axes, keepdims, op = list(node.attrs["axes"]), bool(node.attrs["keepdims"]), node.op
    if any(x.shape[a] == 0 for a in axes):  # an empty set reduces to the op's identity
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
        if not keepdims:
            shape = [d for i, d in enumerate(shape) if i not in axes]
        value = _REDUCE_IDENTITY[op]
        if x.dtype == torch.bool:
            value = value > 0 if op in (Op.REDUCE_MIN, Op.REDUCE_PROD) else False
        elif not x.is_floating_point() and not np.isfinite(value):
            info = torch.iinfo(x.dtype)
            value = info.min if value < 0 else info.max
        return torch.full(shape, value, dtype=x.dtype)
    if op is Op.REDUCE_SUM:
        out = torch.sum(x, dim=axes, keepdim=keepdims)
    elif op is Op.REDUCE_MEAN:
        out = torch.mean(x if x.is_floating_point() else x.double(), dim=axes, keepdim=keepdims)
    elif op is Op.REDUCE_MAX:
        out = torch.amax(x, dim=axes, keepdim=keepdims)
    elif op is Op.REDUCE_MIN:
        out = torch.amin(x, dim=axes, keepdim=keepdims)
    else:
        out = x
        for axis in sorted(axes, reverse=True):
            out = torch.prod(out, dim=axis, keepdim=keepdims) if keepdims else torch.prod(out, dim=axis)
    return out.to(x.dtype)


def _lowest(dtype: torch.dtype) -> float:
    return -float("inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def windows(x: torch.Tensor, kernel, strides, dilations) -> torch.Tensor:
    """View of every pooling window: shape (N, C, *out_spatial, *kernel)."""
    k = len(kernel)
    for i in range(k):
        span = dilations[i] * (kernel[i] - 1) + 1
        x = x.unfold(2 + i, span, strides[i])  # appends a window axis of length span
    # keep every dilation-th element of each window axis
    index = (slice(None),) * (2 + k) + tuple(slice(None, None, d) for d in dilations)
    return x[index]


def pad_spatial(x: torch.Tensor, pads: Sequence[int], value: float) -> torch.Tensor:
    """Pad the spatial axes of an (N, C, *spatial) tensor; ``pads`` lists every begin, then every end."""
    k = len(pads) // 2
    torch_pads: list[int] = []
    for i in reversed(range(k)):  # F.pad lists the last axis first
        torch_pads += [pads[i], pads[k + i]]
    return F.pad(x, torch_pads, value=value)


@_register(Op.MAX_POOL)
def _max_pool(node, x):
    a = node.attrs
    views = windows(pad_spatial(x, a["pads"], _lowest(x.dtype)), a["kernel"], a["strides"], a["dilations"])
    k = len(a["kernel"])
    return torch.amax(views, dim=tuple(range(-k, 0)))


@_register(Op.AVG_POOL)
def _avg_pool(node, x):
    a = node.attrs
    k = len(a["kernel"])
    dims = tuple(range(-k, 0))
    total = torch.sum(windows(pad_spatial(x, a["pads"], 0.0), a["kernel"], a["strides"], a["dilations"]), dim=dims)
    if a["count_include_pad"]:
        count = float(np.prod(a["kernel"]))
    else:
        ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype)
        count = torch.sum(windows(pad_spatial(ones, a["pads"], 0.0), a["kernel"], a["strides"], a["dilations"]),
                          dim=dims)
    return (total / count).to(x.dtype)


@_register(Op.TRANSPOSE)
def _transpose(node, x):
    return x.permute(*node.attrs["perm"]).contiguous()


@_register(Op.RESHAPE)
def _reshape(node, x):
    return x.reshape(node.attrs["shape"])


def _take(x: torch.Tensor, axis: int, index: np.ndarray) -> torch.Tensor:
    return torch.index_select(x, axis, torch.from_numpy(np.asarray(index, dtype=np.int64)))


@_register(Op.SLICE)
def _slice(node, x):
    a = node.attrs
    for axis, (start, step) in enumerate(zip(a["starts"], a["steps"])):
        count = a["shape"][axis]
        x = _take(x, axis, start + step * np.arange(count))
    return x


@_register(Op.CONCAT)
def _concat(node, *xs):
    return torch.cat(xs, dim=node.attrs["axis"])


def pad_index(size: int, begin: int, end: int, mode: str) -> np.ndarray:
    """Source index of each padded position along one axis (-1: the constant value)."""
    pos = np.arange(-begin, size + end)
    if mode == "constant":
        return np.where((pos >= 0) & (pos < size), pos, -1)
    if mode == "edge":
        return np.clip(pos, 0, size - 1)
    if mode == "wrap":
        return np.mod(pos, size)
    period = 2 * (size - 1)  # reflect: mirror without repeating the edge
    if period == 0:
        return np.zeros_like(pos)
    folded = np.mod(pos, period)
    return np.where(folded < size, folded, period - folded)


@_register(Op.PAD)
def _pad(node, x, value=None):
    pads, mode = node.attrs["pads"], node.attrs["mode"]
    rank = x.dim()
    fill = value.item() if value is not None else 0
    for axis in range(rank):
        index = pad_index(x.shape[axis], pads[axis], pads[rank + axis], mode)
        if mode == "constant":
            gathered = _take(x, axis, np.maximum(index, 0))
            shape = [1] * rank
            shape[axis] = len(index)
            mask = torch.from_numpy(index < 0).reshape(shape)
            x = torch.where(mask, torch.tensor(fill, dtype=x.dtype), gathered)
        else:
            x = _take(x, axis, index)
    return x


@_register(Op.GATHER)
def _gather(node, x, indices):
    axis = node.attrs["axis"]
    out = torch.index_select(x, axis, indices.reshape(-1))
    return out.reshape(tuple(x.shape[:axis]) + tuple(indices.shape) + tuple(x.shape[axis + 1:]))


@_register(Op.BROADCAST)
def _broadcast(node, x):
    return x.expand(node.attrs["shape"]).contiguous()


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@_register(Op.CONV)
def _conv(node, x, w):
    a = node.attrs
    x = pad_spatial(x, a["pads"], 0.0)
    return _CONV[x.dim() - 2](x, w, stride=a["strides"], dilation=a["dilations"], groups=a["group"])


@_register(Op.CONV_TRANSPOSE)
def _conv_transpose(node, x, w):
    a = node.attrs
    k = x.dim() - 2
    full = _CONV_T[k](x, w, stride=a["strides"], dilation=a["dilations"], groups=a["group"])
    # ONNX: output_padding appends at the end, then pads crop both sides
    full = pad_spatial(full, [0] * k + list(a["output_padding"]), 0.0)
    index = (slice(None), slice(None)) + tuple(
        slice(a["pads"][i], full.shape[2 + i] - a["pads"][k + i]) for i in range(k))
    return full[index]


@_register(Op.OPAQUE)
def _opaque(node, *xs):
    from korch.ir.ort import run_node

    return run_node(node, [None if x is None else x.numpy() for x in xs])


def run_node(node: Node, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Evaluate one primitive; returns its outputs in order."""
    result = _TABLE[node.op](node, *inputs)
    if isinstance(result, (list, tuple)):
        return [torch.as_tensor(r) if isinstance(r, np.ndarray) else r for r in result]
    return [result]


def as_torch(value: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    value = np.asarray(value, order="C")  # (not ascontiguousarray: it makes 0-d arrays 1-d)
    # torch warns on read-only arrays (imported weights wrap the model's bytes); no op here writes to its inputs
    return torch.from_numpy(value if value.flags.writeable else value.copy())


def run(graph: Graph, feeds: Mapping[str, np.ndarray | torch.Tensor],
        outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``feeds`` (one array per graph input); returns the requested tensors (default: the graph outputs)."""
    wanted = list(outputs or graph.outputs)
    missing = [n for n in graph.inputs if n not in feeds]
    if missing:
        raise ValueError(f"missing inputs: {missing}")
    env: dict[str, torch.Tensor] = {name: as_torch(v) for name, v in graph.constants.items()}
    for name in graph.inputs:
        env[name] = as_torch(feeds[name])
    last_use = _last_uses(graph, wanted)
    for step, node in enumerate(graph.nodes):
        results = run_node(node, [env[name] if name else None for name in node.inputs])
        for name, value in zip(node.outputs, results):
            expected = graph.tensors[name]
            if tuple(value.shape) != expected.shape:
                raise AssertionError(f"{node.name} ({node.op.value}) made {name} with shape "
                                     f"{tuple(value.shape)}, IR says {expected.shape}")
            env[name] = value
        for name in last_use.get(step, ()):
            env.pop(name, None)
    return {name: env[name].numpy() for name in wanted}


def _last_uses(graph: Graph, keep: Sequence[str]) -> dict[int, list[str]]:
    """For each node index, the intermediate tensors no later node reads (freed to bound memory)."""
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for name in (*node.inputs, *node.outputs):
            last[name] = i
    keep_set = set(keep) | set(graph.constants) | set(graph.inputs)
    by_step: dict[int, list[str]] = {}
    for name, i in last.items():
        if name not in keep_set:
            by_step.setdefault(i, []).append(name)
    return by_step


@functools.cache
def supported_ops() -> frozenset[Op]:
    return frozenset(_TABLE)
