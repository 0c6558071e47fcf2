"""Grouped matrix products for mixture-of-experts layers: rows sorted by group (expert), one weight
matrix per group, and the gathers that sort tokens into those rows and add them back.

:func:`grouped_mm` runs ``torch.nn.functional.grouped_mm`` wherever torch has it for the device and
dtype (CPU: fp32, bf16, fp16; CUDA: bf16): it takes only 16-byte aligned strides, so sizes that
are not (an odd K or M) are zero-padded to the next aligned size, which changes no product. Under
autocast both sides are cast to autocast's dtype first, as autocast casts ``mm`` (grouped_mm is not
on autocast's lists, so without the cast bf16 autocast would leave the experts in fp32). Elsewhere
(CUDA fp32 or fp16, other devices, torch < 2.10) a loop over the groups that have rows, one ``mm``
each, after one host sync to read the row counts. Where zoo's fp32 linear layers run on oneDNN
(:mod:`zoo.kernels.cpu.linear`: where oneDNN measured faster than MKL, as on AMD Zen 5, where MKL runs
at half oneDNN's speed), fp32 experts take that loop on oneDNN too, forward and backward (on CPU the sync is free).

Measured on a 2-core Intel Xeon (family 6 model 207: AVX-512, AMX) shared with other work, so on
one thread (two threads there measured the other work's contention, not the kernels), best of 15
alternating runs: 8 experts, top-2 of 1024 tokens (2048 rows), a swiglu expert's two products,
forward + backward, milliseconds:

=============  =====  ==========  ========  ===========================================
D / F          dtype  grouped_mm  the loop  padded bmm (rows scattered into [E, max, K])
=============  =====  ==========  ========  ===========================================
64 / 128       fp32   4.2         4.8       6.4
64 / 128       bf16   4.4         4.8       5.6
256 / 704      fp32   62          67        81
256 / 704      bf16   28          29        44
512 / 1792     fp32   285         315       420
512 / 1792     bf16   126         131       209
=============  =====  ==========  ========  ===========================================

(bf16: under CPU autocast, the fp32 weights cast each step; the same routing every run, so
oneDNN compiled its kernel for each row count once: with new counts every call its bf16 products
ran 2-3x slower, which :func:`row_block` avoids.) So the padded bmm is not offered, and the loop
is only the fallback.

:func:`expert_rows` lays the routed (token, slot) pairs out by expert, each expert's rows padded
to a multiple of :func:`row_block` where oneDNN computes; :func:`gather_rows` and
:func:`scatter_rows` move rows between token order and that buffer with a gather one way and an
``index_copy`` (distinct rows) the other, forward and backward, never an ``index_add``;
:func:`gated` is a swiglu/geglu step whose backward writes [d gate | d up] into one tensor;
:func:`cast_weight` keeps autocast's cast of the weights while no gradient is taken, so decoding
does not cast every expert at every token.

Shapes: N rows (tokens x top_k, sorted by group), E groups, K input size, M output size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from zoo.kernels import cpu

__all__ = ["ExpertRows", "applies", "cast_weight", "compute_dtype", "expert_mm", "expert_rows", "gated", "gather_rows", "grouped_mm",
           "row_block", "scatter_rows"]

_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def compute_dtype(x: Tensor, w: Tensor) -> torch.dtype:
    """The dtype ``x @ w.T`` computes in: autocast's where it is on for x's device (as for ``mm``),
    else the two dtypes promoted."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind) and x.is_floating_point():
        return torch.get_autocast_dtype(kind)
    return torch.promote_types(x.dtype, w.dtype)


_CASTS = WeakIdKeyDictionary()  # weight -> (its state, its cast)


