"""Cross-entropy of a vocabulary projection without its [N, V] logits: :func:`linear_cross_entropy`.

A language model's loss is ``cross_entropy(hidden @ weight.T + bias, targets)``. Computed as written,
a training step holds the [N, V] logits in the compute dtype, an fp32 copy of them, and the softmax
autograd keeps for the backward pass: at GPT-2 small's vocabulary (V = 50,257) and 16 x 1024 tokens,
over 9 GB. Here the rows go through in chunks (as Liger-Kernel's fused linear cross-entropy and
torchtune's chunked loss do): each chunk's logits are computed in the compute dtype (autocast's where
it is on, as ``F.linear`` would), turned to fp32, and give at once the chunk's loss and its gradients
with respect to its hidden rows, the weight and the bias; the backward pass only scales those stored
gradients by the incoming one. The extra memory is one chunk's fp32 logits, which the softmax and
the gradient overwrite (a chunk is :data:`CHUNK_BYTES` of fp32 logits unless ``chunk_rows`` says
otherwise), plus the gradients of the hidden rows, the weight and the bias, which a backward pass
holds anyway.

What the heads add before or after the projection is part of it: ``scale`` multiplies the hidden
rows first (T5 v1.0's d_model^-0.5), ``logit_scale`` the logits (in fp32: Cohere's logit_scale,
Granite's 1 / logits_scaling), ``softcap`` caps them as ``softcap * tanh(logits / softcap)`` (Gemma 2). The loss is ``F.cross_entropy``'s, to rounding: rows whose target is
``ignore_index`` count for nothing, ``label_smoothing`` mixes the uniform distribution into the
targets, ``reduction`` is ``"sum"`` or ``"mean"`` (over the rows not ignored: nan where all are, as
``F.cross_entropy``). Under torch.compile the chunk loop unrolls (one graph per row count) with no
graph break.

Shapes: N rows (tokens), D hidden size, V vocabulary, C rows of a chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.kernels.cpu import linear as cpu_linear
from zoo.kernels.grouped import compute_dtype

__all__ = ["CHUNK_BYTES", "chunk_rows_for", "linear_cross_entropy"]

CHUNK_BYTES = 64 * 2**20
"""fp32 logits one chunk holds by default (64 MiB: 333 rows at V = 50,257)."""

_REDUCTIONS = ("sum", "mean")


def chunk_rows_for(vocab: int, rows: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk whose fp32 logits over ``vocab`` take about ``chunk_bytes`` (a multiple of 8
    from 8 rows on), at most ``rows``."""
    c = max(1, chunk_bytes // (4 * vocab))
    if c > 8:
        c -= c % 8
    return max(1, min(c, rows))


def _onednn(hidden: Tensor, weight: Tensor, dtype: torch.dtype, chunk: int, grad: bool) -> bool:
    """Whether the chunks' fp32 CPU products run on oneDNN: where zoo's linear layers would run the
    head's product there (:mod:`zoo.kernels.cpu.linear`, measured per shape class); never under
    torch.compile, which makes its own choice."""
    return (hidden.device.type == "cpu" and dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.compiler.is_compiling() and cpu_linear.onednn_available()
            and cpu_linear.prefers_onednn(chunk, weight.shape[0], weight.shape[1], grad))


def _chunks(hidden, weight, bias, targets, dtype, ignore_index, label_smoothing, softcap, scale, chunk, mean,
            need_h, need_w, need_b, onednn=False, logit_scale=None):
    """The loss over the rows not ignored (summed, or with ``mean`` their mean), the unsmoothed loss
    (the NLL; the loss itself without smoothing) reduced alike, and (as asked) the loss's gradients
    with respect to ``hidden`` (in its dtype), ``weight`` and ``bias`` (fp32)."""
    n, d = hidden.shape
    v = weight.shape[0]
    mm = cpu_linear.onednn_linear if onednn else F.linear  # x @ w.T (+ b)
    w = weight.to(dtype)
    b = None if bias is None else bias.to(dtype)
    valid = targets != ignore_index
    safe = targets.masked_fill(~valid, 0)
    count = valid.sum()
    weights = valid.float() / count if mean else valid.float()  # each row's share of the loss: 1, or 1 / count
    keep = 1.0 - label_smoothing
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    nll = total
    grad_h = torch.zeros_like(hidden) if need_h else None
    grad_w = torch.zeros(v, d, dtype=torch.float32, device=weight.device) if need_w else None
    grad_b = torch.zeros(v, dtype=torch.float32, device=weight.device) if need_b else None
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        h = hidden[start:end]
        if scale is not None:
            h = h * scale
        h = h.to(dtype)
        z = mm(h, w, b).float()  # (C, V) fp32
        if logit_scale is not None:
            z = z * logit_scale
        if softcap is not None:
            t = torch.tanh(z / softcap)
            z = t * softcap
        lse = torch.logsumexp(z, dim=-1)  # (C,)
        y, m = safe[start:end], valid[start:end]
        zy = z.gather(1, y[:, None]).squeeze(1)
        if label_smoothing:
            nll = nll + torch.where(m, lse - zy, 0.0).sum()
            row = lse - keep * zy - label_smoothing * z.mean(dim=-1)
        else:
            row = lse - zy
        total = total + torch.where(m, row, 0.0).sum()
        if not (need_h or need_w or need_b):
            continue
        g = z.sub_(lse[:, None]).exp_()  # the softmax, over the logits in place; then minus the smoothed targets
        g.scatter_add_(1, y[:, None], g.new_full((end - start, 1), -keep))
        if label_smoothing:
            g.sub_(label_smoothing / v)
        if softcap is not None:
            g.mul_(t.mul_(t).neg_().add_(1.0))  # through the cap: 1 - tanh^2
        if logit_scale is not None:
            g.mul_(logit_scale)
        g.mul_(weights[start:end, None])  # ignored rows: no gradient; with mean, 1 / count (in fp32, before any cast)
        gc = g.to(dtype)
        if need_h:
            gh = mm(gc, w.t())
            grad_h[start:end] = gh if scale is None else gh * scale
        if need_w:
            if onednn:
                grad_w.add_(mm(gc.t(), h.t()))
            elif gc.dtype == grad_w.dtype:
                grad_w.addmm_(gc.t(), h)
            else:
                grad_w.add_(gc.t() @ h)
        if need_b:
            grad_b += g.sum(dim=0)
    if mean:
        total, nll = total / count, nll / count
    return total, nll if label_smoothing else total, grad_h, grad_w, grad_b


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss with its gradients computed in the forward pass; backward scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, dtype, ignore_index, label_smoothing, softcap, scale, chunk, mean,
                onednn, logit_scale, need_h, need_w, need_b):
        total, nll, gh, gw, gb = _chunks(hidden, weight, bias, targets, dtype, ignore_index, label_smoothing, softcap,
                                         scale, chunk, mean, need_h, need_w, need_b, onednn, logit_scale)
        gw = None if gw is None else gw.to(weight.dtype)
        gb = None if gb is None else gb.to(bias.dtype)
        ctx.save_for_backward(gh, gw, gb)
        nll = nll.clone() if nll is total else nll
        ctx.mark_non_differentiable(nll)
        return total, nll

    @staticmethod
    def backward(ctx, grad, _nll):
        gh, gw, gb = ctx.saved_tensors
        scaled = [None if g is None else g * grad.to(g.dtype) for g in (gh, gw, gb)]
        return (*scaled, *[None] * 13)


