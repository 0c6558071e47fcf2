"""Kernels for CPUs: oneDNN fp32 linears (:mod:`.linear`), dropout masks from 16-bit random lanes
(:mod:`.dropout`) and a hand-written attention (:mod:`.attention`); which kernel a shape takes where
the CPU decides is measured once per machine (:mod:`.choose`), and so is blocked or dense attention
for windows and packed documents (:mod:`.banded`).

Each module has ``applies(...)``, the conditions under which :mod:`zoo.kernels` uses it (CPU tensors
only, never under torch.compile), and the kernel itself, which assumes those conditions hold.
"""

from zoo.kernels.cpu import attention, dropout, linear

__all__ = ["attention", "dropout", "linear"]
