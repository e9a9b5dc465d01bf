"""The plan as one torch module (``PlanModule``), which ``unit.py`` exports and compiles into a unit: every planned
kernel's steps in plan order, each kernel's operations annotated with its index and layout (``boundaries.py``
reads them while Inductor compiles), with the steps that replace primitives by ONNX Runtime's kernels (MLAS
products and softmaxes, ``backends/ort_steps.py``; blocked convolutions, ``backends/nchwc.py``; a first
convolution computed directly, ``backends/direct_conv.py``).
"""

from __future__ import annotations

import random
import re

import numpy as np
import torch

from korch.backends import direct_conv, nchwc, ort_gemm, ort_steps
from korch.backends.inductor import LibraryConvBackend
from korch.backends.mlas import MlasBackend
from korch.backends.torch_ops import node_function, rewritten_steps
from korch.ir.graph import CHANNELS_LAST, Graph
from korch.ir.interpret import as_torch
from korch.ir.sizes import SizeFunctions
from korch.orchestrate.plan import Plan
from korch.runtime.boundaries import LAYOUT, TAG


def mlas_kernels(plan: Plan) -> frozenset[str]:
    """The primitives of the kernels ``plan`` measured with ONNX Runtime's MLAS (``backends/mlas.py``)."""
    return _kernels_of(plan, MlasBackend.name)


def library_conv_kernels(plan: Plan) -> frozenset[str]:
    """The primitives of the kernels ``plan`` measured with the library's 1x1 convolutions (``LibraryConvBackend``)."""
    return _kernels_of(plan, LibraryConvBackend.name)


def ort_primitives(graph: Graph, plan: Plan, within: str) -> frozenset[str] | None:
    """The primitives a unit may run in MLAS (``Variant.ort_within``); None: any."""
    if within == "planned":
        return mlas_kernels(plan)
    if within == "activations":
        return ort_gemm.of_activations(graph)
    return None


def _kernels_of(plan: Plan, backend: str) -> frozenset[str]:
    return frozenset(n for k in plan.kernels if k.backend == backend for n in k.nodes)


