"""``Linear``: ``nn.Linear`` computed by :func:`zoo.kernels.linear` (oneDNN for large fp32 products on
the CPUs where it is faster; see :mod:`zoo.kernels.cpu.linear`)."""

from __future__ import annotations

from torch import Tensor, nn

from zoo import kernels

# The backend controls live with the kernel; these names are kept importable from here.
from zoo.kernels.cpu.linear import cpu_linear_backend, onednn_available, onednn_linear, set_cpu_linear
from zoo.kernels.dispatch import linear

__all__ = ["Linear", "cpu_linear_backend", "linear", "onednn_available", "onednn_linear", "set_cpu_linear"]


class Linear(nn.Linear):
    """``nn.Linear`` (the same parameters, state dict and init) computed by :func:`zoo.kernels.linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return kernels.linear(x, self.weight, self.bias)
