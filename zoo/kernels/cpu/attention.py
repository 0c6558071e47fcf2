"""Attention on CPU, hand-written: faster than SDPA's CPU kernels for short sequences and with dropout.

SDPA's flash kernel works in blocks of queries and keys and has no dropout, so with dropout SDPA
falls back to its math path (fp32 throughout, bernoulli_ masks). zoo's own path
(:class:`_CpuAttention`: fp32 scores and softmax, bf16 matmuls where the inputs are bf16, masks from
:mod:`zoo.kernels.cpu.dropout`) is faster wherever the [B, H, T, S] weights are small enough.
Measured on a 2-core AVX-512 EPYC (SDPA's faster kernel / zoo):

* training (fwd+bwd), bf16: 4.3x at 64 keys, 2.7x at 128, 1.7-1.9x at 197 (ViT), 1.35x at 256
  causal, 1.2-1.3x at 512, 0.74x at 1024; fp32: 1.5x at 64, 1.2x at 128, 1.06x at 197, level or
  behind from 256 (fp32 batched matmuls run on MKL, slower than oneDNN's on AMD);
* inference (forward), bf16: 1.5-1.9x up to 64 keys, 1.2x at 197, 1.15x at 512; fp32: 1.4-3x up to
  64 keys (SDPA's math path included), 0.9x at 197;
* with dropout SDPA's math path is slower still at any length.

Decoding steps (fewer than 8 queries against a cache) keep SDPA's flash kernel: 1.1-5x faster
than the math path there.

Those thresholds (``_ZOO_KEYS``) were measured on one AMD CPU. By default (``ZOO_CPU_ATTENTION=measure``)
the choice without dropout is made by timing instead, up to 1,024 keys: the first call of a shape
class (dtype, training or not, mask kind, head size, and queries, keys and batch x heads rounded up
to powers of two) times both kernels, forward and backward when training, and the faster is kept
per machine (:mod:`zoo.kernels.cpu.choose`); the thresholds' answer stands unless the other kernel
is 10% faster. ``ZOO_CPU_ATTENTION=rule`` keeps the thresholds alone.

Shapes: B batch, H query heads, G key/value heads, T queries, S keys, K query/key size, V value size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.kernels import policy
from zoo.kernels.cpu import choose
from zoo.kernels.cpu.dropout import applies as dropout_applies
from zoo.kernels.cpu.dropout import keep_mask, keep_scale

__all__ = ["applies", "attention", "sdpa_only", "setting"]

_ZOO_KEYS = {  # (training, inference): the longest key sequence zoo's path takes without dropout
    torch.bfloat16: (512, 512),
    torch.float16: (512, 512),
    torch.float32: (224, 64),
}
_MIN_QUERIES = 8
_MEASURED_KEYS = 1024  # longer key sequences keep the rule (SDPA): zoo's kernel keeps [B, H, T, S] weights
_TIMED_MACS = 1 << 27
def sdpa_only() -> policy.use:
    """Within this context (``with``) every attention goes through ``F.scaled_dot_product_attention``
    (so a forced SDPA kernel, ``torch.nn.attention.sdpa_kernel``, applies everywhere): the kernel
    policy's ``zoo.kernels.use(cpu_attention="sdpa")``."""
    return policy.use(cpu_attention="sdpa")


def applies(q: Tensor, k: Tensor, dropout_p: float, mask: Tensor | None, is_causal: bool = False,
            v_dim: int | None = None) -> bool:
    """Whether :func:`attention` is used: for dropout, or where it beats SDPA's kernels: by the rule
    above (``_ZOO_KEYS``), or, under ``ZOO_CPU_ATTENTION=measure`` (the default), as measured on this
    machine for the shape class (:func:`prefers_zoo`). ``v_dim``: the values' head size (default q's)."""
    if q.device.type != "cpu" or torch.compiler.is_compiling() or not q.is_floating_point() or setting() == "sdpa":
        return False
    if mask is not None and mask.requires_grad:  # a trainable bias: SDPA's autograd covers it
        return False
    if dropout_p:
        return dropout_applies(q, dropout_p)
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    if not training and q.shape[-2] < _MIN_QUERIES:
        return False
    rule = k.shape[-2] <= _ZOO_KEYS.get(q.dtype, (0, 0))[0 if training else 1]
    if setting() == "rule" or q.dtype not in _ZOO_KEYS or k.shape[-2] > _MEASURED_KEYS:
        return rule
    kind = "causal" if is_causal else "none" if mask is None else "bool" if mask.dtype == torch.bool else "bias"
    return prefers_zoo(q.dtype, training, q.shape[0] * q.shape[1], q.shape[-2], k.shape[-2], q.shape[-1],
                       v_dim=q.shape[-1] if v_dim is None else v_dim, kind=kind, default=rule)


def setting() -> str:
    """The kernel policy's ``cpu_attention``: ``measure`` (the default: kernels chosen by timing),
    ``rule``, or ``sdpa`` (never zoo's kernel)."""
    return policy.policy().cpu_attention


