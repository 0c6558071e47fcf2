"""Normalisation layers: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.registry import register


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 (as LLaMA) and cast back."""

    def __init__(self, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (y * self.weight.float()).to(x.dtype)


@register("norm", "layernorm")
def _layernorm(spec, *, dim: int, **_) -> nn.Module:
    return nn.LayerNorm(dim, eps=spec.eps, bias=spec.bias)


@register("norm", "rmsnorm")
def _rmsnorm(spec, *, dim: int, **_) -> nn.Module:
    return RMSNorm(dim, eps=spec.eps)
