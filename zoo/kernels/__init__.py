"""Speed paths for one kind of hardware, each behind one small dispatch function.

:func:`linear`, :func:`dropout` and :func:`attention` compute what ``F.linear``, ``F.dropout`` and
``F.scaled_dot_product_attention`` compute; where a kernel under :mod:`zoo.kernels.cpu` is known to
be faster (its ``applies`` says when), they run it instead. Components call only these functions.
:func:`sdpa_only` turns zoo's own attention off within a context (so a forced SDPA kernel applies).
"""

from zoo.kernels import cpu
from zoo.kernels.cpu.attention import sdpa_only
from zoo.kernels.dispatch import attention, dropout, linear

__all__ = ["attention", "cpu", "dropout", "linear", "sdpa_only"]
