"""ViT pooling: tokens [B, T, D] -> one vector [B, D] for the classifier.

A pool is called as ``pool(x, prefix)``: ``x`` holds every token, ``[class token?, registers...,
patches...]``, and ``prefix`` says how many come before the patches. Pools register in the ``pool``
registry like any part (``builder(spec, *, dim, block)``, ``block`` the model's BlockSpec, whose
attention, FFN and norm a pool may borrow).

Shapes: B batch, T tokens, P prefix tokens, N patches, D model width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.components.attention import Attention
from zoo.components.parts import flops
from zoo.protocols import CountsFlops, SavesPerToken, SummaryPart
from zoo.registry import register, registry


class ClsPool(nn.Module):
    """The class token (the first token)."""

    def forward(self, x: Tensor, prefix: int) -> Tensor:
        return x[:, 0]


class MeanPool(nn.Module):
    """The mean of the patch tokens (prefix tokens left out, as timm's ``avg``)."""

    def forward(self, x: Tensor, prefix: int) -> Tensor:
        return x[:, prefix:].mean(dim=1)


class AttentionPool(nn.Module, SummaryPart, CountsFlops, SavesPerToken):
    """Multihead attention pooling (MAP; timm's ``AttentionPoolLatent`` with one latent): a learned
    query ``latent`` [1, 1, D] attends over the patch tokens (cross-attention ``attn``: ``q`` on the
    latent, ``kv`` on the patches, ``out``), then ``y = y + ffn(norm(y))``."""

    summary_part = "head"

    def __init__(self, dim: int, *, attn: Attention, norm: nn.Module, ffn: nn.Module) -> None:
        super().__init__()
        self.latent = nn.Parameter(torch.empty(1, 1, dim))
        nn.init.trunc_normal_(self.latent, std=dim**-0.5, a=-2 * dim**-0.5, b=2 * dim**-0.5)  # as timm
        self.attn, self.norm, self.ffn = attn, norm, ffn

    def forward(self, x: Tensor, prefix: int) -> Tensor:
        patches = x[:, prefix:]  # (B, N, D)
        y = self.attn(self.latent.expand(x.shape[0], -1, -1).to(x.dtype), patches)  # (B, 1, D)
        y = y + self.ffn(self.norm(y))
        return y[:, 0]

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Over ``tokens`` patch tokens: their keys and values, one query, the FFN on one vector."""
        return flops(self.attn, 1, tokens) + flops(self.ffn, 1)

    def saved_per_token(self) -> int:
        """Elements per patch token kept for the backward pass: the kv projection's input and output."""
        return self.attn.kv.in_features + self.attn.kv.out_features


@register("pool", "cls")
def _cls(spec, **_) -> nn.Module:
    return ClsPool()


@register("pool", "mean")
def _mean(spec, **_) -> nn.Module:
    return MeanPool()


@register("pool", "map")
def _map(spec, *, dim: int, block, **_) -> nn.Module:
    heads = spec.n_heads or block.attention.n_heads
    attn = Attention(dim, n_heads=heads, n_kv_heads=heads, head_dim=dim // heads, v_head_dim=dim // heads, bias=spec.bias,
                     cross=True, kv_dim=dim)
    ffn_spec = block.ffn.model_copy(update={"hidden": spec.hidden or block.ffn.hidden_size(dim), "bias": spec.bias})
    ffn = registry("ffn").builder(ffn_spec.kind)(ffn_spec, dim=dim, dropout=0.0, norm=block.norm)
    norm = registry("norm").builder(block.norm.kind)(block.norm, dim=dim)
    return AttentionPool(dim, attn=attn, norm=norm, ffn=ffn)