def cast_weight(w: Tensor, dtype: torch.dtype) -> Tensor:
    """``w.to(dtype)``; without autograd (inference, decoding) the cast is kept while ``w`` is
    unchanged (its version counter, storage and dtype), so that autocast does not cast every
    expert's weights again at every call: half the weights' fp32 size held beside them while
    they are used so. With autograd on, nothing is kept (a training step changes the weights)."""
    if w.dtype == dtype:
        return w
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        _CASTS.pop(w, None)
        return w.to(dtype)
    state = (w._version, w.data_ptr(), w.dtype, w.device, dtype)
    hit = _CASTS.get(w)
    if hit is None or hit[0] != state:
        hit = _CASTS[w] = (state, w.detach().to(dtype))
    return hit[1]


def applies(x: Tensor, w: Tensor) -> bool:
    """Whether :func:`grouped_mm` runs torch's grouped_mm for x [N, K] and w [E, M, K] of one dtype
    (after any padding): torch has it for the device and dtype (CPU fp32/bf16/fp16, CUDA bf16 from
    compute capability 8.0)."""
    if not hasattr(F, "grouped_mm") or x.dtype != w.dtype:
        return False
    if x.device.type == "cpu":
        return x.dtype in _CPU_DTYPES
    return (x.device.type == "cuda" and x.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device) >= (8, 0))


def grouped_mm(x: Tensor, w: Tensor, counts: Tensor, offsets: Tensor, *, traceable: bool = True) -> Tensor:
    """``cat([x[rows of group e] @ w[e].T for e in range(E)])`` for x [N, K] sorted by group and
    w [E, M, K] (a linear's weight per group) -> [N, M]. ``counts`` [E]: rows per group;
    ``offsets`` [E] int32: their cumulative sum (where each group ends). Computes in
    :func:`compute_dtype`. Inside a compiled region, where torch's grouped_mm cannot be traced
    (fp32, the loop), it runs as one opaque operator (:func:`expert_mm`)."""
    dtype = compute_dtype(x, w)
    x, w = x.to(dtype), cast_weight(w, dtype)
    if traceable and torch.compiler.is_compiling() and not (applies(x, w) and dtype != torch.float32):
        return expert_mm(x, w, counts, offsets)
    if x.numel() and cpu.linear.applies(x, w[0], None):  # fp32 where zoo's linears take oneDNN
        return _loop(x, w, counts, cpu.linear.linear)
    if applies(x, w):
        return _grouped(x, w, offsets)
    return _loop(x, w, counts)


