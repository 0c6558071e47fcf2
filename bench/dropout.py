"""Dropout masks on CPU: zoo's (16-bit random lanes, :mod:`zoo.kernels.cpu.dropout`) against
``F.dropout`` (one Bernoulli draw per element), forward + backward, on the two tensors a GPT-2 small
training step drops most: a [8, 256, 768] activation and [8, 12, 256, 256] attention weights.

zoo takes its masks on every CPU by rule, not by measurement: ``bernoulli_`` is the same scalar loop
on every x86 CPU, so which one wins does not depend on the CPU's GEMMs or vector units the way the
linear and attention kernels do. This row is the rule's proof on each machine it runs on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.common import Row, Side, compare, here
from zoo import kernels

Timing = dict
SHAPES = {"activation": (8, 256, 768), "attention weights": (8, 12, 256, 256)}


def rows(precision: str, timing: Timing, tiny: bool = False) -> list[Row]:
    if here().type != "cpu":
        return []  # on a GPU both are F.dropout
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    out = []
    for name, shape in SHAPES.items():
        shape = tuple(max(1, n // 8) for n in shape) if tiny else shape
        x = torch.randn(shape, dtype=dtype, requires_grad=True)
        grad = torch.randn(shape, dtype=dtype)

        def step(fn):
            return lambda: fn(x).backward(grad)

        row = Row(workload=f"dropout 0.1 on {name} {list(shape)}, fwd+bwd", precision=precision, unit="Melements",
                  work=x.numel() / 1e6)
        row.seconds, row.spread = compare([Side("zoo", step(lambda t: kernels.dropout(t, 0.1))),
                                           Side("F.dropout", step(lambda t: F.dropout(t, 0.1, True)))], **timing)
        out.append(row)
    return out
