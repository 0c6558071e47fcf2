"""FlexAttention (``torch.nn.attention.flex_attention``) on a :class:`~zoo.kernels.mask.Mask`: the
mask's rule becomes the ``mask_mod`` of a block mask, so blocks with no allowed pair are skipped
(a sliding window or packed documents cost what they allow), and its bias a ``score_mod``.

torch 2.14's FlexAttention has no backward pass on CPU: it trains on CUDA only, so the dispatcher
(:func:`zoo.kernels.attention`) never picks it on a CPU, and asking for it there is refused naming
the backend that runs (``blocked``). It computes no attention dropout either (refused likewise).
The kernel is compiled once per process (``torch.compile``); the block mask once per mask (one per
distinct layer kind per forward pass).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from zoo.kernels.mask import Mask

__all__ = ["attention", "refusal"]


def refusal(q: Tensor, dropout_p: float) -> str | None:
    """Why FlexAttention cannot compute this attention here, or None."""
    if q.device.type != "cuda":
        return (f"the flex attention backend trains on CUDA only (torch's FlexAttention has no backward pass on "
                f"{q.device.type}); use run.attention=blocked (windows and documents at their cost) or dense")
    if dropout_p:
        return "the flex attention backend has no attention dropout; set dropout.attention=0 or use run.attention=dense"
    if q.shape[-1] < 16:
        return f"the flex attention backend needs heads of at least 16 features, got {q.shape[-1]}; use run.attention=dense"
    if _get_current_dispatch_mode() is not None:
        return ("the flex attention backend does not run under a dispatch mode (a FLOP counter, say); "
                "use run.attention=dense there")
    return None


@functools.cache
def _kernel():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def block_mask(mask: Mask, batch: int, device) -> object:
    """The mask's FlexAttention block mask (cached on the mask)."""

    def make() -> object:
        from torch.nn.attention.flex_attention import create_block_mask

        per_row = any(t is not None for t in (mask.padding, mask.documents, mask.prefix, mask.chunks))
        off = mask.offset

        def mask_mod(b, h, q_idx, kv_idx):
            return mask.allowed(b if per_row else 0, q_idx + off, kv_idx)

        return create_block_mask(mask_mod, batch if per_row else None, None, mask.q_len, mask.k_len, device=device)

    return mask.cached(f"flex-{device}", make)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Mask, *, scale: float | None = None,
              enable_gqa: bool = False) -> Tensor:
    """``flex_attention`` over ``mask``: q (B, H, T, K), k (B, G, S, K), v (B, G, S, V) -> (B, H, T, V)."""
    score_mod = None
    if mask.bias is not None:  # read in place, or computed (ALiBi): never gathered into a [T, S] tensor

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + mask.bias_at(b, h, q_idx, kv_idx).to(score.dtype)

    if torch.compiler.is_compiling():  # inside a compiled model: the compiler fuses it there
        from torch.nn.attention.flex_attention import flex_attention as kernel
    else:
        kernel = _kernel()
    return kernel(q, k, v, score_mod=score_mod, block_mask=block_mask(mask, q.shape[0], q.device), scale=scale,
                     enable_gqa=enable_gqa)
