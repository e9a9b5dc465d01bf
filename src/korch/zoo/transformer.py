"""Single transformer encoder layers: a BERT-base layer and a ViT-B/16 block.

BERT: Devlin, Chang, Lee, Toutanova, "BERT: Pre-training of Deep Bidirectional
Transformers for Language Understanding", NAACL 2019; base size (hidden 768,
12 heads, FFN 3072), exact (erf) GELU, post-LayerNorm with eps 1e-12 as the
reference implementation, an additive attention mask input.

ViT: Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for
Image Recognition at Scale", ICLR 2021; one ViT-B/16 encoder block
(pre-LayerNorm with eps 1e-6, 12 heads, MLP 3072 with GELU) over the 197
tokens (196 patches + class token) of a 224x224 image.

Dropout is omitted: it is the identity at inference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from korch.zoo.common import SelfAttention

HIDDEN = 768
HEADS = 12
FFN = 3072


class FeedForward(nn.Module):
    """Linear expand, exact GELU, linear project."""

    def __init__(self, dim: int = HIDDEN, hidden: int = FFN) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class BertLayer(nn.Module):
    """``LN(x + attn(x)) -> LN(y + ffn(y))``."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = SelfAttention(HIDDEN, HEADS)
        self.attention_norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.ffn = FeedForward()
        self.output_norm = nn.LayerNorm(HIDDEN, eps=1e-12)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(hidden_states + self.attention(hidden_states, attention_mask))
        return self.output_norm(x + self.ffn(x))


class ViTBlock(nn.Module):
    """``y = x + attn(LN(x)); y + mlp(LN(y))``."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(HIDDEN, eps=1e-6)
        self.attention = SelfAttention(HIDDEN, HEADS)
        self.norm2 = nn.LayerNorm(HIDDEN, eps=1e-6)
        self.mlp = FeedForward()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = tokens + self.attention(self.norm1(tokens))
        return x + self.mlp(self.norm2(x))
