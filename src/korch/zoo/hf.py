"""Small public architectures from Hugging Face ``transformers``, with seeded random weights.

Owns the zoo's ``hf_*`` models: for each, the ``transformers`` config (its
size), the model built from that config, and a thin wrapper whose forward
takes plain tensors and returns the last hidden state as one tensor. The
sizes are those of small published checkpoints (BERT-mini, ViT-S/16,
Whisper-tiny's encoder, ConvNeXt-atto, ResNet-18's widths) cut to a few
layers, big enough that their GEMMs and convolutions matter, small enough to
optimize in seconds; the mobile convolution networks (MobileNetV2,
EfficientNet-B0) are whole, at their published sizes.

No checkpoint is downloaded: every model is built from its config, weights
from ``transformers``' own initialization under the zoo's seeded torch RNG.
Every model uses eager attention (plain MatMul + Softmax in the export) and
no key/value cache. ``transformers`` is imported only when a model is built;
without it, building one raises a one-line ``KorchError``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch
from torch import nn

from korch.errors import KorchError

__all__ = ["IMAGE_SIDE", "MEL_BINS", "PATCH", "SEGMENTATION_SIDE", "SEQUENCE", "VOCAB", "bert", "convnext",
           "distilbert", "efficientnet", "gpt2", "llama", "mobilenet_v2", "phi", "resnet", "segformer", "swin",
           "t5_encoder", "vit", "whisper_encoder"]

# Tokens of the text models' input and of the Whisper encoder's output.
SEQUENCE = 128
# Vocabulary of the text models: large enough to be a real table (1-8 MiB of
# embedding), small enough that the exported files stay small.
VOCAB = 8192
# Mel bins of Whisper's log-mel input features.
MEL_BINS = 80
# SegFormer's input image side (its logits come at a quarter of it)
SEGMENTATION_SIDE = 256
# ViT's input image side and patch side: 14 x 14 patches + the class token.
IMAGE_SIDE = 224
PATCH = 16


def _transformers() -> ModuleType:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise KorchError("the zoo's hf_* models need Hugging Face transformers: "
                         "pip install transformers") from None


def _common() -> dict:
    """Settings of every config: eager attention, no key/value cache, outputs as a ModelOutput."""
    return {"attn_implementation": "eager", "use_cache": False, "return_dict": True}


class LastHiddenState(nn.Module):
    """``model(input)``'s last hidden state: one tensor in, one tensor out."""

    def __init__(self, model: nn.Module, input_name: str) -> None:
        super().__init__()
        self.model = model
        self.input_name = input_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.input_name: x}).last_hidden_state


class Logits(LastHiddenState):
    """``model(input)``'s logits: one tensor in, one tensor out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.input_name: x}).logits


def _text_model(architecture: str, model_options: dict | None = None, **sizes) -> nn.Module:
    """``transformers``' ``{architecture}Model`` over token ids, from ``{architecture}Config(**sizes)``."""
    t = _transformers()
    config = getattr(t, f"{architecture}Config")(vocab_size=VOCAB, **sizes, **_common())
    return LastHiddenState(getattr(t, f"{architecture}Model")(config, **(model_options or {})), "input_ids")


def bert() -> nn.Module:
    """BertModel, BERT-mini size: hidden 256, 4 layers, 4 heads, FFN 1024, vocab 8192."""
    return _text_model("Bert", {"add_pooling_layer": False}, hidden_size=256, num_hidden_layers=4,
                       num_attention_heads=4, intermediate_size=1024, max_position_embeddings=512)


def gpt2() -> nn.Module:
    """GPT2Model: hidden 256, 4 layers, 4 heads, FFN 1024, vocab 8192, 1024 positions."""
    return _text_model("GPT2", n_embd=256, n_layer=4, n_head=4, n_inner=1024, n_positions=1024,
                       bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)


def llama() -> nn.Module:
    """LlamaModel: hidden 256, 4 layers, 4 query heads over 2 key/value heads, SwiGLU 1024, vocab 8192."""
    return _text_model("Llama", hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=1024, max_position_embeddings=2048)


def vit() -> nn.Module:
    """ViTModel, ViT-S/16 width: 224x224 image, patch 16, hidden 384, 4 layers, 6 heads, MLP 1536."""
    t = _transformers()
    config = t.ViTConfig(image_size=IMAGE_SIDE, patch_size=PATCH, num_channels=3, hidden_size=384,
                         num_hidden_layers=4, num_attention_heads=6, intermediate_size=1536, **_common())
    return LastHiddenState(t.ViTModel(config, add_pooling_layer=False), "pixel_values")


