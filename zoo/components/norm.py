"""Normalisation layers: LayerNorm (Ba et al. 2016), with or without its weight and bias or scaling by
(1 + weight) (Nemotron's layernorm1p), and RMSNorm (Zhang & Sennrich 2019)."""

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


class LayerNorm1P(nn.LayerNorm):
    """LayerNorm scaling by (1 + weight), the weight initialised to zero (Nemotron's ``LayerNorm1P``):
    weight decay pulls the scale towards one rather than zero. Computed as ``F.layer_norm`` with the
    weight 1 + weight, in the input's dtype (as HF's Nemotron)."""

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.weight is not None:
            nn.init.zeros_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight + 1.0, self.bias, self.eps)


@register("norm", "layernorm")
def _layernorm(spec, *, dim: int, **_) -> nn.Module:
    if not spec.affine:  # no weight, no bias (OLMo)
        return nn.LayerNorm(dim, eps=spec.eps, elementwise_affine=False)
    return (LayerNorm1P if spec.unit_offset else nn.LayerNorm)(dim, eps=spec.eps, bias=spec.bias)


@register("norm", "rmsnorm")
def _rmsnorm(spec, *, dim: int, **_) -> nn.Module:
    return RMSNorm(dim, eps=spec.eps, unit_offset=spec.unit_offset)
