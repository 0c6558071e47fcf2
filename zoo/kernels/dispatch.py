"""One function per kind of computation: the kernel under :mod:`zoo.kernels.cpu` where its
``applies`` says so, the torch op with the same semantics everywhere else.

Components call these and nothing under :mod:`zoo.kernels.cpu`, so they read as the paper does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.kernels import cpu

__all__ = ["attention", "dropout", "linear"]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; fp32 products on CPU may run on oneDNN (:mod:`zoo.kernels.cpu.linear`)."""
    if cpu.linear.applies(x, weight, bias):
        return cpu.linear.linear(x, weight, bias)
    return F.linear(x, weight, bias)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)``; on CPU with 0 < p < 1, masks from :mod:`zoo.kernels.cpu.dropout`."""
    if not training or p == 0.0:
        return x
    if cpu.dropout.applies(x, p):
        return cpu.dropout.dropout(x, p)
    return F.dropout(x, p, training)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    enable_gqa: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention`` with its arguments and semantics: q (B, H, T, K),
    k (B, G, S, K), v (B, G, S, V) -> (B, H, T, V); ``mask`` boolean (True = may attend) or additive,
    broadcastable to [B, H, T, S]. On CPU, short sequences and attention dropout run
    :mod:`zoo.kernels.cpu.attention`."""
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)  # an additive bias (ALiBi) in the compute dtype, as SDPA requires
    if cpu.attention.applies(q, k, dropout_p, mask):
        return cpu.attention.attention(q, k, v, mask, is_causal, dropout_p)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=enable_gqa
    )
