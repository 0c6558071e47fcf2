"""Attention: one module for MHA, GQA and MQA, self or cross, on F.scaled_dot_product_attention.

Shapes: B batch, T query length, S key length, D model width, H query heads, G key/value heads
(H for MHA, 1 for MQA, a divisor of H for GQA), K query/key size per head, V value size per head.

Masks follow one convention everywhere in zoo: a boolean padding mask is ``[B, T]`` with True for a
real token and False for padding (HF's ``attention_mask``; the opposite of PyTorch's
``key_padding_mask``). :func:`attention_mask` turns causality, padding and a position bias into the
one ``attn_mask`` SDPA takes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.components.cache import LayerCache
from zoo.components.dropout import cpu_dropout_applies, keep_mask, keep_scale
from zoo.components.linear import Linear
from zoo.components.position import Position
from zoo.registry import register


# Attention on CPU. SDPA's flash kernel works in blocks of queries and keys and has no dropout, so
# with dropout SDPA falls back to its math path (fp32 throughout, bernoulli_ masks). zoo's own path
# (:class:`_CpuAttention`: fp32 scores and softmax, bf16 matmuls where the inputs are bf16, masks
# from :mod:`zoo.components.dropout`) is faster wherever the [B, H, T, S] weights are small enough.
# Measured on a 2-core AVX-512 EPYC (SDPA's faster kernel / zoo):
#   training (fwd+bwd), bf16: 4.3x at 64 keys, 2.7x at 128, 1.7-1.9x at 197 (ViT), 1.35x at 256
#     causal, 1.2-1.3x at 512, 0.74x at 1024; fp32: 1.5x at 64, 1.2x at 128, 1.06x at 197, level or
#     behind from 256 (fp32 batched matmuls run on MKL, slower than oneDNN's on AMD);
#   inference (forward), bf16: 1.5-1.9x up to 64 keys, 1.2x at 197, 1.15x at 512; fp32: 1.4-3x up to
#     64 keys (SDPA's math path included), 0.9x at 197;
#   with dropout SDPA's math path is slower still at any length.
# Decoding steps (fewer than 8 queries against a cache) keep SDPA's flash kernel: 1.1-5x faster
# than the math path there.
_ZOO_KEYS = {  # (training, inference): the longest key sequence zoo's path takes without dropout
    torch.bfloat16: (512, 512),
    torch.float16: (512, 512),
    torch.float32: (224, 64),
}
_MIN_QUERIES = 8
_SDPA_ONLY = contextvars.ContextVar("zoo_sdpa_only", default=False)


@contextlib.contextmanager
def sdpa_only() -> Iterator[None]:
    """Within this context every attention goes through ``F.scaled_dot_product_attention`` (so a
    forced SDPA kernel, ``torch.nn.attention.sdpa_kernel``, applies everywhere)."""
    token = _SDPA_ONLY.set(True)
    try:
        yield
    finally:
        _SDPA_ONLY.reset(token)


def _use_cpu_attention(q: Tensor, k: Tensor, p: float, mask: Tensor | None) -> bool:
    """zoo's CPU attention for dropout, or where it beats SDPA's kernels (above)."""
    if q.device.type != "cpu" or torch.compiler.is_compiling() or not q.is_floating_point() or _SDPA_ONLY.get():
        return False
    if mask is not None and mask.requires_grad:  # a trainable bias: SDPA's autograd covers it
        return False
    if p:
        return cpu_dropout_applies(q, p)
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    if not training and q.shape[-2] < _MIN_QUERIES:
        return False
    return k.shape[-2] <= _ZOO_KEYS.get(q.dtype, (0, 0))[0 if training else 1]


class Attention(nn.Module):
    """Multi-head attention with ``n_kv_heads`` key/value heads shared by groups of query heads.

    Self-attention fuses the q, k, v projections into one ``qkv`` linear; cross-attention has ``q``
    on the queries and a fused ``kv`` on the memory.
    """

    def __init__(
        self,
        dim: int,
        *,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        v_head_dim: int,
        bias: bool = True,
        dropout: float = 0.0,
        cross: bool = False,
        kv_dim: int | None = None,
    ) -> None:
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim, self.v_head_dim = head_dim, v_head_dim
        self.dropout, self.cross = dropout, cross
        q_size, k_size, v_size = n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * v_head_dim
        self.splits = (q_size, k_size, v_size)
        if cross:
            self.q = Linear(dim, q_size, bias=bias)
            self.kv = Linear(kv_dim or dim, k_size + v_size, bias=bias)
        else:
            self.qkv = Linear(dim, q_size + k_size + v_size, bias=bias)
        self.out = Linear(n_heads * v_head_dim, dim, bias=bias)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        pos: Position | None = None,
        positions: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """x [B, T, D] (and memory [B, S, Dm] for cross-attention) -> [B, T, D].

        ``mask``: boolean (True = may attend) or additive, broadcastable to [B, H, T, S].
        ``pos``/``positions``: the model's position module rotates q and k (self-attention only).
        ``cache``: keys/values of earlier steps; self-attention appends to it, cross-attention computes
        the memory's keys/values once and reuses them (``memory`` may then be None).
        """
        B, T, _ = x.shape
        if self.cross:
            q = self.q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, K)
            if cache is not None and cache.memory_kv is not None:
                k, v = cache.memory_kv
            else:
                k, v = self._heads_kv(self.kv(memory))
                if cache is not None:
                    cache.memory_kv = (k, v)
        else:
            q, kv = self.qkv(x).split([self.splits[0], self.splits[1] + self.splits[2]], dim=-1)
            q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, K)
            k, v = self._heads_kv(kv)
            if pos is not None:
                q, k = pos.rotate(q, k, positions)
            if cache is not None:
                k, v = cache.append(k, v)
        if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)  # an additive bias (ALiBi) in the compute dtype, as SDPA requires
        p = self.dropout if self.training else 0.0
        if _use_cpu_attention(q, k, p, mask):
            y = _cpu_attention(q, k, v, mask, is_causal and mask is None, p)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v,
                attn_mask=mask,
                dropout_p=p,
                is_causal=is_causal and mask is None,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )  # (B, H, T, V)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_heads * self.v_head_dim))


    def _heads_kv(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """[B, S, G*K + G*V] -> k (B, G, S, K), v (B, G, S, V)."""
        B, S, _ = kv.shape
        k, v = kv.split(self.splits[1:], dim=-1)
        k = k.view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, S, self.n_kv_heads, self.v_head_dim).transpose(1, 2)
        return k, v


def _cpu_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, p: float) -> Tensor:
    """Attention on CPU where it beats SDPA (see ``_ZOO_KEYS``) and for all attention dropout there:
    SDPA's semantics, with dropout ``p`` on the weights from zoo's CPU masks.

    Precision is flash attention's (FA2): scores, softmax and the weights' gradient in fp32; the
    weights and the scores' gradient rounded to the inputs' dtype for the matmuls with v, q and k. In
    fp32 every step is fp32. With bf16 inputs four of the six batched matmuls run in bf16, ~6x faster
    than fp32 on CPUs without fast fp32 batched GEMMs (a 2-core AMD EPYC: 870 vs 140-170 GFLOP/s).
    It keeps the [B, H, T, S] weights for the backward pass, as SDPA's math path does.
    q (B, H, T, K), k (B, G, S, K), v (B, G, S, V) -> (B, H, T, V) in q's dtype.
    """
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # GQA/MQA: each key/value head serves ``rep`` consecutive query heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    with torch.autocast(q.device.type, enabled=False):
        return _CpuAttention.apply(q, k, v, mask, is_causal, p)


class _CpuAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, p: float) -> Tensor:
        scale = q.shape[-1] ** -0.5
        scores = q.float() @ k.float().transpose(-2, -1)  # (B, H, T, S), fp32
        scores.mul_(scale)
        T, S = scores.shape[-2:]
        if is_causal:  # top-left aligned, as SDPA's is_causal
            scores.masked_fill_(torch.ones(T, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        elif mask is not None and mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        elif mask is not None:
            scores.add_(mask)
        weights = scores.softmax(dim=-1)
        del scores
        if mask is not None:
            weights.nan_to_num_(0.0)  # a query with no allowed key attends to nothing, as in SDPA
        keep = None
        if p:
            keep = keep_mask(weights.shape, p, torch.float32).mul_(keep_scale(p))  # 0 or the scale
        dropped = (weights if keep is None else weights * keep).to(v.dtype)
        ctx.save_for_backward(q, k, v, weights, keep)
        ctx.scale = scale
        return dropped @ v  # (B, H, T, V)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, weights, keep = ctx.saved_tensors
        grad = grad.to(v.dtype)
        grad_v = (weights if keep is None else weights * keep).to(v.dtype).transpose(-2, -1) @ grad  # (B, H, S, V)
        grad_w = grad.float() @ v.float().transpose(-2, -1)  # (B, H, T, S), fp32
        if keep is not None:
            grad_w.mul_(keep)
        grad_s = torch._softmax_backward_data(grad_w, weights, -1, torch.float32).mul_(ctx.scale).to(q.dtype)
        del grad_w
        grad_q = grad_s @ k
        grad_k = grad_s.transpose(-2, -1) @ q
        return grad_q, grad_k, grad_v, None, None, None


def attention_mask(
    *,
    q_len: int,
    k_len: int,
    causal: bool,
    key_padding: Tensor | None = None,
    bias: Tensor | None = None,
    device: torch.device | None = None,
) -> tuple[Tensor | None, bool]:
    """Combine causality, key padding ([B, S], True = real) and an additive bias ([B|1, H, T, S]).

    Returns ``(mask, is_causal)`` for SDPA. With nothing to combine, the mask is None and causality is
    left to SDPA's ``is_causal`` flag (its fastest path). The last query attends to the last key, so
    with a KV cache (k_len > q_len) the causal diagonal is shifted. A padded query in a square
    self-attention may attend to itself, so no row is empty (empty rows make NaN); real tokens'
    outputs do not change.
    """
    if key_padding is None and bias is None and (not causal or q_len in (1, k_len)):
        return None, causal and q_len > 1
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        allowed = allowed.tril(diagonal=k_len - q_len)
    allowed = allowed[None, None]  # (1, 1, T, S)
    if key_padding is not None:
        allowed = allowed & key_padding[:, None, None, :].to(torch.bool)  # (B, 1, T, S)
        if q_len == k_len:
            allowed = allowed | torch.eye(q_len, dtype=torch.bool, device=allowed.device)
    if bias is None:
        return allowed, False
    return bias.masked_fill(~allowed, float("-inf")), False


@register("attention", "mha")
@register("attention", "gqa")
@register("attention", "mqa")
def _attention(spec, *, dim: int, d_model: int, dropout: float, cross: bool = False, kv_dim: int | None = None, **_) -> Attention:
    return Attention(
        dim,
        n_heads=spec.n_heads,
        n_kv_heads=spec.kv_heads,
        head_dim=spec.qk_size(d_model),
        v_head_dim=spec.v_size(d_model),
        bias=spec.bias,
        dropout=dropout,
        cross=cross,
        kv_dim=kv_dim,
    )
