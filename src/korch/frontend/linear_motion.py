"""A 1x1 convolution that reads a channel concatenation, split into one convolution per part, and each part
moved before the upsampling Resize that made it: the same arithmetic on fewer pixels, and no concatenation.
Then a 1x1 convolution of a token projection laid out as a map folds into that projection.

All three moves are exact in real arithmetic:

* ``Conv(Concat(x_0..x_n; axis=1), W, B) = Conv(x_0, W_0, B) + ... + Conv(x_n, W_n)``, ``W_k`` the columns
  of ``W`` that read ``x_k``'s channels.
* A 1x1 convolution mixes the channels of each pixel on its own; a linear or nearest Resize mixes pixels of
  each channel with weights that sum to one. So ``Conv(Resize(x), W, B) = Resize(Conv(x, W, B))``, the bias
  included.
* ``Conv(Reshape(Transpose(A @ Wm + bm)), Wk, bk) = Reshape(Transpose(A @ (Wm Wk^T) + (bm Wk^T + bk)))``,
  with the transpose swapping tokens and channels and the reshape splitting the tokens into the map's pixels.

Segformer's decoder (four maps upsampled to a quarter of the image, concatenated, fused by one 1x1
convolution of 1024 channels to 256) then runs three quarters of its fuse convolution on maps 4, 16 and 64
times smaller, and never writes the 64 MiB concatenation that its fused kernel read cold; each part then folds
into the linear layer that unified its stage's channels (32, 64, 160 or 256 to 256). Feature-pyramid heads
have the same shape. A split happens only where a part moves before a Resize and that costs fewer element
operations (``_moving_saves``), a fold only where it costs fewer multiply-adds; otherwise the graph is left as
it is. ``config.move_linear_maps`` (``KORCH_MOVE_LINEAR_MAPS=0``) turns both off. The executable is still
checked against ONNX Runtime running the model as given.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from onnx import NodeProto, helper

from korch import config
from korch.frontend.graph import attributes, fresh_name, is_op, producers_and_readers

Shapes = dict[str, tuple[tuple[int, ...] | None, str | None]]


def move_linear_maps(nodes: list[NodeProto], outputs: list[str], constants: dict[str, np.ndarray],
                     shapes: Shapes, opset: int) -> tuple[list[NodeProto], list[str]]:
    """Split and move every 1x1 convolution of a concatenation, or fold it into the token projection it reads,
    as above, where that saves; the new node list (not sorted) and a line per convolution rewritten (none:
    nothing changed). New weights, biases, sizes and shapes go into ``constants``."""
    if not config.move_linear_maps or opset < 11:  # Resize-10 has no sizes input
        return nodes, []
    producer, readers = producers_and_readers(nodes, outputs)
    names = set(producer) | set(constants) | set(readers)

    def fresh(stem: str) -> str:
        return fresh_name(stem, names)

    removed: set[int] = set()
    added: list[NodeProto] = []
    done: list[str] = []
    for conv in nodes:
        if not _plain_pointwise_conv(conv, constants) or id(producer.get(conv.input[0])) in removed:
            continue
        label = conv.name or conv.output[0]
        weight = constants[conv.input[1]]
        concat = _concat_read_by(conv, producer, readers, shapes, weight.ndim)
        moved = [_movable_resize(producer.get(part), readers, constants, shapes, weight.shape[0])
                 for part in concat.input] if concat is not None else []
        if any(moved):
            added += _split(conv, concat, moved, weight, constants, shapes, fresh)
            removed.update({id(conv), id(concat)} | {id(resize) for resize in moved if resize is not None})
            done.append(f"1x1 Conv '{label}' split over its {len(moved)} concatenated inputs, "
                        f"{sum(r is not None for r in moved)} moved before their upsampling Resize")
            continue
        projection = _projection_read_by(conv, producer, readers, constants, shapes)
        if projection is not None:
            added += _fold(conv, projection, constants, shapes, fresh)
            removed.update({id(conv)} | {id(node) for node in projection.nodes})
            matmul = projection.matmul.name or projection.matmul.output[0]
            done.append(f"1x1 Conv '{label}' folded into the MatMul '{matmul}' that projects its tokens")
    if not added:
        return nodes, []
    return [node for node in nodes if id(node) not in removed] + added, done


def _plain_pointwise_conv(conv: NodeProto, constants) -> bool:
    """A 1x1 convolution of constant weights (and bias), group 1, stride 1, no padding: a matrix over channels."""
    if not is_op(conv, "Conv") or len(conv.input) < 2 or conv.input[1] not in constants:
        return False
    if len(conv.input) > 2 and conv.input[2] and conv.input[2] not in constants:
        return False
    weight = constants[conv.input[1]]
    attrs = attributes(conv)
    return (weight.ndim >= 3 and all(k == 1 for k in weight.shape[2:]) and attrs.get("group", 1) == 1
            and all(s == 1 for s in attrs.get("strides", [1])) and not any(attrs.get("pads", [0]))
            and attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", b"VALID"))


def _concat_read_by(conv: NodeProto, producer, readers, shapes, rank: int) -> NodeProto | None:
    """The channel Concat a plain 1x1 convolution (of ``rank``-d values) reads, where only that convolution reads
    it and every part's shape is known."""
    concat = producer.get(conv.input[0])
    if concat is None or not is_op(concat, "Concat") or readers.get(concat.output[0]) != 1:
        return None
    axis = attributes(concat).get("axis")
    parts = [shapes.get(part, (None, None))[0] for part in concat.input]
    if axis is None or axis % rank != 1 or len(parts) < 2 or any(p is None or len(p) != rank for p in parts):
        return None
    return concat


