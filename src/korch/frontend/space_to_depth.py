"""A convolution of a space-to-depth concatenation, folded into one strided convolution of the image.

YOLOv5's and YOLOX's "Focus" stem cuts the image into its four 2x2 phases (``x[..., dy::2, dx::2]``, four
chains of strided Slices), concatenates them over channels and convolves the result. That is one convolution
of the image itself, twice the kernel, twice the stride, twice the padding: with ``z[g*C + c, h, w] =
x[c, 2h + dy_g, 2w + dx_g]``,

    Conv(z, W; stride s, pads p)[o, h, w] = sum W[o, g*C + c, i, j] x[c, 2(s*h + i - p) + dy_g, ...]
                                          = Conv(x, W'; stride 2s, pads 2p)[o, h, w],
    W'[o, c, 2i + dy_g, 2j + dx_g] = W[o, g*C + c, i, j],

every tap ``u = 2i + dy`` of W' met once, and z's zero padding is x's. The multiply-adds are the same; the
concatenation, which is narrower than a vector per pixel and cost YOLOX-Nano's unit a single-threaded
transposing copy, is never written. Exact in real arithmetic; only where the image's height and width are
even, the phases are four distinct ones and only the convolution reads their concatenation. ``config.
fold_space_to_depth`` (``KORCH_FOLD_SPACE_TO_DEPTH=0``) turns it off.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from korch import config
from korch.frontend.graph import attributes, fresh_name, is_op, producers_and_readers
from korch.frontend.shapes import Shapes


def fold_space_to_depth(nodes: list[NodeProto], outputs: list[str], constants: dict[str, np.ndarray],
                        shapes: Shapes) -> tuple[list[NodeProto], list[str]]:
    """Every convolution of a space-to-depth concatenation as one convolution of the image; the new node list
    (the slices left for dead-code removal) and a line per convolution rewritten."""
    if not config.fold_space_to_depth:
        return nodes, []
    producer, readers = producers_and_readers(nodes, outputs)
    names = set(producer) | set(constants) | set(readers)
    replaced: dict[int, NodeProto] = {}
    done: list[str] = []
    for conv in nodes:
        folded = _folded(conv, producer, readers, constants, shapes, names)
        if folded is not None:
            replaced[id(conv)] = folded
            done.append(f"Conv '{conv.name or conv.output[0]}' of a space-to-depth concatenation folded into one "
                        f"stride-{attributes(folded)['strides'][0]} convolution of '{folded.input[0]}'")
    return [replaced.get(id(node), node) for node in nodes], done


def _folded(conv: NodeProto, producer, readers, constants, shapes, names: set[str]) -> NodeProto | None:
    """``conv`` as one convolution of the image its concatenation's phases were cut from, or None."""
    if not is_op(conv, "Conv") or len(conv.input) < 2 or conv.input[1] not in constants:
        return None
    weight = constants[conv.input[1]]
    attrs = attributes(conv)
    if (weight.ndim != 4 or attrs.get("group", 1) != 1 or any(d != 1 for d in attrs.get("dilations", [1, 1]))
            or attrs.get("auto_pad", b"NOTSET") != b"NOTSET"):
        return None
    concat = producer.get(conv.input[0])
    if (concat is None or not is_op(concat, "Concat") or readers.get(concat.output[0]) != 1
            or attributes(concat).get("axis") not in (1, -3) or len(concat.input) != 4):
        return None
    cut = [_phase(part, producer, constants, shapes) for part in concat.input]
    if any(c is None for c in cut) or len({image for image, _ in cut}) != 1:
        return None
    image = cut[0][0]
    phases = [phase for _, phase in cut]
    shape = shapes.get(image, (None, None))[0]
    if (len(set(phases)) != 4 or shape is None or len(shape) != 4 or any(not isinstance(d, int) for d in shape)
            or shape[2] % 2 or shape[3] % 2 or weight.shape[1] != 4 * shape[1]):
        return None
    channels = shape[1]
    out, _, kh, kw = weight.shape
    folded = np.zeros((out, channels, 2 * kh, 2 * kw), weight.dtype)
    for g, (dy, dx) in enumerate(phases):
        folded[:, :, dy::2, dx::2] = weight[:, g * channels:(g + 1) * channels]
    name = fresh_name(f"{conv.input[1]}_space_to_depth", names)
    constants[name] = folded
    strides = [2 * s for s in attrs.get("strides", [1, 1])]
    pads = [2 * p for p in attrs.get("pads", [0, 0, 0, 0])]
    return helper.make_node("Conv", [image, name, *conv.input[2:]], list(conv.output), name=conv.name,
                            strides=strides, pads=pads, kernel_shape=[2 * kh, 2 * kw])


def _phase(part: str, producer, constants, shapes) -> tuple[str, tuple[int, int]] | None:
    """(the image, (dy, dx)) where ``part`` is ``image[:, :, dy::2, dx::2]`` of a 4-d image, cut by a chain of
    Slices with constant arguments that leaves the first two axes whole; else None."""
    start, step = [0, 0, 0, 0], [1, 1, 1, 1]
    name = part
    while True:
        node = producer.get(name)
        if node is None or not is_op(node, "Slice"):
            break
        args = [constants.get(a) if a else None for a in node.input[1:5]]
        if len(node.input) < 3 or any(a is None for a in args[:2]) or any(
                node.input[i] and constants.get(node.input[i]) is None for i in range(3, len(node.input))):
            return None
        source = shapes.get(node.input[0], (None, None))[0]
        if source is None or len(source) != 4:
            return None
        starts, ends = args[0].tolist(), args[1].tolist()
        axes = args[2].tolist() if len(args) > 2 and args[2] is not None else list(range(len(starts)))
        steps = args[3].tolist() if len(args) > 3 and args[3] is not None else [1] * len(starts)
        for axis, s, e, t in zip(axes, starts, ends, steps):
            axis %= 4
            if t <= 0 or s < 0 or not 0 <= s < source[axis]:
                return None
            # walking back from the part: its index i is start + i * step of this slice's output, which is
            # s + (start + i * step) * t of this slice's input
            start[axis] = s + start[axis] * t
            step[axis] *= t
        name = node.input[0]
    image_shape = shapes.get(name, (None, None))[0]
    part_shape = shapes.get(part, (None, None))[0]
    if name == part or image_shape is None or part_shape is None or len(image_shape) != 4:
        return None
    whole = start[:2] == [0, 0] and step[:2] == [1, 1] and tuple(part_shape[:2]) == tuple(image_shape[:2])
    halves = step[2:] == [2, 2] and all(s in (0, 1) for s in start[2:]) and all(
        isinstance(d, int) and d % 2 == 0 and p == d // 2 for d, p in zip(image_shape[2:], part_shape[2:]))
    return (name, (start[2], start[3])) if whole and halves else None
