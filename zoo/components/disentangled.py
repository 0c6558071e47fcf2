"""DeBERTa's disentangled attention (``attention.kind: disentangled``, :class:`zoo.spec.DisentangledSpec`;
He et al. 2021; HF ``DisentangledSelfAttention``) and the table of relative-position embeddings its
layers share (``position.kind: relative_embedding``, HF's ``rel_embeddings`` with ``norm_rel_ebd``).

A score adds to the content term q_i·k_j a content-to-position term (c2p), q_i against the key of
the relative embedding of the bucket of i - j, and a position-to-content term (p2c), k_j against
the query of the relative embedding of the bucket of i - j (HF reads it as j - i negated: the same
bucket, the buckets being odd). The relative embeddings pass through the content projections
(``share_key``) or their own. Every term is divided by sqrt(K * terms); the position terms enter
the fused kernel as an additive bias with the mask, so the softmax and weighted sum are SDPA's.

Bucketing (HF's make_log_bucket_position): a distance d with |d| < buckets // 2 is its own bucket;
a farther one gets sign(d) * (ceil(log(|d| / m) / log((max_distance - 1) / m) * (m - 1)) + m), m =
buckets // 2. Distances are between the tokens' positions (zoo's: real tokens counted), which for
the real tokens of a row padded on one side are HF's slot distances.

Shapes: B batch, T query length, S key length, D model width, H heads, K head size, P span (half
the table's rows).
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import Tensor, nn

from zoo import kernels
from zoo.components.cache import LayerCache
from zoo.components.dropout import Dropout
from zoo.components.linear import Linear
from zoo.components.parts import linear_flops
from zoo.components.position import Position
from zoo.kernels import Mask
from zoo.protocols import CountsFlops, HeadSizes, InitNormal, ResidualWriter, SavesActivations, SummaryPart
from zoo.registry import register

__all__ = ["DisentangledAttention", "RelativeEmbedding", "relative_buckets"]


def relative_buckets(distance: Tensor, buckets: int | None, max_distance: int) -> Tensor:
    """The bucket of each integer ``distance`` (query position minus key position), as HF's
    make_log_bucket_position computes it (in float32, then truncated to integers); ``buckets`` None:
    the distances themselves."""
    if buckets is None:
        return distance.long()
    mid = buckets // 2
    sign = torch.sign(distance)
    near = (distance < mid) & (distance > -mid)
    size = torch.where(near, torch.tensor(mid - 1).type_as(distance), distance.abs())
    log_pos = torch.ceil(torch.log(size / mid) / torch.log(torch.tensor((max_distance - 1) / mid)) * (mid - 1)) + mid
    return torch.where(size <= mid, distance.type_as(log_pos), log_pos * sign).long()


class RelativeEmbedding(Position, InitNormal):
    """The relative-position embeddings [2 * span, dim] (``weight``) a stack's disentangled layers
    share, with a LayerNorm over them (``norm``) or none; :meth:`buckets` bins query/key distances."""

    init_normal = ("weight",)

    def __init__(self, dim: int, *, buckets: int | None, max_distance: int, norm: bool = True, eps: float = 1e-7,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.buckets_, self.max_distance = buckets, max_distance
        self.span = buckets or max_distance
        self.weight = nn.Parameter(torch.empty(2 * self.span, dim))
        nn.init.normal_(self.weight, std=0.02)
        self.norm = nn.LayerNorm(dim, eps=eps) if norm else None
        self.drop = Dropout(dropout)

    def table(self) -> Tensor:
        """The embeddings a layer reads [2P, D]: the table, normalised where it has a norm, with
        dropout in training (a draw per layer, as HF's)."""
        return self.drop(self.weight if self.norm is None else self.norm(self.weight))

    def buckets(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """Buckets of q - k for positions [T] or [B, T] and [S] or [B, S] -> [B or 1, T, S]."""
        qp = q_positions if q_positions.dim() == 2 else q_positions[None]
        kp = k_positions if k_positions.dim() == 2 else k_positions[None]
        return relative_buckets(qp[:, :, None] - kp[:, None, :], self.buckets_, self.max_distance)


class DisentangledAttention(nn.Module, ResidualWriter, SummaryPart, CountsFlops, SavesActivations, HeadSizes):
    """Disentangled self-attention of ``n_heads`` heads of ``head_dim`` (see the module docstring):
    projections ``q``, ``k``, ``v`` (biases with ``bias``), ``out`` (``out_bias``, else ``bias``);
    ``c2p``, ``p2c``: the position terms present; ``share_key``: the relative embeddings pass through
    ``q`` and ``k``, else through ``pos_q`` (with p2c) and ``pos_k`` (with c2p), biased. Reads its
    position (a :class:`RelativeEmbedding`) from the block."""

    residual_out = ("out",)
    summary_part = "attention"

    def __init__(self, dim: int, *, n_heads: int, head_dim: int, c2p: bool = True, p2c: bool = True,
                 share_key: bool = True, bias: bool = True, out_bias: bool | None = None, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = self.n_kv_heads = n_heads
        self.head_dim = self.v_head_dim = head_dim
        self.c2p, self.p2c, self.share_key, self.dropout = c2p, p2c, share_key, dropout
        self.scale = 1.0 / math.sqrt(head_dim * (1 + c2p + p2c))
        size = n_heads * head_dim
        self.q, self.k, self.v = (Linear(dim, size, bias=bias) for _ in range(3))
        self.pos_q = Linear(dim, size) if p2c and not share_key else None
        self.pos_k = Linear(dim, size) if c2p and not share_key else None
        self.out = Linear(size, dim, bias=bias if out_bias is None else out_bias)

    def forward(self, x: Tensor, memory: Tensor | None = None, *, mask: Tensor | Mask | None = None,
                is_causal: bool = False, pos: Position | None = None, positions: Tensor | None = None,
                cache: LayerCache | None = None) -> Tensor:
        """x [B, T, D] -> [B, T, D] with the layer's ``mask`` and the position ``pos`` (a
        :class:`RelativeEmbedding`) at ``positions`` ([T] or [B, T])."""
        if memory is not None or cache is not None:
            raise ValueError("attention.kind disentangled is an encoder's self-attention: no memory, no cache")
        if not isinstance(pos, RelativeEmbedding):
            raise ValueError(f"attention.kind disentangled reads a shared relative-embedding table: set position: "
                             f"{{kind: relative_embedding}}, got {type(pos).__name__}")
        B, T, _ = x.shape
        q, k, v = (rearrange(p(x), "b t (h k) -> b h t k", h=self.n_heads) for p in (self.q, self.k, self.v))
        bias = self.position_scores(q, k, pos, positions) * self.scale  # (B|1, H, T, T)
        allowed, causal = mask.dense() if isinstance(mask, Mask) else (mask, is_causal)
        if causal:
            bias = bias.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        if allowed is not None:
            bias = bias.masked_fill(~allowed, float("-inf")) if allowed.dtype == torch.bool else bias + allowed
        dropout_p = self.dropout if self.training else 0.0
        y = kernels.attention(q, k, v, mask=bias.to(q.dtype), dropout_p=dropout_p, scale=self.scale)  # (B, H, T, K)
        return self.out(rearrange(y, "b h t k -> b t (h k)"))

    def position_scores(self, q: Tensor, k: Tensor, pos: RelativeEmbedding, positions: Tensor) -> Tensor:
        """The c2p and p2c terms, unscaled, of queries q and keys k (B, H, T, K) -> (B, H, T, T)."""
        table, P = pos.table(), pos.span
        B, H, T, _ = q.shape
        scores = q.new_zeros(())
        if self.c2p:
            pk = rearrange((self.k if self.share_key else self.pos_k)(table), "p (h k) -> h p k", h=H)
            index = (pos.buckets(positions, positions) + P).clamp(0, 2 * P - 1)  # (B|1, T, S)
            c2p = torch.einsum("bhtk,hpk->bhtp", q, pk)  # (B, H, T, 2P)
            scores = scores + c2p.gather(-1, index[:, None].expand(B, H, T, T))
        if self.p2c:
            pq = rearrange((self.q if self.share_key else self.pos_q)(table), "p (h k) -> h p k", h=H)
            index = (P - pos.buckets(positions, positions)).clamp(0, 2 * P - 1)  # (B|1, S, T): bucket of key j - query i
            p2c = torch.einsum("bhsk,hpk->bhsp", k, pq)  # (B, H, S, 2P)
            scores = scores + p2c.gather(-1, index[:, None].expand(B, H, T, T)).transpose(-1, -2)
        return scores.expand(B, H, T, T) if scores.dim() == 0 else scores

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Forward FLOPs over ``tokens`` tokens: the projections, q·k and the weighted sum of values,
        and each position term's product of the queries (or keys) with the 2P relative rows, counted
        at 2P = T (the table's span is the position's); the table's projection, once a pass, is
        left out."""
        H, K = self.n_heads, self.head_dim
        projections = sum(linear_flops(m, tokens) for m in (self.q, self.k, self.v, self.out))
        return projections + 2 * tokens * tokens * H * K * (2 + self.c2p + self.p2c)

    def saved(self, tokens: int, memory: int | None = None, *, rotates: bool = False) -> int:
        """Elements kept for the backward pass besides the input, as autograd keeps them: q, k, v,
        their contiguous copies the kernel reads, its output and the out projection's input (6 x
        H x K a token); per position term its H x T x 2P product and its gather index (T x T int64,
        two elements each), counted at 2P = T (the table's span is the position's); and the H x T x T
        bias the kernel reads. The table's own activations (2P rows, once a pass) are left out."""
        H, K, T = self.n_heads, self.head_dim, tokens
        return T * 6 * H * K + (self.c2p + self.p2c) * (H * T * T + 2 * T * T) + H * T * T


@register("position", "relative_embedding")
def _relative_embedding(spec, *, dim: int, **_) -> Position:
    return RelativeEmbedding(dim, buckets=spec.buckets, max_distance=spec.max_distance, norm=spec.norm, eps=spec.eps,
                            dropout=spec.dropout)


@register("attention", "disentangled")
def _disentangled(spec, *, dim: int, d_model: int, dropout: float, cross: bool = False, **_) -> DisentangledAttention:
    if cross:
        raise ValueError("attention.kind: disentangled is self-attention; a cross-attention is mha, gqa or mqa")
    return DisentangledAttention(dim, n_heads=spec.n_heads, head_dim=spec.qk_size(d_model), c2p=spec.c2p, p2c=spec.p2c,
                                 share_key=spec.share_key, bias=spec.bias, out_bias=spec.has_out_bias, dropout=dropout)