def _check(hidden, weight, bias, targets, ignore_index, label_smoothing, reduction, softcap, scale, chunk_rows,
           logit_scale=None) -> None:
    if not isinstance(hidden, Tensor) or hidden.dim() < 1 or not hidden.is_floating_point():
        got = f"{tuple(hidden.shape)} {hidden.dtype}" if isinstance(hidden, Tensor) else type(hidden).__name__
        raise ValueError(f"hidden: expected floating-point hidden states [..., D], got {got}")
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight: expected the projection [V, {hidden.shape[-1]}] (vocabulary x hidden size), got {got}")
    if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (weight.shape[0],)):
        got = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
        raise ValueError(f"bias: expected [{weight.shape[0]}] (one per vocabulary entry) or None, got {got}")
    if (not isinstance(targets, Tensor) or targets.dtype.is_floating_point or targets.dtype == torch.bool
            or tuple(targets.shape) != tuple(hidden.shape[:-1])):
        got = f"{tuple(targets.shape)} {targets.dtype}" if isinstance(targets, Tensor) else type(targets).__name__
        raise ValueError(f"targets: expected integer class ids of shape {tuple(hidden.shape[:-1])} (hidden's rows), got {got}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(_REDUCTIONS)}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing: expected a number in [0, 1], got {label_smoothing}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap: expected a positive number or None, got {softcap}")
    if scale is not None and not isinstance(scale, (int, float)):
        raise ValueError(f"scale: expected a number or None, got {type(scale).__name__}")
    if logit_scale is not None and not (isinstance(logit_scale, (int, float)) and logit_scale > 0):
        raise ValueError(f"logit_scale: expected a positive number or None, got {logit_scale!r}")
    if chunk_rows is not None and (not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ValueError(f"chunk_rows: expected a positive number of rows or None (the default), got {chunk_rows!r}")
    if targets.device.type == "cpu" and targets.numel() and not torch.compiler.is_compiling():
        real = targets[targets != ignore_index]
        if real.numel() and (int(real.min()) < 0 or int(real.max()) >= weight.shape[0]):
            raise ValueError(f"targets: class ids must be in [0, {weight.shape[0]}) (the weight's rows) or ignore_index "
                             f"({ignore_index}), got ids from {int(real.min())} to {int(real.max())}")


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None, *,
                         ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "sum",
                         softcap: float | None = None, scale: float | None = None, logit_scale: float | None = None,
                         chunk_rows: int | None = None, return_nll: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """``F.cross_entropy(logits.float(), targets, ...)`` of ``logits = F.linear(hidden * scale, weight,
    bias)`` (times ``logit_scale``, then soft-capped with ``softcap``), never holding more than
    ``chunk_rows`` rows of logits.

    ``hidden`` [..., D] (the head's input after its own transform), ``weight`` [V, D] (tied or not),
    ``bias`` [V] or None, ``targets`` [...] class ids or ``ignore_index``. Returns an fp32 scalar;
    gradients reach ``hidden``, ``weight`` and ``bias`` as the materialised logits would send them.
    ``chunk_rows``: rows per chunk (default: :func:`chunk_rows_for` the vocabulary). ``return_nll``:
    (loss, nll), the second the same reduction of the unsmoothed loss of the same logits, without a
    gradient (what a label-smoothed run logs as its NLL)."""
    _check(hidden, weight, bias, targets, ignore_index, label_smoothing, reduction, softcap, scale, chunk_rows, logit_scale)
    dtype = compute_dtype(hidden, weight)  # as F.linear computes: autocast's dtype, else the two promoted
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    chunk = chunk_rows or chunk_rows_for(weight.shape[0], max(1, hidden.shape[0]))
    mean = reduction == "mean"
    scale = None if scale is None else float(scale)
    logit_scale = None if logit_scale is None else float(logit_scale)
    softcap = None if softcap is None else float(softcap)
    label_smoothing = float(label_smoothing)
    on = torch.is_grad_enabled()
    need = (on and hidden.requires_grad, on and weight.requires_grad, on and bias is not None and bias.requires_grad)
    onednn = _onednn(hidden, weight, dtype, chunk, any(need))
    if any(need):
        total, nll = _LinearCrossEntropy.apply(hidden, weight, bias, targets, dtype, ignore_index, label_smoothing,
                                               softcap, scale, chunk, mean, onednn, logit_scale, *need)
    else:
        total, nll, *_ = _chunks(hidden, weight, bias, targets, dtype, ignore_index, label_smoothing, softcap, scale,
                                 chunk, mean, False, False, False, onednn, logit_scale)
    return (total, nll) if return_nll else total
