"""``Dropout``: ``nn.Dropout`` computed by :func:`zoo.kernels.dropout` (masks from 16-bit random lanes
on CPU; see :mod:`zoo.kernels.cpu.dropout`)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from zoo import kernels

__all__ = ["Dropout"]


class Dropout(nn.Dropout):
    """``nn.Dropout`` computed by :func:`zoo.kernels.dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return F.dropout(x, self.p, self.training, inplace=True)
        return kernels.dropout(x, self.p, self.training)
