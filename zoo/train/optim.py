"""Optimizers, learning-rate schedules, precision and seeding for recipes.

    opt = build_optimizer(model, cfg.optim)                  # AdamW/Adam, no decay on norms/biases/tables,
                                                             # optim.layer_decay: lower lrs for lower layers
    sched = build_scheduler(opt, cfg.schedule, total_steps, d_model=512)
    with autocast(device, "bf16"): loss = ...
"""

from __future__ import annotations

import contextlib
import math
import random
from typing import Callable

import torch
from torch import nn

from zoo.train.config import OptimConfig, ScheduleConfig

__all__ = ["param_groups", "layer_ids", "build_optimizer", "lr_factor", "build_scheduler", "autocast", "seed_everything",
           "EMA"]

# parameter names that hold tables or tokens rather than weights: never decayed
_NO_DECAY_NAMES = ("position", "cls_token", "dist_token", "reg_token", "pos_embed", "relative_position")


def layer_ids(model: nn.Module) -> tuple[dict[str, int], int]:
    """Each parameter's layer for layer-wise lr decay, and the number of blocks ``n`` (BEiT's count):
    what comes before the blocks (embeddings, patch embedding, class token, positions) is layer 0,
    block ``i`` of a stack is layer ``i + 1``, and what comes after them (the final norm, the head; a
    stack's tables shared by its blocks, as BEiT places its shared relative-position bias) layer
    ``n + 1``. An encoder-decoder's two stacks count their blocks alike. Raises ValueError for a
    model without a stack of blocks."""
    from zoo.components.stack import Stack

    stacks = [(prefix + ".", m) for prefix, m in model.named_modules() if isinstance(m, Stack)]
    if not stacks:
        raise ValueError(f"optim.layer_decay: {type(model).__name__} has no stack of blocks to count layers in; "
                         f"set optim.layer_decay=null")
    n = max(len(m.blocks) for _, m in stacks)
    ids: dict[str, int] = {}
    past_blocks = False
    for name, _ in model.named_parameters():
        prefix = next((pre for pre, _ in stacks if name.startswith(pre)), None)
        if prefix is None:
            ids[name] = n + 1 if past_blocks else 0
            continue
        past_blocks = True
        rest = name[len(prefix):].split(".")
        ids[name] = int(rest[1]) + 1 if rest[0] == "blocks" else n + 1
    return ids, n


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """Two groups: weights with decay; biases, norm gains, position tables and class tokens without
    (any parameter with fewer than two dimensions, or named as a table/token). Parameters that do not
    require a gradient (a frozen backbone) are left out.

    With ``layer_decay`` (BEiT's layer-wise lr decay, timm's ``param_groups_layer_decay``) each layer
    of :func:`layer_ids` has its two groups, each with an ``lr_scale`` of
    ``layer_decay ** (n + 1 - layer)``: 1 for the head, ``layer_decay`` for the last block, down to
    ``layer_decay ** (n + 1)`` for the embeddings; :func:`build_optimizer` multiplies the lr by it."""
    ids, n = layer_ids(model) if layer_decay is not None else ({}, 0)
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decays = not (p.ndim < 2 or any(t in name for t in _NO_DECAY_NAMES))
        layer = ids.get(name, 0)
        group = groups.get((layer, decays))
        if group is None:
            group = groups[(layer, decays)] = {"params": [], "weight_decay": weight_decay if decays else 0.0}
            if layer_decay is not None:
                group["lr_scale"] = layer_decay ** (n + 1 - layer)
        group["params"].append(p)
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], not k[1]))]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW (decoupled decay) or Adam (the paper; ``weight_decay`` must then be 0) from ``cfg``, over the
    parameters that require a gradient, with ``cfg.layer_decay``'s lr per layer (:func:`param_groups`).

    Uses the fused kernel on CUDA and on CPU where this torch has it, foreach otherwise."""
    params = param_groups(model, cfg.weight_decay, cfg.layer_decay)
    for group in params:
        if "lr_scale" in group:
            group["lr"] = cfg.lr * group["lr_scale"]
    first = next(iter(model.parameters()))
    kwargs = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    cls = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    if cfg.name == "adam" and cfg.weight_decay:
        raise ValueError("optim.weight_decay: Adam adds decay to the gradient (L2); use optim.name=adamw for decoupled decay, or set 0")
    fused = first.device.type in ("cuda", "cpu") and first.is_floating_point()
    try:
        return cls(params, fused=fused, **kwargs)
    except (RuntimeError, TypeError):  # no fused kernel for this device/dtype
        return cls(params, foreach=True, **kwargs)


def lr_factor(cfg: ScheduleConfig, step: int, total_steps: int, d_model: int | None = None,
              done: float | None = None) -> float:
    """The schedule's factor on the base lr before optimizer step ``step`` (counted from 0).
    ``cosine`` decays over the run: over the steps after warmup, or, where ``done`` is given (a
    time budget), over whichever of steps and time is further along.

    ``inverse_sqrt`` is the paper's formula with s = step + 1:
    ``d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)``. With ``cfg.cooldown`` the factor is then scaled
    by ``min(1, (1 - done) / cooldown)``, where ``done`` is the fraction of the run behind us
    (default ``step / total_steps``; a recipe with a time budget passes the larger of that and the
    fraction of its time spent).
    """
    s = step + 1
    if cfg.kind == "inverse_sqrt":
        if d_model is None:
            raise ValueError("schedule inverse_sqrt needs d_model (the model's width): pass fit(d_model=...)")
        factor = d_model ** -0.5 * min(s ** -0.5, s * cfg.warmup ** -1.5)
    elif cfg.warmup and s <= cfg.warmup:
        factor = s / cfg.warmup
    elif cfg.kind == "constant":
        factor = 1.0
    else:
        span = max(1, total_steps - cfg.warmup)
        progress = min(1.0, max((s - cfg.warmup) / span, 0.0 if done is None else done))  # a time budget: its clock
        factor = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if cfg.cooldown:
        done = step / max(1, total_steps) if done is None else done
        factor *= min(1.0, max(0.0, 1.0 - done) / cfg.cooldown)
    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, total_steps: int,
                    d_model: int | None = None,
                    done: Callable[[int], float] | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR applying :func:`lr_factor` (call ``step()`` after each optimizer step); ``done(step)``,
    if given, says what fraction of the run is behind us (for a cooldown that follows a time budget)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(cfg, step, total_steps, d_model, None if done is None else done(step)))


def bf16_is_fast(device: torch.device | str) -> bool:
    """Whether bf16 matmuls run natively here: a CUDA GPU with bf16 support, or a CPU whose oneDNN has
    bf16 kernels (AVX-512 or AMX). On an AVX2-only CPU torch falls back to a scalar bf16 GEMM that is
    many times slower than fp32."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):  # pragma: no cover - a torch without oneDNN
            return False
    return False


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """``bf16`` or ``fp32``: ``auto`` is bf16 where :func:`bf16_is_fast`, else fp32."""
    if precision == "auto":
        return "bf16" if bf16_is_fast(device) else "fp32"
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"precision {precision!r}: use auto, bf16 or fp32")
    return precision


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU or GPU, or nothing for fp32 (``auto``: see :func:`resolve_precision`)."""
    device = torch.device(device)
    if resolve_precision(precision, device) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


class EMA(nn.Module):
    """An exponential moving average of a model's parameters and buffers (kept in torch's AveragedModel).

    ``update(model)`` after each optimizer step; ``module`` is the averaged copy to evaluate/export."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        super().__init__()
        from torch.optim.swa_utils import AveragedModel

        self.averaged = AveragedModel(model, use_buffers=True)  # the copy and its counter; update() averages
        self.decay = decay
        self.averaged.update_parameters(model)  # the first update only copies: let it be the start

    @property
    def module(self) -> nn.Module:
        return self.averaged.module

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """``ema = decay * ema + (1 - decay) * model`` for floating parameters and buffers (AveragedModel's
        EMA, in one ``lerp`` per kind of tensor so FSDP's sharded DTensors and plain buffers never mix);
        other buffers (counters) are copied."""
        pairs = list(zip(self.module.parameters(), model.parameters())) + list(zip(self.module.buffers(), model.buffers()))
        groups: dict[tuple, tuple[list, list]] = {}
        for ema, cur in pairs:
            if not (ema.is_floating_point() or ema.is_complex()):
                ema.copy_(cur)
                continue
            key = (type(ema), ema.device, ema.dtype)
            groups.setdefault(key, ([], []))
            groups[key][0].append(ema)
            groups[key][1].append(cur.detach().to(ema.device))
        for ema_list, cur_list in groups.values():
            torch._foreach_lerp_(ema_list, cur_list, 1 - self.decay)
        self.averaged.n_averaged += 1
