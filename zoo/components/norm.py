"""Normalisation layers: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.protocols import SavesPerToken, SummaryPart
from zoo.registry import register


class RMSNorm(nn.Module, SummaryPart, SavesPerToken):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 (as LLaMA) and cast back.

    ``unit_offset``: the scale is (1 + weight) with the weight initialised to zero (Gemma), so weight
    decay pulls the scale towards one rather than zero."""

    summary_part = "norms"

    def __init__(self, dim: int, *, eps: float = 1e-5, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        w = self.weight.float()
        return (y * (1.0 + w if self.unit_offset else w)).to(x.dtype)

    def saved_per_token(self) -> int:
        """The normalised input, which the weight's gradient needs (besides the input itself)."""
        return self.weight.shape[0]


@register("norm", "layernorm")
def _layernorm(spec, *, dim: int, **_) -> nn.Module:
    return nn.LayerNorm(dim, eps=spec.eps, bias=spec.bias)


@register("norm", "rmsnorm")
def _rmsnorm(spec, *, dim: int, **_) -> nn.Module:
    return RMSNorm(dim, eps=spec.eps, unit_offset=spec.unit_offset)
