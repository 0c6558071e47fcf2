"""``Dropout``: ``nn.Dropout`` computed by :func:`zoo.kernels.dropout` (masks from 16-bit random lanes
on CPU; see :mod:`zoo.kernels.cpu.dropout`)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from zoo import kernels

# The CPU masks live with the kernel; these names are kept importable from here.
from zoo.kernels.cpu.dropout import applies as cpu_dropout_applies
from zoo.kernels.cpu.dropout import keep_mask, keep_scale, quantized_p
from zoo.kernels.dispatch import dropout

__all__ = ["Dropout", "cpu_dropout_applies", "dropout", "keep_mask", "keep_scale", "quantized_p"]


class Dropout(nn.Dropout):
    """``nn.Dropout`` computed by :func:`zoo.kernels.dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return F.dropout(x, self.p, self.training, inplace=True)
        return kernels.dropout(x, self.p, self.training)
