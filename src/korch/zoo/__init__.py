"""korch's model zoo: the Korch paper's benchmark networks, built in plain torch,
and small public architectures from Hugging Face ``transformers`` (``hf_*``, see ``korch.zoo.hf``).

Owns the registry (name -> description, input shapes, the paper's primitive
node count, constructor), building a model with seeded random weights and
seeded example inputs, and exporting it to ONNX with a cache::

    model, inputs = build("candy")        # eval() module, example inputs
    path = export("candy")                # cached .onnx under config.cache_dir/zoo

No pretrained weights: every weight is random, drawn after
``torch.manual_seed(seed)``; ``common.randomize`` sets up the norm layers.
The ``hf_*`` models need ``transformers`` only when built or exported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from korch import config
from korch.errors import KorchError
from korch.frontend.torch_module import export_module
from korch.zoo import candy, efficientvit, hf, segformer, transformer, yolov4, yolox
from korch.zoo.common import randomize

__all__ = ["ZOO_VERSION", "ZooModel", "build", "export", "get", "list_models"]

# Bump when a model's definition, weights or export change: cached files carry it.
ZOO_VERSION = 2

# Largest spatial side of the inputs that calibrate BatchNorm statistics:
# statistics of convs over i.i.d. noise barely depend on the image size, and
# calibrating EfficientViT at 2048x2048 would double its build time.
_CALIBRATION_MAX_SIDE = 512
# Inputs per calibration batch. The deep features of a noise image vary little
# across pixels; statistics of one image would normalize by that tiny variance
# and amplify any other image's deviations layer after layer. Statistics pooled
# over several images include the variation between images.
_CALIBRATION_BATCH = 4


@dataclass(frozen=True)
class ZooModel:
    """What the zoo knows about one model without building it."""

    name: str
    description: str
    input_shapes: dict[str, tuple[int, ...]] = field(hash=False)
    # Primitive nodes of the model after Korch's operator fission, as the
    # paper reports them; None for the models the paper does not count.
    paper_primitive_nodes: int | None


@dataclass(frozen=True)
class _Entry:
    model: ZooModel
    factory: Callable[[], nn.Module]
    # How each input is drawn: "image" U(0, 1), "normal" N(0, 1), "zeros",
    # "tokens:V" int64 token ids uniform in [0, V).
    input_kinds: dict[str, str]
    num_outputs: int = 1


_IMAGE = {"image": "image"}
_TOKENS = {"input_ids": f"tokens:{hf.VOCAB}"}

_ENTRIES = (
    _Entry(
        ZooModel(
            "candy",
            "fast neural style transfer network (Johnson et al. 2016; ONNX zoo candy-9)",
            {"image": (1, 3, 224, 224)},
            184,
        ),
        candy.TransformerNet,
        _IMAGE,
    ),
    _Entry(
        ZooModel(
            "efficientvit",
            "EfficientViT-B1 with its segmentation head, 19 classes (Cai et al., ICCV 2023)",
            {"image": (1, 3, 2048, 2048)},
            380,
        ),
        efficientvit.EfficientViTSeg,
        _IMAGE,
    ),
    _Entry(
        ZooModel(
            "yolov4",
            "YOLOv4, CSPDarknet53 + SPP + PANet, 1000 classes, raw heads (Bochkovskiy et al. 2020)",
            {"image": (1, 3, 416, 416)},
            569,
        ),
        yolov4.YOLOv4,
        _IMAGE,
        num_outputs=3,
    ),
    _Entry(
        ZooModel(
            "yolox_nano",
            "YOLOX-Nano, 80 classes, with inference decode (Ge et al. 2021)",
            {"image": (1, 3, 416, 416)},
            367,
        ),
        yolox.YOLOX,
        _IMAGE,
    ),
    _Entry(
        ZooModel(
            "segformer_b0",
            "SegFormer-B0, MiT-B0 + all-MLP decoder, ADE20K 150 classes (Xie et al. 2021)",
            {"image": (1, 3, 512, 512)},
            672,
        ),
        segformer.SegFormer,
        _IMAGE,
    ),
    _Entry(
        ZooModel(
            "bert_layer",
            "one BERT-base encoder layer, 128 tokens, additive mask (Devlin et al. 2019)",
            {"hidden_states": (1, 128, 768), "attention_mask": (1, 1, 1, 128)},
            None,
        ),
        transformer.BertLayer,
        {"hidden_states": "normal", "attention_mask": "zeros"},
    ),
    _Entry(
        ZooModel(
            "vit_block",
            "one ViT-B/16 encoder block, 197 tokens (Dosovitskiy et al. 2021)",
            {"tokens": (1, 197, 768)},
            None,
        ),
        transformer.ViTBlock,
        {"tokens": "normal"},
    ),
    _Entry(
        ZooModel(
            "hf_bert",
            f"transformers BertModel, BERT-mini size: hidden 256, 4 layers, 4 heads, FFN 1024, "
            f"vocab {hf.VOCAB}, {hf.SEQUENCE} tokens, last hidden state (Devlin et al. 2019)",
            {"input_ids": (1, hf.SEQUENCE)},
            None,
        ),
        hf.bert,
        _TOKENS,
    ),
    _Entry(
        ZooModel(
            "hf_gpt2",
            f"transformers GPT2Model: hidden 256, 4 layers, 4 heads, FFN 1024, vocab {hf.VOCAB}, "
            f"{hf.SEQUENCE} tokens, no cache, last hidden state (Radford et al. 2019)",
            {"input_ids": (1, hf.SEQUENCE)},
            None,
        ),
        hf.gpt2,
        _TOKENS,
    ),
    _Entry(
        ZooModel(
            "hf_llama",
            f"transformers LlamaModel: hidden 256, 4 layers, 4 query / 2 key-value heads, SwiGLU 1024, "
            f"vocab {hf.VOCAB}, {hf.SEQUENCE} tokens, no cache, last hidden state (Touvron et al. 2023)",
            {"input_ids": (1, hf.SEQUENCE)},
            None,
        ),
        hf.llama,
        _TOKENS,
    ),
    _Entry(
        ZooModel(
            "hf_vit",
            "transformers ViTModel, ViT-S/16 width: 224x224 image, hidden 384, 4 layers, 6 heads, MLP 1536, "
            "197 tokens, last hidden state (Dosovitskiy et al. 2021)",
            {"pixel_values": (1, 3, hf.IMAGE_SIDE, hf.IMAGE_SIDE)},
            None,
        ),
        hf.vit,
        {"pixel_values": "normal"},
    ),
    _Entry(
        ZooModel(
            "hf_whisper_encoder",
            f"transformers WhisperModel's encoder, Whisper-tiny size: {hf.MEL_BINS} mel bins x "
            f"{2 * hf.SEQUENCE} frames, d_model 384, 4 layers, 6 heads, FFN 1536, {hf.SEQUENCE} positions "
            f"(Radford et al. 2022)",
            {"input_features": (1, hf.MEL_BINS, 2 * hf.SEQUENCE)},
            None,
        ),
        hf.whisper_encoder,
        {"input_features": "normal"},
    ),
    _Entry(
        ZooModel(
            "hf_t5_encoder",
            f"transformers T5EncoderModel: d_model 256, 4 layers, 4 heads, ReLU FFN 1024, vocab {hf.VOCAB}, "
            f"{hf.SEQUENCE} tokens, relative position buckets, last hidden state (Raffel et al. 2020)",
            {"input_ids": (1, hf.SEQUENCE)},
            None,
        ),
        hf.t5_encoder,
        _TOKENS,
    ),
    _Entry(
        ZooModel(
            "hf_distilbert",
            f"transformers DistilBertModel: dim 256, 4 layers, 4 heads, FFN 1024, vocab {hf.VOCAB}, "
            f"{hf.SEQUENCE} tokens, last hidden state (Sanh et al. 2019)",
            {"input_ids": (1, hf.SEQUENCE)},
            None,
        ),
        hf.distilbert,
        _TOKENS,
    ),
    _Entry(
        ZooModel(
            "hf_phi",
            f"transformers PhiModel: hidden 256, 4 layers, 4 heads, partial rotary, GELU MLP 1024, "
            f"vocab {hf.VOCAB}, {hf.SEQUENCE} tokens, no cache, last hidden state (Li et al. 2023)",
            {"input_ids": (1, hf.SEQUENCE)},
            None,
        ),
        hf.phi,
        _TOKENS,
    ),
    _Entry(
        ZooModel(
            "hf_convnext",
            "transformers ConvNextModel, ConvNeXt-atto widths, 1-1-2-1 blocks: 224x224 image, 7x7 depthwise "
            "convolutions, last feature map (Liu et al. 2022)",
            {"pixel_values": (1, 3, hf.IMAGE_SIDE, hf.IMAGE_SIDE)},
            None,
        ),
        hf.convnext,
        {"pixel_values": "normal"},
    ),
    _Entry(
        ZooModel(
            "hf_resnet",
            "transformers ResNetModel, ResNet-18 widths, one basic block per stage: 224x224 image, "
            "last feature map (He et al. 2016)",
            {"pixel_values": (1, 3, hf.IMAGE_SIDE, hf.IMAGE_SIDE)},
            None,
        ),
        hf.resnet,
        {"pixel_values": "normal"},
    ),
    _Entry(
        ZooModel(
            "hf_segformer",
            "transformers SegformerForSemanticSegmentation, MiT-b0 sizes, all-MLP decoder, 150 classes: "
            "256x256 image, logits at 64x64 (Xie et al. 2021)",
            {"pixel_values": (1, 3, hf.SEGMENTATION_SIDE, hf.SEGMENTATION_SIDE)},
            None,
        ),
        hf.segformer,
        {"pixel_values": "normal"},
    ),
    _Entry(
        ZooModel(
            "hf_mobilenet_v2",
            "transformers MobileNetV2Model, width 1.0: 224x224 image, 17 inverted residual blocks of 3x3 depthwise "
            "convolutions and ReLU6, last feature map (Sandler et al. 2018)",
            {"pixel_values": (1, 3, hf.IMAGE_SIDE, hf.IMAGE_SIDE)},
            None,
        ),
        hf.mobilenet_v2,
        {"pixel_values": "normal"},
    ),
    _Entry(
        ZooModel(
            "hf_efficientnet",
            "transformers EfficientNetModel, B0 size: 224x224 image, 16 MBConv blocks of depthwise convolutions, "
            "squeeze-and-excitation and SiLU, last feature map (Tan and Le 2019)",
            {"pixel_values": (1, 3, hf.IMAGE_SIDE, hf.IMAGE_SIDE)},
            None,
        ),
        hf.efficientnet,
        {"pixel_values": "normal"},
    ),
    _Entry(
        ZooModel(
            "hf_swin",
            "transformers SwinModel, embedding 48, 2-2-2 blocks, 3-6-12 heads, 7x7 shifted windows: 224x224 image, "
            "last hidden state (Liu et al. 2021)",
            {"pixel_values": (1, 3, hf.IMAGE_SIDE, hf.IMAGE_SIDE)},
            None,
        ),
        hf.swin,
        {"pixel_values": "normal"},
    ),
)

_REGISTRY = {entry.model.name: entry for entry in _ENTRIES}


def list_models() -> list[ZooModel]:
    """Every zoo model, in the Korch paper's order, then the single layers, then the ``hf_*`` models."""
    return [entry.model for entry in _ENTRIES]


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY)
        raise KorchError(f"unknown zoo model {name!r}; known: {known}") from None