def _movable_resize(resize: NodeProto | None, readers, constants, shapes, out_channels: int) -> NodeProto | None:
    """``resize`` where a 1x1 convolution to ``out_channels`` can move before it and is cheaper there."""
    if resize is None or not is_op(resize, "Resize") or readers.get(resize.output[0]) != 1:
        return None
    attrs = attributes(resize)
    exact = (attrs.get("mode", b"nearest") in (b"nearest", b"linear") and not attrs.get("antialias", 0)
             and attrs.get("coordinate_transformation_mode", b"half_pixel") != b"tf_crop_and_resize"
             and attrs.get("keep_aspect_ratio_policy", b"stretch") == b"stretch")
    before, after = shapes.get(resize.input[0], (None, None))[0], shapes.get(resize.output[0], (None, None))[0]
    if not exact or before is None or after is None or tuple(before[:2]) != tuple(after[:2]):
        return None
    sizes = resize.input[3] if len(resize.input) > 3 else ""
    if sizes and sizes not in constants:
        return None
    return resize if _moving_saves(before, after, out_channels) else None


def _moving_saves(before: tuple[int, ...], after: tuple[int, ...], out_channels: int) -> bool:
    """Whether the convolution costs fewer multiply-adds and resized elements before the Resize than after."""
    channels, small, large = before[1], math.prod(before[2:]), math.prod(after[2:])
    moved = out_channels * channels * small + out_channels * large
    kept = channels * large + out_channels * channels * large
    return moved < kept


def _split(conv: NodeProto, concat: NodeProto, moved: list[NodeProto | None], weight: np.ndarray,
           constants: dict[str, np.ndarray], shapes: Shapes, fresh) -> list[NodeProto]:
    """One convolution per part of ``concat`` (before its Resize where ``moved`` names one), summed into
    ``conv``'s output."""
    out = conv.output[0]
    bias = conv.input[2] if len(conv.input) > 2 else ""
    new: list[NodeProto] = []
    sums: list[str] = []
    start = 0
    for k, (part, resize) in enumerate(zip(concat.input, moved)):
        channels = shapes[part][0][1]
        part_weight = fresh(f"{conv.input[1]}_part{k}")
        constants[part_weight] = np.ascontiguousarray(weight[:, start:start + channels])
        start += channels
        source = resize.input[0] if resize is not None else part
        conv_inputs = [source, part_weight] + ([bias] if bias and k == 0 else [])
        summand = fresh(f"{out}_part{k}")
        conv_out = fresh(f"{summand}_small") if resize is not None else summand
        new.append(helper.make_node("Conv", conv_inputs, [conv_out], name=fresh(f"{conv.name or 'conv'}_part{k}")))
        new[-1].attribute.extend(conv.attribute)
        if resize is not None:
            new.append(_resize_of(resize, conv_out, summand, weight.shape[0], constants, shapes, fresh))
        sums.append(summand)
    total = sums[0]
    for k, summand in enumerate(sums[1:], start=1):
        total_out = out if k == len(sums) - 1 else fresh(f"{out}_sum{k}")
        new.append(helper.make_node("Add", [total, summand], [total_out], name=fresh(f"{conv.name or 'conv'}_sum{k}")))
        total = total_out
    return new


class _Projection(NamedTuple):
    """A token projection laid out as a map: ``MatMul`` by a constant, an ``Add`` of the constant ``bias`` (or
    none), a ``Transpose`` of tokens and channels, a ``Reshape`` into pixels; ``nodes``, all of them."""

    matmul: NodeProto
    bias: str | None
    reshape: NodeProto
    nodes: tuple[NodeProto, ...]