def attention_class(dtype: torch.dtype, training: bool, bh: int, t: int, s: int, k: int, kind: str,
                    v: int | None = None) -> tuple:
    """The shape class that shares one choice: the dtype, training or not, the mask's kind, the head
    sizes of queries/keys and of values (``v``, default ``k``), and queries, keys and batch x heads
    rounded up to powers of two (batch x heads at most what keeps one timed call near 2^27 multiply-adds)."""
    t, s, v = choose.pow2(t), choose.pow2(s), k if v is None else v
    bh = min(choose.pow2(bh), max(1, 1 << max(0, (_TIMED_MACS // max(1, t * s * (k + v) // 2)).bit_length() - 1)))
    return str(dtype).removeprefix("torch."), "train" if training else "infer", bh, t, s, k, kind, v


def prefers_zoo(dtype: torch.dtype, training: bool, bh: int, t: int, s: int, k: int, *, v_dim: int, kind: str,
                default: bool) -> bool:
    """Whether zoo's kernel beats SDPA for this class on this machine (timed once, cached per machine:
    :mod:`zoo.kernels.cpu.choose`); ``default`` (the rule's answer) stands unless the other is 10% faster."""
    cls = attention_class(dtype, training, bh, t, s, k, kind, v_dim)
    name = "{}/{}/bh{}/t{}/s{}/k{}/{}".format(*cls[:7]) + (f"/v{v_dim}" if v_dim != k else "")
    known = choose.known("attention", name)  # the hot path (every attention call): one lookup
    if known in ("zoo", "sdpa"):
        return known == "zoo"
    made = _timing_calls(cls)
    order = ("zoo", "sdpa") if default else ("sdpa", "zoo")
    return choose.pick("attention", name, {n: made[n] for n in order}) == "zoo"


def _timing_calls(cls: tuple) -> dict:
    """zoo's and SDPA's call (forward, and backward when training) on random inputs of the class."""
    dtype_name, mode, bh, t, s, k, kind, v_dim = cls
    dtype, training = getattr(torch, dtype_name), mode == "train"
    made: dict = {}

    def inputs():
        if not made:
            g = torch.Generator().manual_seed(0)  # never the global generator (zoo.kernels.cpu.choose)
            made["qkv"] = [torch.randn(1, bh, n, d, generator=g).to(dtype) for n, d in ((t, k), (s, k), (s, v_dim))]
            made["grad"] = torch.randn(1, bh, t, v_dim, generator=g).to(dtype)
            made["mask"] = (torch.rand(1, 1, t, s, generator=g) < 0.9) | torch.eye(t, s, dtype=torch.bool)[None, None] \
                if kind == "bool" else torch.randn(1, 1, t, s, generator=g).to(dtype) if kind == "bias" else None
        return (*[x.detach().requires_grad_(training) for x in made["qkv"]], made["mask"]), made["grad"]

    causal = kind == "causal"
    return {"zoo": choose.step(lambda q, k_, v, m: attention(q, k_, v, m, causal, 0.0), inputs, training),
            "sdpa": choose.step(lambda q, k_, v, m: torch.nn.functional.scaled_dot_product_attention(
                q, k_, v, attn_mask=m, is_causal=causal), inputs, training)}


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, p: float, *,
              scale: float | None = None) -> Tensor:
    """Attention on CPU where it beats SDPA (see ``_ZOO_KEYS``) and for all attention dropout there:
    SDPA's semantics, with dropout ``p`` on the weights from zoo's CPU masks and ``scale`` on the
    scores (None: 1/sqrt(K)).

    Precision is flash attention's (FA2): scores, softmax and the weights' gradient in fp32; the
    weights and the scores' gradient rounded to the inputs' dtype for the matmuls with v, q and k. In
    fp32 every step is fp32. With bf16 inputs four of the six batched matmuls run in bf16, ~6x faster
    than fp32 on CPUs without fast fp32 batched GEMMs (a 2-core AMD EPYC: 870 vs 140-170 GFLOP/s).
    It keeps the [B, H, T, S] weights for the backward pass, as SDPA's math path does.
    q (B, H, T, K), k (B, G, S, K), v (B, G, S, V) -> (B, H, T, V) in q's dtype.
    """
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # GQA/MQA: each key/value head serves ``rep`` consecutive query heads
        # = einops.repeat(k, "b g s k -> b (g r) s k", r=rep), which cost 12-24 us more a call at the
        # short lengths this kernel takes (Python overhead): plain torch in this hot path
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    # q, k and v arrive as head views of the projections ([B, T, H, K] in memory): each batched matmul
    # would copy them to merge B and H, the backward's three times more; one copy each, kept for backward
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    with torch.autocast(q.device.type, enabled=False):
        return _CpuAttention.apply(q, k, v, mask, is_causal, p, scale)


class _CpuAttention(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, p: float,
                scale: float | None = None) -> Tensor:
        scale = q.shape[-1] ** -0.5 if scale is None else scale
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
    @torch.amp.custom_bwd(device_type="cpu")  # the forward's autocast state (off): a backward called inside
    def backward(ctx, grad: Tensor):           # an autocast region computes what it computes outside one
        q, k, v, weights, keep = ctx.saved_tensors
        grad = grad.to(v.dtype).contiguous()  # a head view too: copied once, not by each matmul
        grad_v = (weights if keep is None else weights * keep).to(v.dtype).transpose(-2, -1) @ grad  # (B, H, S, V)
        grad_w = grad.float() @ v.float().transpose(-2, -1)  # (B, H, T, S), fp32
        if keep is not None:
            grad_w.mul_(keep)
        grad_s = torch._softmax_backward_data(grad_w, weights, -1, torch.float32).mul_(ctx.scale).to(q.dtype)
        del grad_w
        grad_q = grad_s @ k
        grad_k = grad_s.transpose(-2, -1) @ q
        return grad_q, grad_k, grad_v, None, None, None, None
