"""Small public architectures from Hugging Face ``transformers``, with seeded random weights.

Owns the zoo's ``hf_*`` models: for each, the ``transformers`` config (its
size), the model built from that config, and a thin wrapper whose forward
takes plain tensors and returns the last hidden state as one tensor. The
sizes are those of small published checkpoints (BERT-mini, ViT-S/16,
Whisper-tiny's encoder) cut to a few layers, big enough that their GEMMs
matter, small enough to optimize in seconds.

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

__all__ = ["IMAGE_SIDE", "MEL_BINS", "PATCH", "SEQUENCE", "VOCAB", "bert", "gpt2", "llama", "vit",
           "whisper_encoder"]

# Tokens of the text models' input and of the Whisper encoder's output.
SEQUENCE = 128
# Vocabulary of the text models: large enough to be a real table (1-8 MiB of
# embedding), small enough that the exported files stay small.
VOCAB = 8192
# Mel bins of Whisper's log-mel input features.
MEL_BINS = 80
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


def bert() -> nn.Module:
    """BertModel, BERT-mini size: hidden 256, 4 layers, 4 heads, FFN 1024, vocab 8192."""
    t = _transformers()
    config = t.BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                          intermediate_size=1024, max_position_embeddings=512, **_common())
    return LastHiddenState(t.BertModel(config, add_pooling_layer=False), "input_ids")


def gpt2() -> nn.Module:
    """GPT2Model: hidden 256, 4 layers, 4 heads, FFN 1024, vocab 8192, 1024 positions."""
    t = _transformers()
    config = t.GPT2Config(vocab_size=VOCAB, n_embd=256, n_layer=4, n_head=4, n_inner=1024,
                          n_positions=1024, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, **_common())
    return LastHiddenState(t.GPT2Model(config), "input_ids")


def llama() -> nn.Module:
    """LlamaModel: hidden 256, 4 layers, 4 query heads over 2 key/value heads, SwiGLU 1024, vocab 8192."""
    t = _transformers()
    config = t.LlamaConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=1024, max_position_embeddings=2048,
                           **_common())
    return LastHiddenState(t.LlamaModel(config), "input_ids")


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
