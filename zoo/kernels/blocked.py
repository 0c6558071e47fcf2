"""Attention that costs what its mask allows, with SDPA on blocks: queries in blocks of C, each
block against the band of keys its mask can reach (a sliding window: the block and the one before;
packed documents: back to the longest document's length), all blocks in one SDPA call.

Where a mask bounds how far keys lie from their query (:meth:`zoo.kernels.mask.Mask.reach`), the
[T, S] scores shrink to [T, band]: a causal window of W at T tokens costs T x 2W instead of T x T.
The pairs inside the band are :meth:`~zoo.kernels.mask.Mask.allowed` evaluated on the band's
indices, so the result is the dense reference's (forward and gradients, to rounding), and any
mask kind combines (windows, documents, padding, an additive bias: each block reads its band of a
bias tensor such as T5's, which trains through it, or computes ALiBi's from its slopes and
positions). Keys and values are gathered per block (``(back + ahead) / C + 1`` copies), the price
of one batched call.

Shapes: B batch, H query heads, G key/value heads, T queries = S keys, K/V head sizes, n blocks of C.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.kernels.mask import Mask

__all__ = ["MIN_BLOCK", "MIN_KEYS", "attention", "band", "worth_it"]

MIN_BLOCK = 64  # the smallest block of queries and keys
MIN_KEYS = 512  # below this the dense call is as fast (measured: bench --only window)


def band(mask: Mask) -> tuple[int, int, int] | None:
    """(C, blocks back, blocks ahead) for ``mask``, or None where nothing bounds the keys (or it is
    not a square self-attention)."""
    if mask.q_len != mask.k_len:
        return None
    back, ahead = mask.reach()
    if back is None or ahead is None:
        return None
    reach = max(back, ahead, 1)
    C = max(MIN_BLOCK, 16 * math.ceil(reach / 2 / 16))  # about two blocks back: (2 + 1) * C ~ 1.5 reach
    C = min(C, 16 * math.ceil(mask.q_len / 16))
    return C, math.ceil(back / C), math.ceil(ahead / C)


def worth_it(mask: Mask, min_keys: int = MIN_KEYS, *, gathered_bias: bool = True,
             dtype: torch.dtype = torch.float32) -> bool:
    """Whether the band is a small enough share of the keys (at least ``min_keys``) to beat one dense
    call: at most half of them; with a bias, whose bands this kernel reads or computes
    (``gathered_bias=False``: a kernel that reads it in place), a quarter in fp32 and a fifth in
    16-bit ``dtype``s, whose dense call is fast. Measured on a 2-core Intel Xeon (family 6, model
    207), one layer of 8 heads of 64, forward + backward, causal, ALiBi as structure
    (:class:`~zoo.kernels.mask.AlibiBias`) / as a tensor: a band of a fifth of the keys or less ran
    1.3-3.3x / 1.2-2.8x the dense mask in both precisions; a quarter to a third 1.2-1.5x / 0.9-1.2x
    in fp32 but 0.5-1.05x / 0.6-0.7x in bf16. Without a bias a third of the keys gained 1.2-2.0x."""
    if mask.k_len < min_keys:
        return False
    shape = band(mask)
    if shape is None:
        return False
    C, back, ahead = shape
    share = 2 if mask.bias is None or not gathered_bias else 4 if dtype.itemsize > 2 else 5
    return (back + ahead + 1) * C * share <= mask.k_len


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Mask, *, dropout_p: float = 0.0, scale: float | None = None,
              enable_gqa: bool = False, inner: Callable[..., Tensor] | None = None) -> Tensor:
    """SDPA's result for ``mask`` (its dense form), computed block by block: q (B, H, T, K),
    k (B, G, T, K), v (B, G, T, V) -> (B, H, T, V). ``inner(q, k, v, mask, is_causal, dropout_p,
    enable_gqa, scale)`` computes the blocks on their dense masks (default: SDPA); the dispatcher
    passes its own, so zoo's CPU kernel takes the short bands where it is faster."""
    shape = band(mask)
    if shape is None:
        raise ValueError("blocked attention: this mask does not bound its keys (a window or documents, "
                         "square); use the dense backend")
    C, back, ahead = shape
    B, H, T, _ = q.shape
    n = math.ceil(T / C)
    M = (back + 1 + ahead) * C
    pad = n * C - T
    qb = F.pad(q, (0, 0, 0, pad)).unflatten(2, (n, C)).transpose(1, 2).flatten(0, 1)  # (B*n, H, C, K)

    def bands(x: Tensor) -> Tensor:  # (B, G, T, E) -> (B*n, G, M, E): block i's keys (i-back)*C .. (i+1+ahead)*C
        x = F.pad(x, (0, 0, back * C, pad + ahead * C))
        x = x.unfold(2, M, C)  # (B, G, n, E, M)
        return x.permute(0, 2, 1, 4, 3).flatten(0, 1)

    qi = torch.arange(n * C, device=q.device).view(n, C, 1)  # query slots
    kj = (torch.arange(n, device=q.device) * C - back * C).view(n, 1, 1) + torch.arange(M, device=q.device).view(1, 1, M)
    per_row = mask.padding is not None or mask.documents is not None or mask.chunks is not None
    b = torch.arange(B, device=q.device).view(B, 1, 1, 1) if per_row else 0
    ok = mask.allowed(b, qi, kj) & (kj >= 0) & (kj < T)
    ok = ok | (qi >= T) & (kj == qi)  # the padding queries past T attend to their own slot (sliced off below)
    ok = ok.expand(B, n, C, M)
    if mask.bias is None:
        ok = ok.reshape(B * n, 1, C, M)
    else:  # the bias on each block's band, -inf where not allowed: (B*n, H|1, C, M)
        Bb, Hb = mask.bias.shape[:2]
        # only the bands (indices outside the bias are clamped; those pairs are not allowed anyway)
        rows = torch.arange(Bb, device=q.device).view(Bb, 1, 1, 1, 1)
        heads = torch.arange(Hb, device=q.device).view(1, 1, Hb, 1, 1)
        bands_ = mask.bias_at(rows, heads, qi.clamp(max=T - 1)[None, :, None], kj.clamp(0, T - 1)[None, :, None])
        bands_ = bands_.to(q.dtype)  # (Bb, n, Hb, C, M)
        ok = torch.where(ok[:, :, None], bands_, float("-inf")).expand(B, n, Hb, C, M).reshape(B * n, Hb, C, M)
    if inner is None:
        y = F.scaled_dot_product_attention(qb, bands(k), bands(v), attn_mask=ok, dropout_p=dropout_p, scale=scale,
                                           enable_gqa=enable_gqa)  # (B*n, H, C, V)
    else:
        y = inner(qb, bands(k), bands(v), ok, False, dropout_p, enable_gqa, scale)
    return y.unflatten(0, (B, n)).transpose(1, 2).flatten(2, 3)[:, :, :T]
