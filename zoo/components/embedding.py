"""Token and patch embeddings.

Shapes: B batch, T tokens, D model width, C channels, P patch size, N patches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from einops import rearrange
from torch import Tensor, nn

from zoo.protocols import SummaryPart


class TokenEmbedding(nn.Embedding, SummaryPart):
    """Token ids [B, T] -> vectors [B, T, D], times sqrt(D) when ``scale`` (the paper, sec. 3.4), then
    times ``multiplier`` (Granite's embedding_multiplier) where given.

    ``round_scale``: sqrt(D) is first rounded to the weights' dtype, as HF Gemma casts its normalizer
    (in bfloat16, sqrt(3072) = 55.43 becomes 55.5); in float32 both ways give the same result."""

    summary_part = "embeddings"

    def __init__(self, vocab_size: int, dim: int, *, scale: bool = False, round_scale: bool = False,
                 multiplier: float | None = None) -> None:
        super().__init__(vocab_size, dim)
        self.multiplier = multiplier
        self.scale = math.sqrt(dim) if scale else 1.0
        self.round_scale = round_scale
        # the scale per floating dtype, worked out once (exact as Python floats)
        self.scales = {dtype: _rounded(self.scale, dtype) if round_scale else self.scale for dtype in _FLOATS}

    def forward(self, tokens: Tensor) -> Tensor:
        x = super().forward(tokens)
        x = x * self.scales.get(x.dtype, self.scale) if self.scale != 1.0 else x
        return x if self.multiplier is None else x * self.multiplier


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _rounded(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype``."""
    return float(torch.tensor(value, dtype=torch.float64, device="cpu").to(dtype))  # not on a meta default device


class PatchEmbedding(nn.Module, SummaryPart):
    """Images [B, C, H, W] -> patch vectors [B, N, D] by a stride-P convolution (one linear map of
    each non-overlapping P x P patch), optionally after a convolutional stem.

    ``stem``: (channels, stride) per 3x3 conv + BatchNorm + ReLU layer (Xiao et al. 2021); the
    projection then covers ``patch_size / prod(strides)`` stem pixels, so N is unchanged. ``norm``:
    a norm on each patch vector after the projection (AIMv2), or None."""

    summary_part = "embeddings"

    def __init__(self, *, in_channels: int, dim: int, patch_size: int,
                 stem: Sequence[tuple[int, int]] = (), bias: bool = True, norm: nn.Module | None = None) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for channels, stride in stem:
            layers += [nn.Conv2d(c, channels, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(channels),
                       nn.ReLU(inplace=True)]
            c = channels
        self.stem = nn.Sequential(*layers) if layers else None
        kernel = patch_size // math.prod(s for _, s in stem)
        self.proj = nn.Conv2d(c, dim, kernel_size=kernel, stride=kernel, bias=bias)
        self.norm = norm if norm is not None else nn.Identity()

    def forward(self, images: Tensor) -> Tensor:
        x = self.stem(images) if self.stem is not None else images
        return self.norm(rearrange(self.proj(x), "b d h w -> b (h w) d"))  # N = H/P * W/P patches, row by row

    def flat(self, patches: Tensor) -> Tensor:
        """Patches given as vectors [B, N, P*P*C], each one's pixels flattened by (row, column,
        channel) (timm NaFlexVit's layout) -> [B, N, D]: the projection :meth:`forward` applies to
        the same pixels, as one linear map (no stem: a stem convolves whole images)."""
        if self.stem is not None:
            raise ValueError("patches: a convolutional stem reads whole images, not lists of patches; pass images "
                             "[B, C, H, W], or use a spec without stem")
        w = self.proj.weight  # (D, C, P, P)
        return self.norm(nn.functional.linear(patches, w.permute(0, 2, 3, 1).reshape(w.shape[0], -1), self.proj.bias))

    def image_flops(self, side: int) -> int:
        """Forward FLOPs for one image of ``side`` x ``side`` pixels: each convolution's
        multiply-adds at its output resolution."""
        total = 0
        for conv in [m for m in self.modules() if isinstance(m, nn.Conv2d)]:
            side //= conv.stride[0]
            total += 2 * conv.weight.numel() * side * side
        return total

    def image_saved(self, side: int) -> int:
        """Elements one image keeps: each stem layer's conv output (BatchNorm's input) and ReLU output."""
        total = 0
        for conv in [m for m in (self.stem or []) if isinstance(m, nn.Conv2d)]:
            side //= conv.stride[0]
            total += 2 * conv.out_channels * side * side
        return total
