"""fp32 linear layers on CPU through oneDNN instead of the BLAS torch links.

PyTorch's x86 wheels run an fp32 ``F.linear`` on CPU through MKL's GEMM. On AMD CPUs MKL takes a path
that does not use AVX-512, while oneDNN (also inside torch) does: on a 2-core AMD EPYC with AVX-512
(Zen 5), oneDNN's fp32 linear ran at ~475 GFLOP/s against MKL's ~220 for training-sized GEMMs, its
backward GEMMs at 350-410 against ~220, and a decoding step's matrix-vector products streamed the
weights at 43 GB/s against 19 (the same numbers to ~1e-6 relative). On such CPUs zoo's linear layers
run forward and backward through ``torch.ops.mkldnn._linear_pointwise``, the op torch.compile's own
CPU fusions emit; everywhere else, and for any case outside the fast path (:func:`applies`),
:func:`zoo.kernels.linear` is ``F.linear``.

The backend is chosen per shape class by measurement (:mod:`zoo.kernels.cpu.choose`): ``auto``
times both on the first product of a class (M rounded up to a power of two, at most ~2^30
multiply-adds a GEMM, N, K, and whether the backward GEMMs run too) and keeps the faster in a
per-machine cache, so a run and its resume on one machine compute the same numbers and no rule by
vendor is needed (MKL is as fast as oneDNN on Zen 4 and on Intel CPUs, half its speed on Zen 5).
Override with ``ZOO_CPU_LINEAR=onednn|aten|auto`` or ``zoo.kernels.use(cpu_linear=...)``.

The fast path applies to fp32 CPU tensors with autocast off, outside torch.compile (which makes its
own choice), to weights of at least ``_MIN_WEIGHT`` elements or products of at least ``_MIN_MACS``
multiply-adds. oneDNN costs ~15 us a call, so small products stay on MKL: with the weights in cache,
oneDNN measured 0.2-1.0x MKL between 12k and 1.6M multiply-adds and 1.1-2.3x above; a weight of
512k+ elements is read from memory in a decoding step, where oneDNN streams it ~2x faster.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from zoo.kernels import policy
from zoo.kernels.cpu import choose

__all__ = ["applies", "cpu_linear_backend", "linear", "onednn_available", "onednn_linear", "prefers_onednn",
           "shape_class"]

_MIN_MACS, _MIN_WEIGHT = 1 << 21, 1 << 19
_TIMED_MACS = 1 << 30


@functools.cache
def onednn_available() -> bool:
    """Whether this torch build has oneDNN and its linear op."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def cpu_linear_backend() -> str:
    """The setting fp32 CPU linears follow now (the kernel policy's ``cpu_linear``:
    ``zoo.kernels.use(cpu_linear=...)``, ``ZOO_CPU_LINEAR``): ``onednn``, ``aten``, or ``auto``
    (measured per shape class: :func:`prefers_onednn`); ``aten`` wherever this torch has no oneDNN linear."""
    choice = policy.policy().cpu_linear
    if not onednn_available() or not torch.backends.mkldnn.enabled:
        return "aten"
    return choice