def get(name: str) -> ZooModel:
    """The zoo model called ``name``; a ``KorchError`` naming the known ones otherwise."""
    return _entry(name).model


def _draw(shape: tuple[int, ...], kind: str, generator: torch.Generator | None) -> torch.Tensor:
    if kind == "image":
        return torch.rand(shape, generator=generator)
    if kind == "normal":
        return torch.randn(shape, generator=generator)
    if kind.startswith("tokens:"):
        return torch.randint(0, int(kind.removeprefix("tokens:")), shape, generator=generator, dtype=torch.int64)
    return torch.zeros(shape)


def _calibration_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
    shape = (_CALIBRATION_BATCH,) + shape[1:]
    if kind == "image":
        shape = shape[:2] + tuple(min(side, _CALIBRATION_MAX_SIDE) for side in shape[2:])
    return shape


def build(name: str, *, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """An eval-mode ``name`` with seeded random weights, and seeded example inputs.

    The global torch RNG is seeded with ``seed`` for the construction and
    restored afterwards; the inputs come from their own generator.
    """
    entry = _entry(name)
    shapes = entry.model.input_shapes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = entry.factory()
        calibration = tuple(
            _draw(_calibration_shape(shape, entry.input_kinds[key]), entry.input_kinds[key], None)
            for key, shape in shapes.items()
        )
        randomize(model, calibration)
    generator = torch.Generator().manual_seed(seed)
    inputs = tuple(_draw(shape, entry.input_kinds[key], generator) for key, shape in shapes.items())
    return model, inputs


def export(name: str, path: str | os.PathLike | None = None, *, seed: int = 0) -> Path:
    """Export ``name`` (weights from ``seed``) to an ONNX file and return its path.

    Without ``path`` the file is cached under ``config.cache_dir / "zoo"`` and
    reused when present. The file is written whole or not at all. The export
    is torch's dynamo exporter's, at its default opset, static shapes, weights
    embedded.
    """
    entry = _entry(name)
    if path is None:
        path = config.cache_dir / "zoo" / f"{name}-s{seed}-v{ZOO_VERSION}.onnx"
        if path.is_file():
            return path
    model, inputs = build(name, seed=seed)
    return export_module(model, inputs, path, input_names=list(entry.model.input_shapes),
                         num_outputs=entry.num_outputs)
