"""Dropout masks on CPU from 16-bit random integers instead of ``bernoulli_``.

On CPU, ``F.dropout`` draws one Bernoulli sample per element through a scalar loop: on a 2-core
AMD EPYC it took 7-11 ms for a [8, 256, 768] activation and 27-46 ms for [8, 12, 256, 256]
attention weights, 14% of a GPT-2 small bf16 training step. Filling int64s with random bits and
reading them as four int16 lanes costs ~1 ms and ~4 ms for the same shapes. An element is dropped
when its 16-bit lane falls below a threshold, so the drop probability is ``p`` rounded to a
multiple of 1/65536 (off by at most 7.6e-6); the kept elements are scaled by 1/(1 - that
probability), so the expectation is exactly the input's. The mask is kept in the input's dtype
(fp32 masks carry the scale): torch's kernels that mix a bool mask with floats ran 3-4x slower than
a plain product on CPU, which would undo most of the gain.

Randomness comes from torch's default CPU generator, so ``torch.manual_seed`` and the checkpoints'
saved RNG state make runs and resumes reproducible. On other devices, under torch.compile, and for
p outside (0, 1), :func:`zoo.kernels.dropout` is ``F.dropout``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["applies", "dropout", "keep_mask", "keep_scale", "quantized_p"]

_LANES = 65536


def quantized_p(p: float) -> float:
    """The drop probability the CPU path realises for ``p``: the nearest multiple of 1/65536."""
    return round(p * _LANES) / _LANES


def keep_scale(p: float) -> float:
    """What kept elements are multiplied by: 1 / (1 - ``quantized_p(p)``), so expectations are exact."""
    return 1.0 / (1.0 - quantized_p(p))


def keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> Tensor:
    """1 (keep) or 0 (drop) in ``dtype``, each element dropped with probability ``quantized_p(p)``."""
    n = shape.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)  # all 64 bits random
    lanes = bits.view(torch.int16)[:n].view(shape)  # uniform over [-32768, 32767]
    threshold = round(p * _LANES) - _LANES // 2  # drop below it; 0 < p < 1 keeps it in (-32768, 32767]
    # lanes >= threshold as 0/1 without a bool tensor: mixed bool/float kernels ran 3-4x slower
    return lanes.clamp(threshold - 1, threshold).sub_(threshold - 1).to(dtype)


class _CpuDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        scale = keep_scale(p)
        mask = keep_mask(x.shape, p, x.dtype)
        folded = x.dtype in (torch.float32, torch.float64)  # the scale is exact enough to fold in
        if folded:
            mask.mul_(scale)
        ctx.save_for_backward(mask)
        ctx.scale = None if folded else scale
        out = x * mask
        return out if folded else out.mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        out = grad * mask
        return (out if ctx.scale is None else out.mul_(ctx.scale)), None


def applies(x: Tensor, p: float) -> bool:
    """Whether dropout of ``x`` in training takes the CPU masks above (else it is ``F.dropout``)."""
    return (
        x.device.type == "cpu"
        and x.is_floating_point()
        and 0.0 < quantized_p(p) < 1.0
        and not torch.compiler.is_compiling()
    )


def dropout(x: Tensor, p: float) -> Tensor:
    """Training-mode dropout of ``x`` with the CPU masks above; only where :func:`applies`
    (:func:`zoo.kernels.dropout` chooses)."""
    return _CpuDropout.apply(x, p)