def timed_rows(m: int, n: int, k: int) -> int:
    """The rows of the product that stands for M rows of an (N, K) weight: M rounded up to a power of
    two, at most what keeps one timed GEMM near 2^30 multiply-adds (~10 ms; at least 256 rows): a
    class is timed in well under a second, and all longer products share its choice."""
    cap = max(256, 1 << max(0, (_TIMED_MACS // max(1, n * k)).bit_length() - 1))
    return min(1 << max(0, (m - 1).bit_length()), cap)


def shape_class(m: int, n: int, k: int, grad: bool) -> str:
    """The class of an (M, K) x (N, K)^T product that shares one choice: :func:`timed_rows`, N and K as
    they are, and whether the backward GEMMs run too."""
    return f"{timed_rows(m, n, k)}x{n}x{k}" + ("+grad" if grad else "")


def prefers_onednn(m: int, n: int, k: int, grad: bool) -> bool:
    """Whether an fp32 product of (M, K) rows by an (N, K) weight runs on oneDNN: as set, or under
    ``auto`` whichever of oneDNN and ATen measured faster on this machine for its :func:`shape_class`
    (with ``grad``, the forward and both backward GEMMs together)."""
    setting = cpu_linear_backend()
    if setting != "auto":
        return setting == "onednn"
    rows = timed_rows(m, n, k)
    cls = f"{rows}x{n}x{k}" + ("+grad" if grad else "")  # shape_class(m, n, k, grad)
    known = choose.known("linear_fp32", cls)  # the hot path: one lookup (a decoding step makes ~50 calls)
    if known in ("onednn", "aten"):
        return known == "onednn"
    return choose.pick("linear_fp32", cls, _candidates(rows, n, k, grad)) == "onednn"


def _candidates(m: int, n: int, k: int, grad: bool) -> dict:
    """ATen's and oneDNN's calls for a product of the class (built on first call: a remembered choice
    allocates nothing)."""
    made: dict[str, torch.Tensor] = {}

    def inputs():
        if not made:
            g = torch.Generator().manual_seed(0)  # never the global generator: see zoo.kernels.cpu.choose
            made.update(x=torch.randn(m, k, generator=g), w=torch.randn(n, k, generator=g),
                        gy=torch.randn(m, n, generator=g))
        return made["x"], made["w"], made["gy"]

    def aten():
        x, w, gy = inputs()
        torch.nn.functional.linear(x, w)
        if grad:
            gy.mm(w), gy.t().mm(x)

    def onednn():
        x, w, gy = inputs()
        onednn_linear(x, w)
        if grad:
            onednn_linear(gy, w.t()), onednn_linear(gy.t(), x.t())

    return {"aten": aten, "onednn": onednn}


def onednn_linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x [M, K] @ w[N, K].T (+ b) on oneDNN; either operand may be a strided view."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, w)
        ctx.has_bias, ctx.in_shape = b is not None, x.shape
        return onednn_linear(x2, w, b).view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad: Tensor):
        x2, w = ctx.saved_tensors
        g2 = grad.reshape(-1, w.shape[0])  # (M, N)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = onednn_linear(g2, w.t(), None).view(ctx.in_shape)  # (M, N) @ (N, K)
        if ctx.needs_input_grad[1]:
            gw = onednn_linear(g2.t(), x2.t(), None)  # (N, M) @ (M, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def applies(x: Tensor, w: Tensor, b: Tensor | None) -> bool:
    """Whether ``F.linear(x, w, b)`` takes the oneDNN path: fp32 CPU tensors, a large enough product,
    no autocast, not under torch.compile, and :func:`prefers_onednn` (as set, or measured)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and w.dtype == torch.float32
        and (b is None or b.dtype == torch.float32)
        and x.dim() >= 1
        and w.dim() == 2
        and x.numel() > 0
        and (w.numel() >= _MIN_WEIGHT or x.numel() // x.shape[-1] * w.numel() >= _MIN_MACS)
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not w.is_sparse
        and prefers_onednn(x.numel() // x.shape[-1], w.shape[0], w.shape[1],
                           torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` on oneDNN, forward and backward, for ``x`` of any leading shape; only where
    :func:`applies` (:func:`zoo.kernels.linear` chooses)."""
    return _OneDnnLinear.apply(x, weight, bias)


def _register_flop_formula() -> None:
    """Teach ``torch.utils.flop_counter`` the oneDNN op (it counts aten's matmuls only), so FLOP counts
    and MFU stay right whichever backend ran."""
    if not onednn_available():
        return
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    op = torch.ops.mkldnn._linear_pointwise
    if op in flop_registry:
        return

    @register_flop_formula(op)
    def _flops(x_shape, w_shape, *args, **kwargs) -> int:
        rows = 1
        for n in x_shape[:-1]:
            rows *= n
        return 2 * rows * w_shape[0] * w_shape[1]


_register_flop_formula()

