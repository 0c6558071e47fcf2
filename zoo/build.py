"""Specs to modules: ``zoo.build``.

The one place that imports the built-in parts and families, which registers their builders.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from torch import nn

import zoo.components  # noqa: F401  (registers the built-in parts)
import zoo.models  # noqa: F401  (registers the families)
from zoo.registry import registry
from zoo.spec import FamilySpec, load_spec


def build(
    source: str | Path | Mapping[str, Any] | FamilySpec,
    overrides: Iterable[str] = (),
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    seed: int | None = None,
) -> nn.Module:
    """A freshly initialised model from a preset name, a YAML path, a mapping or a spec.

    ``device="meta"`` builds without allocating memory (parameter counts, FLOP estimates).
    ``seed`` makes the initial weights reproducible without touching the global RNG.
    The model's ``spec`` attribute is the validated spec it was built from.
    """
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch.dtype such as torch.bfloat16, got {dtype!r}")
    try:
        torch.device(device) if device is not None else None
    except RuntimeError:
        raise ValueError(f"device: {device!r} is not a torch device; use e.g. 'cpu', 'cuda', 'cuda:1' or 'meta'") from None
    spec = load_spec(source, overrides)
    builder = registry("family").builder(spec.family)
    cuda = [torch.device(device).index or 0] if device is not None and torch.device(device).type == "cuda" else []
    rng = torch.random.fork_rng(devices=cuda) if seed is not None else contextlib.nullcontext()
    with rng, (torch.device(device) if device is not None else contextlib.nullcontext()):
        if seed is not None:
            torch.manual_seed(seed)
        model = builder(spec)
    if dtype is not None:
        model = model.to(dtype)
    model.spec = spec
    return model


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in model.parameters())
