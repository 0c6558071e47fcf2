"""Attention: one module for MHA, GQA and MQA, self or cross, with F.scaled_dot_product_attention's
semantics (computed by :func:`zoo.kernels.attention`).

Shapes: B batch, T query length, S key length, D model width, H query heads, G key/value heads
(H for MHA, 1 for MQA, a divisor of H for GQA), K query/key size per head, V value size per head.

Masks follow one convention everywhere in zoo: a boolean padding mask is ``[B, T]`` with True for a
real token and False for padding (HF's ``attention_mask``; the opposite of PyTorch's
``key_padding_mask``). :func:`attention_mask` turns causality, padding and a position bias into the
one ``attn_mask`` SDPA takes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from zoo import kernels
from zoo.components.cache import LayerCache
from zoo.components.linear import Linear
from zoo.components.norm import RMSNorm
from zoo.components.parts import linear_flops
from zoo.components.position import Position
from zoo.kernels import Mask
from zoo.protocols import CountsFlops, HeadSizes, ResidualWriter, SavesActivations, SummaryPart
from zoo.registry import register


class PlainRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) over the last dimension, without a weight, computed in float32 and
    cast back (Llama 4's ``Llama4TextL2Norm`` on queries and keys)."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def qk_norm_layer(kind: str, size: int, eps: float, unit_offset: bool = False, affine: bool = True) -> nn.Module:
    """The norm of a query/key vector of ``size`` features: LayerNorm (with bias) or RMSNorm (by
    (1 + weight) with ``unit_offset``, Gemma 3; without a weight unless ``affine``, Llama 4)."""
    if kind == "rmsnorm" and not affine:
        return PlainRMSNorm(eps)
    if kind == "layernorm" and not unit_offset:
        return nn.LayerNorm(size, eps=eps)
    if kind == "rmsnorm":
        return RMSNorm(size, eps=eps, unit_offset=unit_offset)
    raise ValueError(f"qk_norm: kind must be layernorm or rmsnorm (unit_offset: rmsnorm only), got {kind!r}")


class Attention(nn.Module, ResidualWriter, SummaryPart, CountsFlops, SavesActivations, HeadSizes):
    """Multi-head attention with ``n_kv_heads`` key/value heads shared by groups of query heads.

    Self-attention fuses the q, k, v projections into one ``qkv`` linear; cross-attention has ``q``
    on the queries and a fused ``kv`` on the memory. ``bias`` puts biases on those projections and,
    unless ``out_bias`` says otherwise, on the output projection ``out``. ``key_bias=False`` keeps the
    key's share of them at zero: the projections then have none of their own, and ``q_bias`` and
    ``v_bias`` hold the queries' and values' (EVA, BEiT; timm's layout).

    ``qk_norm`` (``layernorm`` or ``rmsnorm``) adds ``q_norm`` and ``k_norm``, applied to queries and
    keys before positions rotate them and before the scores: over each head's K features
    (``qk_scope="head"``, weights [K]) or over the whole projections before the head split
    (``qk_scope="all"``, weights [H*K] and [G*K]).

    ``scale`` multiplies the scores (None: 1/sqrt(K)); ``softcap`` caps them,
    ``softcap * tanh(scores / softcap)``. ``kernel`` is what computes them, as the spec declares
    (:attr:`zoo.spec.AttentionSpec.kernel`): ``fused`` (:func:`zoo.kernels.attention`: SDPA or zoo's
    CPU kernel) or ``scores`` (:func:`zoo.kernels.scores_attention`), which a cap needs, and
    ``sinks`` (gpt-oss): a learned logit per head, the parameter ``sinks`` [H], that joins each
    query's softmax denominator and is dropped after it. ``gate`` (Qwen3-Next's gated attention):
    ``qkv`` also projects a gate per head (each head's V gate rows after its K query rows, HF's
    q_proj layout) whose sigmoid multiplies the head's output before ``out``.

    ``temperature`` ((floor, scale), Llama 4's NoPE layers) multiplies each query, after the qk-norm
    and the rotation, by ``1 + scale * log(1 + floor((slot + 1) / floor))`` in float32, its slot the
    index of its key in the sequence (padding and cached tokens counted: the cache's slots).
    """

    residual_out = ("out",)  # writes into the residual stream (zoo.components.parts)
    summary_part = "attention"

    def __init__(
        self,
        dim: int,
        *,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        v_head_dim: int,
        bias: bool = True,
        out_bias: bool | None = None,
        key_bias: bool = True,
        dropout: float = 0.0,
        cross: bool = False,
        kv_dim: int | None = None,
        qk_norm: str | None = None,
        qk_scope: str = "head",
        qk_eps: float = 1e-6,
        qk_unit_offset: bool = False,
        qk_affine: bool = True,
        scale: float | None = None,
        softcap: float | None = None,
        kernel: str = "fused",
        temperature: tuple[int, float] | None = None,
        sinks: bool = False,
        gate: bool = False,
    ) -> None:
        super().__init__()
        if kernel not in ("fused", "scores"):
            raise ValueError(f"kernel must be fused or scores, got {kernel!r}")
        if softcap is not None and kernel != "scores":
            raise ValueError("softcap: no fused kernel caps the scores; build the attention with kernel='scores'")
        if sinks and kernel != "scores":
            raise ValueError("sinks: no fused kernel takes attention sinks; build the attention with kernel='scores'")
        self.scale, self.softcap, self.kernel = scale, softcap, kernel
        self.temperature = temperature
        # gpt-oss's attention sinks: a logit per head in each query's softmax, dropped after it
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        if qk_scope not in ("head", "all"):
            raise ValueError(f"qk_scope must be head or all, got {qk_scope!r}")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim, self.v_head_dim = head_dim, v_head_dim
        self.dropout, self.cross = dropout, cross
        q_size, k_size, v_size = n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * v_head_dim
        if gate and (cross or (bias and not key_bias)):
            raise ValueError("gate: the output gate shares the fused self-attention projection; build it without "
                             "cross and key_bias=False")
        # Qwen3-Next's gated attention: each head's query rows followed by its gate's rows in the projection
        self.gated = gate
        self.splits = (q_size + (n_heads * v_head_dim if gate else 0), k_size, v_size)
        own = bias and key_bias  # the projections' own biases; else q_bias and v_bias with a zero key share
        if cross:
            self.q = Linear(dim, q_size, bias=bias)
            self.kv = Linear(kv_dim or dim, k_size + v_size, bias=own)
        else:
            self.qkv = Linear(dim, sum(self.splits), bias=own)
        self.q_bias = nn.Parameter(torch.zeros(q_size)) if bias and not key_bias and not cross else None
        self.v_bias = nn.Parameter(torch.zeros(v_size)) if bias and not key_bias else None
        self.out = Linear(n_heads * v_head_dim, dim, bias=bias if out_bias is None else out_bias)
        self.qk_scope = qk_scope
        if qk_norm is not None:
            whole = qk_scope == "all"
            self.q_norm = qk_norm_layer(qk_norm, q_size if whole else head_dim, qk_eps, qk_unit_offset, qk_affine)
            self.k_norm = qk_norm_layer(qk_norm, k_size if whole else head_dim, qk_eps, qk_unit_offset, qk_affine)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | Mask | None = None,
        is_causal: bool = False,
        pos: Position | None = None,
        positions: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """x [B, T, D] (and memory [B, S, Dm] for cross-attention) -> [B, T, D].

        ``mask``: boolean (True = may attend) or additive, broadcastable to [B, H, T, S], or a
        structured :class:`zoo.kernels.Mask` (the backends pick how to compute it).
        ``pos``/``positions``: the model's position module rotates q and k (self-attention only).
        ``cache``: keys/values of earlier steps; self-attention appends to it, cross-attention computes
        the memory's keys/values once and reuses them (``memory`` may then be None).
        """
        if self.cross:
            q = self._heads(self.q(x), self.q_norm, self.n_heads)
            if cache is not None and cache.memory_kv is not None:
                k, v = cache.memory_kv
            else:
                k, v = self.memory_kv(memory)
                if cache is not None:
                    cache.memory_kv = (k, v)
        else:
            q, kv = self._project(self.qkv, x, self.q_bias).split([self.splits[0], self.splits[1] + self.splits[2]], dim=-1)
            if self.gated:
                q, gate = rearrange(q, "b t (h e) -> b t h e", h=self.n_heads).split([self.head_dim, self.v_head_dim], -1)
                q, gate = q.flatten(2), gate.flatten(2)
            q = self._heads(q, self.q_norm, self.n_heads)
            k, v = self._split_kv(kv)
            if pos is not None:
                q, k = pos.rotate(q, k, positions)
            if self.temperature is not None:
                q = self.tuned(q, cache)
            if cache is not None:
                k, v = cache.append(k, v)
        dropout_p = self.dropout if self.training else 0.0
        if self.kernel == "scores":
            y = kernels.scores_attention(q, k, v, mask=mask, is_causal=is_causal and mask is None, dropout_p=dropout_p,
                                         scale=self.scale, softcap=self.softcap, sinks=self.sinks)
        else:
            y = kernels.attention(q, k, v, mask=mask, is_causal=is_causal and mask is None, dropout_p=dropout_p,
                                  enable_gqa=self.n_kv_heads != self.n_heads, scale=self.scale)  # (B, H, T, V)
        y = rearrange(y, "b h t v -> b t (h v)")
        return self.out(y * torch.sigmoid(gate) if self.gated and not self.cross else y)

    def tuned(self, q: Tensor, cache: LayerCache | None) -> Tensor:
        """Queries (B, H, T, K) times their temperature (see the class docstring)."""
        T = q.shape[2]
        slots = cache.parent.slots(T).to(q.device) if cache is not None else torch.arange(T, device=q.device)
        floor, strength = self.temperature
        factor = torch.log1p(torch.floor((slots.float() + 1.0) / floor)) * strength + 1.0
        return (q * factor.view(T, 1)).to(q.dtype)

    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Forward FLOPs over ``tokens`` queries (cross-attention: against ``memory`` keys): the
        projections, q·k for every (query, key) pair and the weighted sum of values, for every head."""
        keys = memory if self.cross and memory is not None else tokens
        if self.cross:
            projections = linear_flops(self.q, tokens) + linear_flops(self.kv, keys)
        else:
            projections = linear_flops(self.qkv, tokens)
        scores = 2 * tokens * keys * self.n_heads * (self.head_dim + self.v_head_dim)
        return projections + linear_flops(self.out, tokens) + scores

    def saved(self, tokens: int, memory: int | None = None, *, rotates: bool = False) -> int:
        """Elements kept for the backward pass besides the input: the projections' outputs q, k, v
        and the attention output (the out projection's input); with the fused kernel no T x S
        weights, with the ``scores`` kernel three H x T x S tensors (the scores' tanh, the softmax
        weights and their cast). A qk-norm keeps two more copies of q and k (its output, and
        LayerNorm a contiguous copy of its input or RMSNorm its normalised input); rotation
        (``rotates``) one more."""
        H, G, K, V = self.n_heads, self.n_kv_heads, self.head_dim, self.v_head_dim
        qk = 2 if self.q_norm is not None else 0
        keys = memory if self.cross and memory is not None else tokens
        weights = 3 * H * tokens * keys if self.kernel == "scores" else 0
        gated = 2 * H * V if self.gated else 0  # the gate's sigmoid and the gated output
        if self.cross:
            return tokens * (H * K * (1 + qk) + H * V + gated) + keys * G * (K * (1 + qk) + V) + weights
        return tokens * (H * K + G * (K + V) + H * V + gated + (H + G) * K * (int(rotates) + qk)) + weights

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention's keys and values of ``memory`` [B, S, Dm]: k (B, G, S, K), v (B, G, S, V)."""
        if not self.cross:
            raise ValueError("memory_kv: a self-attention module has no memory; build it with cross=True")
        return self._split_kv(self._project(self.kv, memory, None))

    def _project(self, linear: nn.Module, x: Tensor, q_bias: Tensor | None) -> Tensor:
        """``linear(x)``; with ``v_bias``, plus [q_bias (self-attention) | zeros for the keys | v_bias]."""
        if self.v_bias is None:
            return linear(x)
        zeros = self.v_bias.new_zeros(self.splits[1])
        bias = torch.cat([zeros, self.v_bias] if q_bias is None else [q_bias, zeros, self.v_bias])
        return kernels.linear(x, linear.weight, bias)

    def _split_kv(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """[B, S, G*K + G*V] -> k (B, G, S, K) (normalised, with qk-norm), v (B, G, S, V)."""
        k, v = kv.split(self.splits[1:], dim=-1)
        k = self._heads(k, self.k_norm, self.n_kv_heads)
        v = rearrange(v, "b s (g v) -> b g s v", g=self.n_kv_heads)
        return k, v

    def _heads(self, x: Tensor, norm: nn.Module | None, heads: int) -> Tensor:
        """Queries or keys [B, T, heads*K] -> (B, heads, T, K), through the qk-norm if there is one."""
        if norm is not None and self.qk_scope == "all":
            x = norm(x)
        x = rearrange(x, "b t (h k) -> b h t k", h=heads)
        if norm is not None and self.qk_scope == "head":
            x = norm(x)
        return x


def attention_mask(
    *,
    q_len: int,
    k_len: int,
    causal: bool,
    padding_mask: Tensor | None = None,
    bias: Tensor | None = None,
    window: int | None = None,
    documents: Tensor | None = None,
    device: torch.device | None = None,
) -> tuple[Tensor | None, bool]:
    """The dense form of :class:`zoo.kernels.Mask` (see it for the rules): causality, the keys'
    ``padding_mask`` ([B, S], True = real), an additive ``bias`` ([B|1, H, T, S]), a sliding ``window``
    (causal: each query sees itself and the ``window - 1`` keys before it; bidirectional: the keys
    within ``window // 2`` on either side) and ``documents`` ([B, S] ids: a token sees its own only).

    Returns ``(mask, is_causal)`` for SDPA. With nothing to combine, the mask is None and causality is
    left to SDPA's ``is_causal`` flag (its fastest path). The last query attends to the last key, so
    with a KV cache (k_len > q_len) the causal diagonal is shifted. The window counts key slots,
    padding included, as HF does; with left padding (generation's) that is the same as counting real
    tokens.
    """
    padding = None if padding_mask is None else padding_mask.to(torch.bool)
    return Mask(q_len, k_len, causal=causal, window=window, padding=padding, documents=documents, bias=bias,
                device=device).dense()


@register("attention", "mha")
@register("attention", "gqa")
@register("attention", "mqa")
def _attention(spec, *, dim: int, d_model: int, dropout: float, cross: bool = False, kv_dim: int | None = None, **_) -> Attention:
    qk = spec.qk_norm
    return Attention(
        dim,
        n_heads=spec.n_heads,
        n_kv_heads=spec.n_kv_heads,
        head_dim=spec.qk_size(d_model),
        v_head_dim=spec.v_size(d_model),
        bias=spec.bias,
        out_bias=spec.has_out_bias,
        key_bias=spec.key_bias,
        dropout=dropout,
        cross=cross,
        kv_dim=kv_dim,
        qk_norm=qk.kind if qk is not None else None,
        qk_scope=qk.scope if qk is not None else "head",
        qk_eps=qk.eps if qk is not None else 1e-6,
        qk_unit_offset=qk.unit_offset if qk is not None else False,
        qk_affine=qk.affine if qk is not None else True,
        scale=spec.score_scale(d_model),
        softcap=spec.softcap,
        kernel=spec.kernel,
        temperature=None if spec.temperature is None else (spec.temperature.floor, spec.temperature.scale),
        sinks=spec.sinks,
        gate=spec.gate,
    )