def _projection_read_by(conv: NodeProto, producer, readers, constants, shapes) -> _Projection | None:
    """The token projection ``conv`` reads as a map, each node read only by the next, where folding ``conv``
    into it saves multiply-adds."""
    reshape = producer.get(conv.input[0])
    if not _sole_reader(reshape, "Reshape", conv.input[0], readers):
        return None
    transpose = producer.get(reshape.input[0])
    if not _sole_reader(transpose, "Transpose", reshape.input[0], readers):
        return None
    tokens, bias, nodes = transpose.input[0], None, [reshape, transpose]
    add = producer.get(tokens)
    if _sole_reader(add, "Add", tokens, readers):  # a bias: the constant operand, on either side
        consts = [x for x in add.input if x in constants]
        if len(consts) != 1:
            return None
        bias, tokens = consts[0], next(x for x in add.input if x not in constants)
        nodes.append(add)
    matmul = producer.get(tokens)
    if not _sole_reader(matmul, "MatMul", tokens, readers) or matmul.input[1] not in constants:
        return None
    weight = constants[matmul.input[1]]
    token_shape = shapes.get(transpose.input[0], (None, None))[0]
    grid = shapes.get(reshape.output[0], (None, None))[0]
    if (list(attributes(transpose).get("perm", [])) != [0, 2, 1] or weight.ndim != 2 or token_shape is None
            or grid is None or len(token_shape) != 3 or grid[:2] != (token_shape[0], token_shape[2])
            or math.prod(grid[2:]) != token_shape[1]):
        return None
    channels = token_shape[2]
    if bias is not None and (constants[bias].size != channels or constants[bias].shape[-1] != channels):
        return None  # a bias that is not one per channel
    inner, out_channels = weight.shape[0], constants[conv.input[1]].shape[0]
    if inner * out_channels >= inner * channels + channels * out_channels:
        return None
    return _Projection(matmul, bias, reshape, (*nodes, matmul))


def _sole_reader(node: NodeProto | None, op: str, value: str, readers) -> bool:
    """Whether ``node`` is an ``op`` whose output ``value`` one node alone reads."""
    return node is not None and is_op(node, op) and readers.get(value) == 1


def _fold(conv: NodeProto, projection: _Projection, constants: dict[str, np.ndarray], shapes: Shapes,
          fresh) -> list[NodeProto]:
    """The projection with ``conv``'s weights folded in, writing ``conv``'s output."""
    matmul, bias_name, reshape = projection.matmul, projection.bias, projection.reshape
    conv_weight = constants[conv.input[1]]
    conv_bias = conv.input[2] if len(conv.input) > 2 else ""
    mix = conv_weight.reshape(conv_weight.shape[:2]).astype(np.float64).T  # channels -> out channels
    weight = fresh(f"{matmul.input[1]}_folded")
    constants[weight] = (constants[matmul.input[1]].astype(np.float64) @ mix).astype(conv_weight.dtype)
    out = conv.output[0]
    projected = fresh(f"{out}_tokens")
    new = [helper.make_node("MatMul", [matmul.input[0], weight], [projected],
                            name=fresh(f"{matmul.name or 'matmul'}_folded"))]
    if bias_name or conv_bias:
        bias = np.zeros(mix.shape[1])
        if bias_name:
            bias += constants[bias_name].astype(np.float64).reshape(-1) @ mix
        if conv_bias:
            bias += constants[conv_bias].astype(np.float64)
        biased, folded_bias = fresh(f"{out}_biased"), fresh(f"{out}_bias")
        constants[folded_bias] = bias.astype(conv_weight.dtype)
        new.append(helper.make_node("Add", [projected, folded_bias], [biased], name=fresh(f"{out}_add")))
        projected = biased
    swapped = fresh(f"{out}_channels_first")
    new.append(helper.make_node("Transpose", [projected], [swapped], name=fresh(f"{out}_transpose"),
                                perm=[0, 2, 1]))
    grid = list(shapes[reshape.output[0]][0])
    grid[1] = mix.shape[1]
    shape = fresh(f"{out}_shape")
    constants[shape] = np.array(grid, dtype=np.int64)
    new.append(helper.make_node("Reshape", [swapped, shape], [out], name=fresh(f"{out}_reshape")))
    return new


def _resize_of(resize: NodeProto, source: str, out: str, channels: int, constants, shapes, fresh) -> NodeProto:
    """``resize`` applied to ``source`` (``channels`` channels) instead of its input."""
    inputs = [source, *resize.input[1:]]
    sizes = resize.input[3] if len(resize.input) > 3 else ""
    if sizes:
        rank = len(shapes[resize.input[0]][0])
        axes = attributes(resize).get("axes", range(rank))  # sizes lists the axes named (opset 18), or all
        values = constants[sizes].astype(np.int64).copy()
        values[[i for i, axis in enumerate(axes) if axis % rank == 1]] = channels
        inputs[3] = fresh(f"{sizes}_channels{channels}")
        constants[inputs[3]] = values
    node = helper.make_node("Resize", inputs, [out], name=fresh(resize.name or "resize"))
    node.attribute.extend(resize.attribute)
    return node