def _grouped(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    """torch's grouped_mm, K and M zero-padded to multiples of 16 bytes (its forward and backward
    products then have aligned strides) and x copied where its storage is not aligned."""
    align = max(1, 16 // x.element_size())
    k, m = x.shape[-1], w.shape[1]
    pad_k, pad_m = -k % align, -m % align
    if pad_k:
        x, w = F.pad(x, (0, pad_k)), F.pad(w, (0, pad_k))
    if pad_m:
        w = F.pad(w, (0, 0, 0, pad_m))
    x, w = _aligned(x), _aligned(w)
    y = F.grouped_mm(x, w.transpose(-2, -1), offs=offsets)
    if y.requires_grad and not torch.compiler.is_compiling():  # its backward takes only dense gradients
        y.register_hook(lambda g: g.contiguous())  # (compiled: the traced backward's are)
    return y[:, :m] if pad_m else y


def _aligned(t: Tensor) -> Tensor:
    """``t`` contiguous in a 16-byte aligned storage (a fresh allocation is; so is every buffer a
    compiled graph allocates, which cannot read a data pointer)."""
    if torch.compiler.is_compiling():
        return t.contiguous()
    return t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


def _loop(x: Tensor, w: Tensor, counts: Tensor, linear=F.linear) -> Tensor:
    """One ``linear`` per group that has rows, after one host sync to read ``counts``; the groups'
    weights come from one ``unbind`` (its backward stacks their gradients once). Rows of x past
    the groups' total (a padded buffer's tail) give zeros."""
    sizes = counts.tolist()
    used = sum(sizes)
    outs = [linear(xe, we) for xe, we, n in zip(x[:used].split(sizes), w.unbind(0), sizes) if n]
    if used < x.shape[0] or not outs:
        outs.append(x.new_zeros(x.shape[0] - used, w.shape[1]))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


# ------------------------------------------------------------------------------ token <-> expert rows
@dataclass(frozen=True)
class ExpertRows:
    """Where the routed (token, slot) pairs sit in the expert-ordered buffer the products read.
    ``order`` [R]: the pairs (positions among the N * k) by expert; ``counts`` [E]: each expert's
    rows in the buffer, ``offsets`` [E] int32 their cumulative sum; ``pos`` [R]: each pair's row
    (None: row r, no padding); ``size``: the buffer's rows."""

    order: Tensor
    counts: Tensor
    offsets: Tensor
    pos: Tensor | None
    size: int


def row_block(x: Tensor, w: Tensor, rows: int, groups: int) -> int:
    """The multiple each group's rows are padded to: 1, except where the products run on oneDNN
    (CPU bf16 and fp16; fp32 where zoo's linears take oneDNN), which compiles a kernel for every new
    row count it meets (new routing every step: the products ran 2-3x slower than with counts seen
    before). There, the largest power of two at most 1/16 of the mean rows per group: ~3% zero rows
    added, and few distinct counts, each compiled once."""
    dtype = compute_dtype(x, w)
    onednn = dtype in (torch.bfloat16, torch.float16) or (
        dtype == torch.float32 and x.numel() > 0 and cpu.linear.applies(x, w[0], None))
    mean = rows // max(groups, 1)
    if x.device.type != "cpu" or not onednn or mean < 32:
        return 1
    return 1 << ((mean // 16).bit_length() - 1)


def expert_rows(order: Tensor, counts: Tensor, block: int = 1) -> ExpertRows:
    """The buffer layout of pairs ``order`` (by expert; ``counts`` [E] of them per expert), each
    expert's rows padded to a multiple of ``block`` with zero rows that the products compute and
    the way back skips. Its size is the bound R + E * (block - 1), not the padded total, so no host
    sync: the rows past the last expert's end are read by no product (their values are undefined)."""
    if block == 1:
        return ExpertRows(order, counts, counts.cumsum(0, dtype=torch.int32), None, order.numel())
    padded = (counts + block - 1) // block * block
    shift = (padded.cumsum(0) - padded) - (counts.cumsum(0) - counts)  # each expert's start, padded - not
    r = order.numel()
    pos = torch.arange(r, device=order.device) + torch.repeat_interleave(shift, counts, output_size=r)
    return ExpertRows(order, padded, padded.cumsum(0, dtype=torch.int32), pos, r + counts.numel() * (block - 1))


class _Gather(torch.autograd.Function):
    """Tokens x [N, D] -> the buffer [size, D]: the pair ``order[r]``'s token (``order[r] // k``)
    at row ``pos[r]``, zeros elsewhere; backward: the gradient rows gathered back to their pairs
    (``index_copy``, distinct rows) and each token's k summed."""

    @staticmethod
    def forward(ctx, x: Tensor, rows: ExpertRows, k: int) -> Tensor:
        ctx.rows, ctx.k, ctx.n = rows, k, x.shape[0]
        xs = x.index_select(0, rows.order // k if k > 1 else rows.order)
        return xs if rows.pos is None else xs.new_zeros(rows.size, x.shape[-1]).index_copy_(0, rows.pos, xs)

    @staticmethod
    def backward(ctx, g: Tensor):
        rows, k = ctx.rows, ctx.k
        g = g.contiguous() if rows.pos is None else g.index_select(0, rows.pos)
        pairs = g.new_zeros(ctx.n * k, g.shape[-1]).index_copy_(0, rows.order, g)
        return pairs.view(ctx.n, k, -1).sum(1) if k > 1 else pairs, None, None


class _Scatter(torch.autograd.Function):
    """The buffer h [size, D] -> the pairs [n, D]: pair ``order[r]`` is row ``pos[r]``, pairs not
    in ``order`` (dropped) are zero; backward: a gather into a zero buffer."""

    @staticmethod
    def forward(ctx, h: Tensor, rows: ExpertRows, n: int) -> Tensor:
        ctx.rows = rows
        h = h if rows.pos is None else h.index_select(0, rows.pos)
        return h.new_zeros(n, h.shape[-1]).index_copy_(0, rows.order, h)

    @staticmethod
    def backward(ctx, g: Tensor):
        rows = ctx.rows
        g = g.index_select(0, rows.order)
        return g if rows.pos is None else g.new_zeros(rows.size, g.shape[-1]).index_copy_(0, rows.pos, g), None, None


def gather_rows(x: Tensor, rows: ExpertRows, k: int) -> Tensor:
    """Tokens x [N, D] into the expert-ordered buffer of ``rows`` (:func:`expert_rows`), k pairs a token."""
    return _Gather.apply(x, rows, k)


def scatter_rows(h: Tensor, rows: ExpertRows, n: int) -> Tensor:
    """The expert-ordered buffer h back to the ``n`` (token, slot) pairs; dropped pairs are zero."""
    return _Scatter.apply(h, rows, n)


# ---------------------------------------------------------------------------- gated activation
def _act(act: torch.nn.Module):
    """(forward, backward into ``out``) of a SiLU or GELU module, or None for any other."""
    if type(act) is torch.nn.SiLU:
        return F.silu, lambda g, x, out: torch.ops.aten.silu_backward.grad_input(g, x, grad_input=out)
    if type(act) is torch.nn.GELU:
        approx = act.approximate
        return (lambda x: F.gelu(x, approximate=approx),
                lambda g, x, out: torch.ops.aten.gelu_backward.grad_input(g, x, approximate=approx, grad_input=out))
    return None


class _Gated(torch.autograd.Function):
    """act(gate) * up of [gate | up] [R, 2F]; saves only its input, and its backward writes both
    halves of one gradient tensor (no ``cat``)."""

    @staticmethod
    def forward(ctx, gu: Tensor, fns) -> Tensor:
        ctx.save_for_backward(gu)
        ctx.fns = fns
        gate, up = gu.chunk(2, dim=-1)
        return fns[0](gate) * up

    @staticmethod
    def backward(ctx, g: Tensor):
        (gu,) = ctx.saved_tensors
        forward, backward = ctx.fns
        gate, up = gu.chunk(2, dim=-1)
        out = torch.empty_like(gu)
        f = gate.shape[-1]
        torch.mul(g, forward(gate), out=out[:, f:])
        backward(g * up, gate, out[:, :f])
        return out, None


def gated(gu: Tensor, act: torch.nn.Module) -> Tensor:
    """``act(gate) * up`` of [gate | up] [R, 2F] -> [R, F]; for SiLU and GELU one autograd step
    that keeps only [gate | up] for its backward (recomputing act(gate)); compiled, the plain form."""
    fns = _act(act)
    if fns is None or gu.dim() != 2 or torch.compiler.is_compiling():  # a compiler fuses the plain form
        gate, up = gu.chunk(2, dim=-1)
        return act(gate) * up
    return _Gated.apply(gu, fns)


# ------------------------------------------------------------- one opaque operator for compiled graphs
# torch.compile traces F.grouped_mm only where its meta function accepts the dtype (bf16 and fp16): an
# fp32 grouped product, and the loop over groups that stands in for it elsewhere (it reads the row
# counts on the host), would break the graph. ``zoo::expert_mm`` is a torch.library operator whose
# eager body is grouped_mm's own choice and whose shape function needs no data, so a compiled model
# with experts is one graph in any dtype; its backward is two more such operators (the input's
# gradient, a grouped product by the transposed weights, and the weights', one product per group).


@torch.library.custom_op("zoo::expert_mm", mutates_args=())
def _expert_mm(x: Tensor, w: Tensor, counts: Tensor, offsets: Tensor) -> Tensor:
    return grouped_mm(x, w, counts, offsets, traceable=False)


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
    :func:`grouped_mm` computes, for compiled graphs (x and w of one dtype)."""
    return _expert_mm(x, w, counts, offsets)
