"""On a CPU, blocked or dense attention for a mask that bounds its keys, chosen by measurement.

:func:`zoo.kernels.blocked.worth_it` is a rule from one CPU (a 2-core Intel Xeon): the blocked kernel
where its band is at most half the keys, a quarter (fp32) or a fifth (16-bit) with a bias. Where
SDPA's dense kernel and the batched band calls run at other relative speeds (AMX bf16 on Intel, fp32
GEMMs on AMD), the crossing moves. So within the region where blocking can pay at all (a band of at
most half the keys, at least 512 keys), the first mask of a shape class times both on random inputs
of the class, a causal window with the same band (the rule's answer stands unless the other is 10%
faster, :mod:`zoo.kernels.cpu.choose`), and the machine remembers it. ``ZOO_CPU_ATTENTION=rule``
keeps the rule, and so does a model under torch.compile.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from zoo.kernels import blocked
from zoo.kernels.cpu import choose
from zoo.kernels.cpu.attention import setting
from zoo.kernels.mask import AlibiBias, Mask, RelativeBias

__all__ = ["band_class", "prefers_blocked"]

_TIMED_MACS = 1 << 28  # the dense call of a class: about a second forward + backward at most


def _bias_kind(mask: Mask) -> str:
    if mask.bias is None:
        return "none"
    return "alibi" if isinstance(mask.bias, AlibiBias) else "relative" if isinstance(mask.bias, RelativeBias) else "tensor"


def band_class(dtype: torch.dtype, training: bool, bh: int, t: int, band: int, k: int, bias: str) -> tuple:
    """The shape class sharing one choice: dtype, training or not, the bias's kind, the head size, and
    the keys, the band's keys and batch x heads rounded up to powers of two (batch x heads at most
    what keeps the timed dense call near 2^28 multiply-adds)."""
    t, band = choose.pow2(t), choose.pow2(band)
    bh = min(choose.pow2(bh), max(1, 1 << max(0, (_TIMED_MACS // max(1, t * t * k)).bit_length() - 1)))
    return str(dtype).removeprefix("torch."), "train" if training else "infer", bh, t, band, k, bias


def prefers_blocked(mask: Mask, q: Tensor, dense: Callable[..., Tensor]) -> bool:
    """Whether the blocked kernel computes ``mask`` for queries ``q`` on this CPU: the rule
    (:func:`~zoo.kernels.blocked.worth_it`) outside the region where blocking can pay or under
    ``ZOO_CPU_ATTENTION=rule``, else as measured for the class. ``dense(q, k, v, mask, is_causal,
    dropout_p, enable_gqa, scale)`` is the dispatcher's dense attention (SDPA or zoo's kernel)."""
    rule = blocked.worth_it(mask, dtype=q.dtype)
    shape = blocked.band(mask)
    if shape is None or mask.k_len < blocked.MIN_KEYS or q.device.type != "cpu" or torch.compiler.is_compiling():
        return rule
    C, back, ahead = shape
    keys = (back + ahead + 1) * C
    if keys * 2 > mask.k_len or setting() == "rule":
        return rule
    training = torch.is_grad_enabled() and q.requires_grad
    cls = band_class(q.dtype, training, q.shape[0] * q.shape[1], mask.k_len, keys, q.shape[-1], _bias_kind(mask))
    name = "{}/{}/bh{}/t{}/band{}/k{}/{}".format(*cls)
    known = choose.known("banded_attention", name)  # the hot path (every attention call): one lookup
    if known in ("blocked", "dense"):
        return known == "blocked"
    made = _timing_calls(cls, dense)
    order = ("blocked", "dense") if rule else ("dense", "blocked")
    return choose.pick("banded_attention", name, {n: made[n] for n in order}) == "blocked"


def _timing_calls(cls: tuple, dense: Callable[..., Tensor]) -> dict:
    """The blocked and the dense call (forward, and backward when training) on random inputs of the
    class: a causal window whose band has the class's keys, with the class's kind of bias."""
    dtype_name, mode, bh, t, keys, k, bias = cls
    dtype, training = getattr(torch, dtype_name), mode == "train"
    C = max(blocked.MIN_BLOCK, 16 * -(-keys // 48))  # a reach of 2C: blocks of C, two back, the band 3C
    made: dict = {}

    def inputs():
        if not made:
            g = torch.Generator().manual_seed(0)  # never the global generator (zoo.kernels.cpu.choose)
            made["qkv"] = [torch.randn(1, bh, t, k, generator=g).to(dtype) for _ in range(3)]
            made["grad"] = torch.randn(1, bh, t, k, generator=g).to(dtype)
            pos = torch.arange(t)
            extra = {"none": None, "alibi": AlibiBias(torch.linspace(0.5, 0.01, bh), pos, pos),
                     "relative": RelativeBias(torch.randn(32, bh, generator=g).requires_grad_(training), pos, pos,
                                              lambda r: (r.clamp(-16, 15) + 16)),  # T5's table of buckets
                     "tensor": torch.randn(1, bh, t, t, generator=g).to(dtype)}[bias]
            made["mask"] = Mask(t, t, causal=True, window=2 * C + 1, bias=extra)
        return (*[x.detach().requires_grad_(training) for x in made["qkv"]], made["mask"]), made["grad"]

    def dense_call(q, k_, v, mask):
        attn_mask, is_causal = mask.dense()
        return dense(q, k_, v, attn_mask, is_causal, 0.0, False, None)

    return {"blocked": choose.step(lambda q, k_, v, m: blocked.attention(q, k_, v, m, inner=dense), inputs, training),
            "dense": choose.step(dense_call, inputs, training)}
