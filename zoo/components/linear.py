"""``Linear``: ``nn.Linear`` computed by :func:`zoo.kernels.linear` (oneDNN for large fp32 products on
the CPUs where it is faster; see :mod:`zoo.kernels.cpu.linear`)."""

from __future__ import annotations

from torch import Tensor, nn

from zoo import kernels

__all__ = ["Linear"]


class Linear(nn.Linear):
    """``nn.Linear`` (the same parameters, state dict and init) computed by :func:`zoo.kernels.linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return kernels.linear(x, self.weight, self.bias)

    def effective_weight(self) -> Tensor:
        """The weight ``forward`` multiplies by (an adapted linear's, its update added: a part that
        computes with the weight itself, as MLA's folded decoding, reads it here)."""
        return self.weight