def whisper_encoder() -> nn.Module:
    """WhisperModel's encoder, Whisper-tiny size: 80 mel bins, d_model 384, 4 layers, 6 heads, FFN 1536.

    ``max_source_positions`` is ``SEQUENCE``: the input is ``2 * SEQUENCE`` mel
    frames (2.56 s of audio), halved by the second conv's stride.
    """
    t = _transformers()
    config = t.WhisperConfig(num_mel_bins=MEL_BINS, d_model=384, encoder_layers=4, encoder_attention_heads=6,
                             encoder_ffn_dim=1536, decoder_layers=1, decoder_attention_heads=6,
                             decoder_ffn_dim=1536, vocab_size=VOCAB, max_source_positions=SEQUENCE,
                             max_target_positions=SEQUENCE, pad_token_id=VOCAB - 1, bos_token_id=VOCAB - 1,
                             eos_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 2, **_common())
    return LastHiddenState(t.WhisperModel(config).get_encoder(), "input_features")


def t5_encoder() -> nn.Module:
    """T5EncoderModel: d_model 256, 4 layers, 4 heads of 64, ReLU FFN 1024, relative position buckets, vocab 8192."""
    t = _transformers()
    config = t.T5Config(vocab_size=VOCAB, d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_heads=4,
                        feed_forward_proj="relu", is_encoder_decoder=False, **_common())
    return LastHiddenState(t.T5EncoderModel(config), "input_ids")


def distilbert() -> nn.Module:
    """DistilBertModel: dim 256, 4 layers, 4 heads, FFN 1024, learned positions, vocab 8192."""
    return _text_model("DistilBert", dim=256, n_layers=4, n_heads=4, hidden_dim=1024, max_position_embeddings=512)


def phi() -> nn.Module:
    """PhiModel: hidden 256, 4 layers, 4 heads, rotary on half of each head, GELU MLP 1024, vocab 8192."""
    return _text_model("Phi", hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                       partial_rotary_factor=0.5, max_position_embeddings=2048)


def convnext() -> nn.Module:
    """ConvNextModel, ConvNeXt-atto widths (40-320) with one block per stage: 7x7 depthwise convolutions,
    channels-last LayerNorm, GELU MLPs; 224x224 image, the last stage's feature map."""
    t = _transformers()
    config = t.ConvNextConfig(num_channels=3, hidden_sizes=[40, 80, 160, 320], depths=[1, 1, 2, 1],
                              image_size=IMAGE_SIDE, **_common())
    return LastHiddenState(t.ConvNextModel(config), "pixel_values")


def resnet() -> nn.Module:
    """ResNetModel, ResNet-18 widths (64-512) with one basic block per stage; 224x224 image, the last
    stage's feature map."""
    t = _transformers()
    config = t.ResNetConfig(num_channels=3, embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[1, 1, 1, 1],
                            layer_type="basic", **_common())
    return LastHiddenState(t.ResNetModel(config), "pixel_values")


def segformer() -> nn.Module:
    """SegformerForSemanticSegmentation, MiT-b0 sizes (widths 32-256, two blocks per stage) and its all-MLP
    decoder (256 channels, 150 classes); 256x256 image, logits at 64x64."""
    t = _transformers()
    config = t.SegformerConfig(num_labels=150, **_common())
    return Logits(t.SegformerForSemanticSegmentation(config), "pixel_values")


def mobilenet_v2() -> nn.Module:
    """MobileNetV2Model at its published size (width 1.0, 17 inverted residual blocks: 1x1 expansions, 3x3
    depthwise convolutions, ReLU6); 224x224 image, the last feature map (1280 channels at 7x7)."""
    t = _transformers()
    config = t.MobileNetV2Config(depth_multiplier=1.0, image_size=IMAGE_SIDE, **_common())
    return LastHiddenState(t.MobileNetV2Model(config, add_pooling_layer=False), "pixel_values")


def efficientnet() -> nn.Module:
    """EfficientNetModel at B0's size (width and depth 1.0, 16 MBConv blocks: depthwise convolutions,
    squeeze-and-excitation, SiLU); 224x224 image, the last feature map (1280 channels at 7x7)."""
    t = _transformers()
    config = t.EfficientNetConfig(image_size=IMAGE_SIDE, width_coefficient=1.0, depth_coefficient=1.0,
                                  hidden_dim=1280, **_common())
    return LastHiddenState(t.EfficientNetModel(config), "pixel_values")


def swin() -> nn.Module:
    """SwinModel, Swin-T's window attention at half its width and three stages of two blocks (embedding 48,
    3-6-12 heads, 7x7 windows, shifted every other block); 224x224 image, the last hidden state."""
    t = _transformers()
    config = t.SwinConfig(image_size=IMAGE_SIDE, embed_dim=48, depths=[2, 2, 2], num_heads=[3, 6, 12],
                          **_common())
    return LastHiddenState(t.SwinModel(config, add_pooling_layer=False), "pixel_values")
