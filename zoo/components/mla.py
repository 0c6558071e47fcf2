"""Multi-head latent attention (``attention.kind: mla``, :class:`zoo.spec.MLASpec`; DeepSeek-V2,
Liu et al. 2024; HF ``DeepseekV3Attention``), with the cache holding the compressed latent.

Queries come from x through a low-rank latent (``q_a``, an RMSNorm ``q_norm``, ``q_b``) or one
projection (``q``). Keys and values come from one down projection ``kv_a`` to [latent | rotary key]:
the latent, through the RMSNorm ``kv_norm``, is what the cache keeps, and ``kv_b`` expands it into
each head's key part without positions and its value; the rotary key part (one head) is shared by
every head. Only the rotary parts of queries and keys turn (the position's head size is
``qk_rope_head_dim``), so the cached rotary key is already turned and the latent needs no position.

Cached decoding can run folded (absorbed, as DeepSeek's inference code, vLLM and SGLang decode):
a head's score q_nope · (W_UK c) is (q_nope W_UK) · c, so the no-position query is carried into
the latent's space by the head's key rows W_UK of ``kv_b`` and scored against the cached latents
c themselves, beside the rotary parts; the weighted sum of latents then passes through the head's
value rows W_UV. Nothing is expanded per cached token: a step costs O(S (2R + P)) per head instead
of expanding all S latents through ``kv_b``. ``fold`` chooses: ``auto`` folds a pass with a cache
when that takes fewer multiply-adds (decoding steps; not a prefill with DeepSeek's sizes, where
2R > N + V), ``always``, ``never``. Both compute the same function.

The cache protocol is the one of :mod:`zoo.components.cache` and
:mod:`zoo.components.static_cache`: the latent [B, 1, T, R] and the rotary key [B, 1, T, P] take
the places of keys and values (one "head" each), so dynamic, sliding and static caches and beam
reordering hold them unchanged, at R + P elements per token and layer (:meth:`cache_elements`)
instead of 2 * H * K.

Shapes: B batch, T query length, S key length, D model width, H heads, N no-position query/key
part, P rotary part, K = N + P query/key head size, V value head size, R kv latent, Q q latent.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from zoo import kernels
from zoo.components.cache import LayerCache
from zoo.components.linear import Linear
from zoo.components.norm import RMSNorm
from zoo.components.parts import linear_flops
from zoo.components.position import Position
from zoo.kernels import Mask
from zoo.protocols import CachesPerToken, CountsFlops, HeadSizes, ResidualWriter, SavesActivations, SummaryPart
from zoo.registry import register

__all__ = ["LatentAttention"]

FOLDS = ("auto", "always", "never")  # the ``fold`` settings (zoo.spec.MLASpec.fold)


class LatentAttention(nn.Module, ResidualWriter, SummaryPart, CountsFlops, SavesActivations, HeadSizes, CachesPerToken):
    """Multi-head latent attention of ``n_heads`` heads (see the module docstring).

    ``q_rank``: the query latent's size (None: one query projection ``q``); ``kv_rank``: the
    key/value latent's; ``nope_dim``, ``rope_dim``: each head's query/key parts without and with
    positions; ``v_head_dim``: each head's value; ``bias``: on ``q_a`` and ``kv_a`` and, unless
    ``out_bias`` says otherwise, on ``out``; ``eps``: the latents' RMSNorms'. ``scale`` multiplies
    the scores (None: 1/sqrt(N + P)); ``softcap`` caps them; ``kernel``: ``fused`` or ``scores``
    (as :class:`zoo.components.attention.Attention`); ``fold``: ``auto``, ``always`` or ``never``
    (see the module docstring and :meth:`folds`)."""

    residual_out = ("out",)
    summary_part = "attention"

    def __init__(self, dim: int, *, n_heads: int, q_rank: int | None, kv_rank: int, nope_dim: int, rope_dim: int,
                 v_head_dim: int, bias: bool = False, out_bias: bool | None = None, eps: float = 1e-6,
                 dropout: float = 0.0, scale: float | None = None, softcap: float | None = None,
                 kernel: str = "fused", fold: str = "auto") -> None:
        super().__init__()
        if kernel not in ("fused", "scores"):
            raise ValueError(f"kernel must be fused or scores, got {kernel!r}")
        if fold not in FOLDS:
            raise ValueError(f"fold must be one of {', '.join(FOLDS)}, got {fold!r}")
        if softcap is not None and kernel != "scores":
            raise ValueError("softcap: no fused kernel caps the scores; build the attention with kernel='scores'")
        self.n_heads = self.n_kv_heads = n_heads
        self.nope_dim, self.rope_dim, self.kv_rank, self.q_rank = nope_dim, rope_dim, kv_rank, q_rank
        self.head_dim, self.v_head_dim = nope_dim + rope_dim, v_head_dim
        self.scale, self.softcap, self.kernel, self.dropout, self.fold = scale, softcap, kernel, dropout, fold
        q_size = n_heads * self.head_dim
        if q_rank is None:
            self.q = Linear(dim, q_size, bias=False)
            self.q_a = self.q_norm = self.q_b = None
        else:
            self.q = None
            self.q_a = Linear(dim, q_rank, bias=bias)
            self.q_norm = RMSNorm(q_rank, eps=eps)
            self.q_b = Linear(q_rank, q_size, bias=False)
        self.kv_a = Linear(dim, kv_rank + rope_dim, bias=bias)
        self.kv_norm = RMSNorm(kv_rank, eps=eps)
        self.kv_b = Linear(kv_rank, n_heads * (nope_dim + v_head_dim), bias=False)
        self.out = Linear(n_heads * v_head_dim, dim, bias=bias if out_bias is None else out_bias)

    def forward(self, x: Tensor, memory: Tensor | None = None, *, mask: Tensor | Mask | None = None,
                is_causal: bool = False, pos: Position | None = None, positions: Tensor | None = None,
                cache: LayerCache | None = None) -> Tensor:
        """x [B, T, D] -> [B, T, D]: self-attention (``memory`` must be None), with ``mask``,
        ``pos``/``positions`` and ``cache`` as :meth:`zoo.components.attention.Attention.forward`
        reads them; the cache holds the latent and the rotary key."""
        if memory is not None:
            raise ValueError("LatentAttention is self-attention; it takes no memory")
        q = self.q(x) if self.q is not None else self.q_b(self.q_norm(self.q_a(x)))
        q = rearrange(q, "b t (h k) -> b h t k", h=self.n_heads)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_rope = self.kv_a(x).split([self.kv_rank, self.rope_dim], dim=-1)
        latent, k_rope = self.kv_norm(latent)[:, None], k_rope[:, None]  # (B, 1, T, R), (B, 1, T, P)
        if pos is not None:
            q_rope, k_rope = pos.rotate(q_rope, k_rope, positions)
        if cache is not None:
            latent, k_rope = cache.append(latent, k_rope)
        dropout_p = self.dropout if self.training else 0.0
        if self.folds(x.shape[1], latent.shape[2], cache is not None):
            y = self.folded(q_nope, q_rope, latent, k_rope, mask=mask, is_causal=is_causal, dropout_p=dropout_p)
            return self.out(rearrange(y, "b h t v -> b t (h v)"))
        k, v = self.expand(latent, k_rope)
        q = torch.cat([q_nope, q_rope], dim=-1)
        if self.kernel == "scores":
            y = kernels.scores_attention(q, k, v, mask=mask, is_causal=is_causal and mask is None, dropout_p=dropout_p,
                                         scale=self.scale, softcap=self.softcap)
        else:
            y = kernels.attention(q, k, v, mask=mask, is_causal=is_causal and mask is None, dropout_p=dropout_p,
                                  scale=self.scale)  # (B, H, T, V)
        return self.out(rearrange(y, "b h t v -> b t (h v)"))

    def folds(self, queries: int, keys: int, cached: bool) -> bool:
        """Whether a pass of ``queries`` new tokens against ``keys`` (cached ones included) runs
        folded: ``fold`` always or never; auto, only with a cache (``cached``), and when folding
        takes fewer multiply-adds per head: T R (N + V) + T S (2R + P) for the absorbed queries,
        the scores against [latent | rotary key] and the weighted latents through W_UV, against
        S R (N + V) + T S (N + P + V) for expanding every key and attending per head."""
        if self.fold != "auto":
            return self.fold == "always"
        if not cached:
            return False
        T, S, R, P, N, V = queries, keys, self.kv_rank, self.rope_dim, self.nope_dim, self.v_head_dim
        return T * R * (N + V) + T * S * (2 * R + P) < S * R * (N + V) + T * S * (N + P + V)

    def folded(self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor, *, mask: Tensor | Mask | None,
               is_causal: bool, dropout_p: float) -> Tensor:
        """The heads' outputs (B, H, T, V) computed in the latent's space (module docstring): queries
        ``q_nope`` (B, H, T, N) through each head's key rows of ``kv_b`` beside ``q_rope`` (B, H, T, P)
        against the keys [``latent`` | ``k_rope``] (B, 1, S, R + P), one key/value head, the values
        the latents, the weighted sum through each head's value rows. ``kv_b``'s weight is read as
        the linear computes with it (:meth:`zoo.components.linear.Linear.effective_weight`: with a
        LoRA update added)."""
        w = rearrange(self.kv_b.effective_weight(), "(h e) r -> h e r", h=self.n_heads)
        w_uk, w_uv = w.split([self.nope_dim, self.v_head_dim], dim=1)  # (H, N, R), (H, V, R)
        q = torch.cat([torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk), q_rope], dim=-1)  # (B, H, T, R + P)
        k = torch.cat([latent, k_rope], dim=-1)
        scale = self.scale if self.scale is not None else self.head_dim ** -0.5  # the heads' size, not R + P
        is_causal = is_causal and mask is None
        if isinstance(mask, Mask):
            mask, is_causal = mask.dense()
        B, H, T, _ = q.shape
        if self.kernel == "scores":
            y = kernels.scores_attention(q, k, latent, mask=mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                                         softcap=self.softcap)
        elif not is_causal and (mask is None or (mask.dim() == 4 and mask.shape[1] == 1)):
            # one key/value head: the heads' queries become rows of one head (no copy of the keys per head)
            rows = None if mask is None else mask[:, :, None].expand(-1, -1, H, -1, -1).flatten(2, 3)
            y = kernels.attention(q.reshape(B, 1, H * T, -1), k, latent, mask=rows, dropout_p=dropout_p, scale=scale)
            y = y.view(B, H, T, -1)
        else:
            y = kernels.attention(q, k, latent, mask=mask, is_causal=is_causal, dropout_p=dropout_p, enable_gqa=True,
                                  scale=scale)
        return torch.einsum("bhtr,hvr->bhtv", y, w_uv)

    def expand(self, latent: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """The heads' keys (B, H, S, N + P) and values (B, H, S, V) of cached ``latent`` (B, 1, S, R)
        and rotary keys ``k_rope`` (B, 1, S, P)."""
        kv = rearrange(self.kv_b(latent[:, 0]), "b s (h e) -> b h s e", h=self.n_heads)
        k_nope, v = kv.split([self.nope_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(-1, self.n_heads, -1, -1)], dim=-1)
        return k, v

    def cache_elements(self) -> int:
        """Elements cached per token: the latent and the rotary key, R + P."""
        return self.kv_rank + self.rope_dim

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Forward FLOPs over ``tokens`` tokens without a cache: the projections (the latent
        expanded once per key, as the forward pass does), q·k for every (query, key) pair and the
        weighted sum of values; with ``fold: always``, the folded pass's: ``kv_b``'s weight applied
        to each query and each weighted latent instead, the pairs in the latent's width (2R + P)."""
        if self.fold == "always":
            H, N, V, R, P = self.n_heads, self.nope_dim, self.v_head_dim, self.kv_rank, self.rope_dim
            projections = sum(linear_flops(m, tokens) for m in (self.q, self.q_a, self.q_b, self.kv_a, self.out))
            return projections + 2 * tokens * H * R * (N + V) + 2 * tokens * tokens * H * (2 * R + P)
        projections = sum(linear_flops(m, tokens) for m in (self.q, self.q_a, self.q_b, self.kv_a, self.kv_b, self.out))
        return projections + 2 * tokens * tokens * self.n_heads * (self.head_dim + self.v_head_dim)

    def saved(self, tokens: int, memory: int | None = None, *, rotates: bool = False) -> int:
        """Elements kept for the backward pass besides the input: with ``q_rank`` the query latent,
        its normalised copy and the norm's output (3Q); the kv down projection (R + P), the
        normalised latent and the norm's output (2R); the assembled queries and keys (2HK), the
        values and the attention output (2HV). The rotation keeps only its cos and sin. Queries and
        keys wider than the values (K != V) take SDPA's math path on the CPU, which keeps the
        H x T x S softmax weights, as the ``scores`` kernel does (three such tensors there). Counted
        for the unfolded pass, the one ``fold: auto`` trains with."""
        H, K, V, R, P = self.n_heads, self.head_dim, self.v_head_dim, self.kv_rank, self.rope_dim
        q_latent = 3 * self.q_rank if self.q_rank is not None else 0
        per_token = q_latent + (R + P) + 2 * R + 2 * H * K + 2 * H * V
        if self.kernel == "scores":
            weights = 3 * H * tokens * tokens
        else:
            weights = H * tokens * tokens if K != V else 0
        return tokens * per_token + weights


@register("attention", "mla")
def _mla(spec, *, dim: int, d_model: int, dropout: float, cross: bool = False, **_) -> LatentAttention:
    if cross:
        raise ValueError("attention.kind: mla is self-attention; a cross-attention is mha, gqa or mqa")
    return LatentAttention(dim, n_heads=spec.n_heads, q_rank=spec.q_lora_rank, kv_rank=spec.kv_lora_rank,
                           nope_dim=spec.qk_nope_head_dim, rope_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_size(d_model),
                           bias=spec.bias, out_bias=spec.has_out_bias, eps=spec.latent_eps, dropout=dropout,
                           scale=spec.score_scale(d_model), softcap=spec.softcap, kernel=spec.kernel, fold=spec.fold)