class PlanModule(torch.nn.Module):
    """The plan as one torch module: graph inputs in, graph outputs out, each kernel's operations tagged.

    With ``sizes`` (``ir/sizes.py``) it computes the graph at the size its inputs have: exported with that
    dimension dynamic, one unit serves a range of sizes (``graph`` is at the range's largest)."""

    def __init__(self, graph: Graph, plan: Plan, device: str = "cpu", ort_kernels: bool = False,
                 sizes: SizeFunctions | None = None, channels_last: bool = False, pointwise_products: bool = True,
                 ort_within: str = "all", mkl_products: bool = False, blocked: bool = False, direct: bool = False):
        super().__init__()
        self._constant_attr = {}
        for i, (name, value) in enumerate(graph.constants.items()):
            attr = f"c{i}_{re.sub(r'[^0-9A-Za-z_]', '_', name)[:40]}"
            self.register_buffer(attr, as_torch(value).to(device), persistent=True)
            self._constant_attr[name] = attr
        self._graph, self._plan, self._device, self._sizes = graph, plan, device, sizes
        self._channels_last, self._pointwise_products = channels_last, pointwise_products  # node_function's
        self._library_convs = library_conv_kernels(plan)  # their 1x1 convolutions the library's, as measured
        self.token, self._replaced = None, {}
        self._block = nchwc.block() if blocked else 0
        if direct:
            self._replaced = direct_conv.replacements(graph, [k.nodes for k in plan.kernels], self._add_constant)
            if self._replaced:
                ort_gemm.open_library()
        if blocked:
            self._replace_by_blocked_convolutions(graph)
        if ort_kernels:
            self._replace_by_ort_kernels(graph, ort_primitives(graph, plan, ort_within), mkl_products)
        # found once, on the graph at its full size, outside any tracing: the activations' probes run torch ops
        # (a dynamic unit builds its steps again at each size while torch.export traces) and no rewrite depends
        # on a size
        self._rewritten = rewritten_steps(graph, [k.nodes for k in plan.kernels], device, self._replaced)
        self._kernels = None if sizes else self._steps(graph)
        self._inputs, self._outputs = list(graph.inputs), list(graph.outputs)

    def _replace_by_ort_kernels(self, graph: Graph, within: frozenset[str] | None, mkl_products: bool) -> None:
        """Route products and softmaxes to ONNX Runtime's kernels (``backends/ort_steps.py``), those of the
        primitives ``within`` if given; with ``mkl_products`` the products by constant weights to MKL's."""
        # a key the unit's calls carry, so that sessions of two units loaded in one process never mix
        self.token = self.token or random.getrandbits(62)
        if self._replaced:  # direct and blocked convolutions first (``__init__``, ``_replace_by_blocked_convolutions``)
            within = frozenset(within if within is not None else (n.name for n in graph.nodes)) - set(self._replaced)
        self._replaced.update(ort_steps.replacements(graph, [k.nodes for k in self._plan.kernels], self.token,
                                                     self._add_constant, within, mkl_products))
        if self._replaced:
            ort_gemm.open_library()
        else:
            self.token = None

    def _replace_by_blocked_convolutions(self, graph: Graph) -> None:
        """Run convolutions in ONNX Runtime's blocked layout (``backends/nchwc.py``), with the bias, residual sum
        and ReLU or clip after them in their kernels."""
        self.token = random.getrandbits(62)
        self._replaced.update(nchwc.replacements(graph, [k.nodes for k in self._plan.kernels], self.token,
                                                 self._add_constant, self._block, skip=self._replaced))
        ort_gemm.open_library()

    def _add_constant(self, name: str, value: np.ndarray) -> str:
        """A constant the unit's own steps read (a weight laid out for MLAS), as ``name``."""
        attr = f"k{len(self._constant_attr)}_{re.sub(r'[^0-9A-Za-z_]', '_', name)[:40]}"
        self.register_buffer(attr, torch.from_numpy(value).to(self._device), persistent=True)
        self._constant_attr[name] = attr
        return name

    def _steps(self, graph: Graph) -> list:
        nodes = {node.name: node for node in graph.nodes}

        def step(name: str, channels_last: bool):
            products = self._pointwise_products and name not in self._library_convs
            return self._replaced.get(name) or self._rewritten.get(name) or \
                (node_function(graph, nodes[name], self._device, channels_last, products), nodes[name].inputs,
                 nodes[name].outputs)

        # a kernel's values are channels-last at channels-last boundaries, or where the plan stores them so
        kernels = [[(n, step(n, self._channels_last or k.layout == CHANNELS_LAST)) for n in k.nodes
                    if n not in self._replaced or self._replaced[n]] for k in self._plan.kernels]
        if not self._block:
            return [[s for _, s in kernel] for kernel in kernels]
        # elementwise steps over values stored blocked compute blocked (in plan order: what they read is stored so)
        stored_blocked, steps = set(), []
        for kernel in kernels:
            steps.append([])
            for name, s in kernel:
                if not s[2][0].endswith(nchwc.BLOCKED):
                    s = nchwc.blocked_step(graph, nodes[name], s, stored_blocked, self._block) or s
                stored_blocked.update(out.removesuffix(nchwc.BLOCKED) for out in s[2] if out.endswith(nchwc.BLOCKED))
                steps[-1].append(s)
        return steps

    def _value(self, graph: Graph, env: dict, name: str) -> torch.Tensor:
        """``env[name]``, or a value there in the other layout: a blocked one (``nchwc.BLOCKED`` suffix)
        converted from the plain one, kept for later readers; a plain one a view of the blocked one."""
        if name in env:
            return env[name]
        if name.endswith(nchwc.BLOCKED):
            env[name] = nchwc.to_blocked(self._value(graph, env, name.removesuffix(nchwc.BLOCKED)), self._block)
            return env[name]
        return nchwc.from_blocked(env[name + nchwc.BLOCKED], graph.tensors[name].shape[1])

    def _constants(self, graph: Graph) -> dict[str, torch.Tensor]:
        env = {name: getattr(self, attr) for name, attr in self._constant_attr.items()}
        for name in self._sizes.varying_constants(graph) if self._sizes else ():
            # the leading block; index_select, since a slice of a slice makes torch.export guard on the size
            value = env[name]
            for axis, (size, full) in enumerate(zip(graph.tensors[name].shape, value.shape)):
                if not isinstance(size, int) or size != full:
                    value = value.index_select(axis, torch.arange(size, device=value.device))
            env[name] = value
        return env

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        graph, steps = self._graph, self._kernels
        if self._sizes is not None:
            name, axes = next(iter(self._sizes.input_axes.items()))
            graph = self._sizes.graph_at(graph, inputs[self._inputs.index(name)].shape[axes[0]])
            steps = self._steps(graph)
        env = self._constants(graph)
        env.update(zip(self._inputs, inputs))
        for i, kernel_steps in enumerate(steps):
            with torch.fx.traceback.annotate({TAG: i, LAYOUT: self._plan.kernels[i].layout}):
                for fn, ins, outs in kernel_steps:
                    env.update(zip(outs, fn(*[self._value(graph, env, n) if n else None for n in ins])))
        # a graph output may be an input or a constant: outputs are fresh tensors the caller owns
        return tuple(self._value(graph, env, n) if n not in self._constant_attr and n not in self._inputs
                     else env[n].clone() for n in self._outputs)


def example_inputs(graph: Graph, device: str) -> tuple[torch.Tensor, ...]:
    from korch.backends.check import random_inputs

    return tuple(x.to(device) for x in random_inputs(graph))
