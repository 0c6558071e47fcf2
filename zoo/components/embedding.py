"""Token and patch embeddings.

Shapes: B batch, T tokens, D model width, C channels, P patch size, N patches.
"""

from __future__ import annotations

import math

from torch import Tensor, nn


class TokenEmbedding(nn.Embedding):
    """Token ids [B, T] -> vectors [B, T, D], times sqrt(D) when ``scale`` (the paper, sec. 3.4)."""

    def __init__(self, vocab_size: int, dim: int, *, scale: bool = False) -> None:
        super().__init__(vocab_size, dim)
        self.scale = math.sqrt(dim) if scale else 1.0

    def forward(self, tokens: Tensor) -> Tensor:
        x = super().forward(tokens)
        return x * self.scale if self.scale != 1.0 else x


class PatchEmbedding(nn.Module):
    """Images [B, C, H, W] -> patch vectors [B, N, D] by a stride-P convolution (one linear map of
    each non-overlapping P x P patch)."""

    def __init__(self, *, in_channels: int, dim: int, patch_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: Tensor) -> Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, D, H/P, W/P) -> (B, N, D)
