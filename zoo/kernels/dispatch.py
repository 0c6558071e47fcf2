"""One function per kind of computation: the kernel under :mod:`zoo.kernels.cpu` where its
``applies`` says so, the torch op with the same semantics everywhere else.

Components call these and nothing under :mod:`zoo.kernels.cpu`, so they read as the paper does.
:func:`attention` runs fused kernels; :func:`scores_attention` makes the scores explicit, for what
no fused kernel computes (soft-capped scores). Which one an attention takes is its spec's
``kernel`` (:class:`zoo.spec.AttentionSpec`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.kernels import blocked, cpu, flex, policy
from zoo.kernels.cpu import banded
from zoo.kernels.mask import Mask

__all__ = ["BACKENDS", "attention", "attention_backend", "backend_for", "dropout", "linear", "scores_attention"]

BACKENDS = policy.FIELDS["attention"]


def attention_backend(name: str) -> policy.use:
    """Within this context (``with``) a structured :class:`~zoo.kernels.mask.Mask` is computed by
    backend ``name``: ``auto`` (default: ``flex`` on CUDA and ``blocked`` on CPU where the mask bounds
    its keys enough to gain, by rule or as measured on the CPU: :mod:`zoo.kernels.cpu.banded`; else
    ``dense``), ``dense`` (SDPA, or zoo's CPU kernel, on the dense mask), ``blocked``
    (:mod:`zoo.kernels.blocked`; masks that bound nothing stay dense) or ``flex``
    (:mod:`zoo.kernels.flex`, CUDA only). The kernel policy's ``attention`` field:
    ``zoo.kernels.use(attention=name)``."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r}: use one of {', '.join(BACKENDS)}")
    return policy.use(attention=name)


def backend_for(mask: Mask, q: Tensor, dropout_p: float = 0.0) -> str:
    """Which backend computes ``mask`` for queries ``q`` under the current :func:`attention_backend`:
    dense, blocked or flex. An explicit flex where it cannot run is refused naming the one that would."""
    name = policy.policy().attention
    if name == "flex":
        why = flex.refusal(q, dropout_p)
        if why is not None:
            raise ValueError(f"run.attention=flex: {why}")
        return "flex"
    if name == "dense" or mask.trivial:
        return "dense"
    if name == "blocked":
        return "blocked" if blocked.band(mask) is not None else "dense"
    if q.device.type == "cuda":  # measured on an H100: flex 1.6-2x dense at T 4096 / W 256, 0.86x at T 256 / W 128
        grad_bias = mask.bias is not None and mask.bias.requires_grad
        sparse = blocked.worth_it(mask, min_keys=256, gathered_bias=False)  # flex reads the bias in place
        if torch.compiler.is_compiling() and mask.documents is not None and mask.k_len >= 256:
            sparse = True  # packed documents: their longest is a host sync away, flex skips the empty blocks
        return "flex" if sparse and not grad_bias and flex.refusal(q, dropout_p) is None else "dense"
    return "blocked" if banded.prefers_blocked(mask, q, _dense_attention) else "dense"  # the rule, or measured


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; fp32 products on CPU may run on oneDNN (:mod:`zoo.kernels.cpu.linear`)."""
    if cpu.linear.applies(x, weight, bias):
        policy.note("linear", "onednn", x, weight)
        return cpu.linear.linear(x, weight, bias)
    policy.note("linear", "aten", x, weight)
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
    mask: Tensor | Mask | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    enable_gqa: bool = False,
    scale: float | None = None,
) -> Tensor:
    """``F.scaled_dot_product_attention`` with its arguments and semantics: q (B, H, T, K),
    k (B, G, S, K), v (B, G, S, V) -> (B, H, T, V); ``mask`` boolean (True = may attend) or additive,
    broadcastable to [B, H, T, S], or a structured :class:`~zoo.kernels.mask.Mask`, which the backend
    :func:`backend_for` picks computes (blocked, flex, or its dense form); ``scale`` on the scores
    (None: 1/sqrt(K)). On CPU, short sequences and attention dropout run :mod:`zoo.kernels.cpu.attention`."""
    if isinstance(mask, Mask):
        backend = backend_for(mask, q, dropout_p)
        policy.note("mask", backend, q, k)
        if backend == "flex":
            return flex.attention(q, k, v, mask, scale=scale, enable_gqa=enable_gqa)
        if backend == "blocked":
            return blocked.attention(q, k, v, mask, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa,
                                     inner=_dense_attention)
        mask, is_causal = mask.dense()
    return _dense_attention(q, k, v, mask, is_causal, dropout_p, enable_gqa, scale)


def _dense_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout_p: float,
                     enable_gqa: bool, scale: float | None) -> Tensor:
    """SDPA, or zoo's CPU kernel where it applies, on a dense mask."""
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)  # an additive bias (ALiBi) in the compute dtype, as SDPA requires
    if cpu.attention.applies(q, k, dropout_p, mask, is_causal, v.shape[-1]):
        policy.note("attention", "zoo", q, k)
        return cpu.attention.attention(q, k, v, mask, is_causal, dropout_p, scale=scale)
    policy.note("attention", "sdpa", q, k)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=enable_gqa, scale=scale
    )


def scores_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """:func:`attention`'s semantics computed on explicit scores, with ``softcap`` (Gemma 2): the
    scaled scores become ``softcap * tanh(scores / softcap)`` before the mask (or additive bias) and
    the softmax. Scores, tanh and softmax in fp32, the weighted sum of values in v's dtype; plain
    autograd, so the backward pass keeps the [B, H, T, S] scores' tanh, the weights and their cast
    (what fused kernels avoid). Dropout on the weights as :func:`dropout`; a query with no allowed
    key gets zeros, as in SDPA. Any device. q (B, H, T, K), k (B, G, S, K), v (B, G, S, V) -> (B, H, T, V).
    A structured :class:`~zoo.kernels.mask.Mask` is taken in its dense form. ``sinks`` [H] (gpt-oss's
    attention sinks): one more logit per head joins each query's softmax and is dropped after it, so
    a query's weights sum to less than one."""
    if isinstance(mask, Mask):
        mask, is_causal = mask.dense()
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # GQA/MQA: each key/value head serves ``rep`` consecutive query heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q.float() @ k.float().transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    T, S = scores.shape[-2:]
    if is_causal:  # top-left aligned, as SDPA's is_causal
        scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    elif mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask.float()
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]
    else:
        weights = scores.softmax(dim=-1)
    if mask is not None:
        weights = weights.nan_to_num(0.0)
    weights = dropout(weights, dropout_p)
    return weights.to(v.dtype) @ v
