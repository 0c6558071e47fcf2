"""The grouped product as one opaque operator for compiled graphs, where torch's own cannot go.

``torch.compile`` traces :func:`torch.nn.functional.grouped_mm` only where its meta function
accepts the dtype (bf16 and fp16): an fp32 grouped product, and the loop over groups that stands in
for it elsewhere (it reads the row counts on the host), would break the graph. :func:`expert_mm` is
a ``torch.library`` operator whose eager body is :func:`zoo.kernels.grouped.grouped_mm`'s own choice
(torch's grouped_mm or the loop) and whose shape function needs no data, so a compiled model with
experts is one graph in any dtype; its backward is two more such operators (the input's gradient,
a grouped product by the transposed weights, and the weights', one product per group).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["expert_mm"]


@torch.library.custom_op("zoo::expert_mm", mutates_args=())
def _expert_mm(x: Tensor, w: Tensor, counts: Tensor, offsets: Tensor) -> Tensor:
    from zoo.kernels import grouped

    return grouped.grouped_mm(x, w, counts, offsets, traceable=False)


@_expert_mm.register_fake
def _(x: Tensor, w: Tensor, counts: Tensor, offsets: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], w.shape[1])


@torch.library.custom_op("zoo::expert_mm_weight_grad", mutates_args=())
def _weight_grad(x: Tensor, g: Tensor, counts: Tensor) -> Tensor:
    """[E, M, K]: group e's ``g[rows].T @ x[rows]`` (zeros for a group without rows)."""
    sizes = counts.tolist()
    out = g.new_zeros(len(sizes), g.shape[1], x.shape[1])
    start = 0
    for e, n in enumerate(sizes):
        if n:
            torch.mm(g[start:start + n].t(), x[start:start + n], out=out[e])
        start += n
    return out


@_weight_grad.register_fake
def _(x: Tensor, g: Tensor, counts: Tensor) -> Tensor:
    return g.new_empty(counts.shape[0], g.shape[1], x.shape[1])


def _setup(ctx, inputs, output) -> None:
    x, w, counts, offsets = inputs
    ctx.save_for_backward(x, w, counts, offsets)


def _backward(ctx, g: Tensor):
    x, w, counts, offsets = ctx.saved_tensors
    gx = gw = None
    if ctx.needs_input_grad[0]:
        gx = _expert_mm(g.contiguous(), w.transpose(1, 2).contiguous(), counts, offsets)
    if ctx.needs_input_grad[1]:
        gw = _weight_grad(x, g.contiguous(), counts)
    return gx, gw, None, None


_expert_mm.register_autograd(_backward, setup_context=_setup)


def expert_mm(x: Tensor, w: Tensor, counts: Tensor, offsets: Tensor) -> Tensor:
    """x [N, K] (rows sorted by group) times w [E, M, K] per group -> [N, M], as one operator: what
    :func:`zoo.kernels.grouped.grouped_mm` computes, for compiled graphs (x and w of one dtype)."""
    return _expert_mm(x, w, counts, offsets)
