"""Checkpoints: atomic, resumable, and averaged.

    save_checkpoint(out_dir / "ckpt-000500.pt", model=model, optimizer=opt, scheduler=sched,
                    step=500, state={"epoch": 1, "batch": 37}, config=cfg.model_dump(mode="json"))
    ckpt = load_checkpoint(latest_checkpoint(out_dir))     # a dict; restore_rng(ckpt) for exact resume
    averaged = average_checkpoints(paths)                   # the paper's checkpoint averaging

A checkpoint is written to a temporary file in the same folder and renamed over the target, so a
crash mid-write never leaves a half file under a checkpoint's name. Loading uses
``torch.load(weights_only=True)``: tensors, numbers, strings, lists and dicts only, never arbitrary
pickled objects. RNG states (Python, torch CPU and CUDA) travel with the checkpoint so dropout and
data order continue exactly where they stopped.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from torch import Tensor, nn

from zoo.atomic import atomic_write

__all__ = [
    "CheckpointError", "save_checkpoint", "load_checkpoint", "latest_checkpoint", "list_checkpoints",
    "prune_checkpoints", "average_checkpoints", "average_state_dicts", "rng_state", "restore_rng",
    "unwrap", "checkpoint_name",
]

_NAME = re.compile(r"^ckpt-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or used; the message names the file."""


def unwrap(model: nn.Module) -> nn.Module:
    """The bare module inside DDP and ``torch.compile`` wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:07d}.pt"


def rng_state() -> dict[str, Any]:
    """Every random generator a training loop draws from."""
    state: dict[str, Any] = {"python": list(random.getstate()[1]), "python_pos": random.getstate()[2],
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(ckpt: Mapping[str, Any]) -> None:
    """Put the generators back as :func:`rng_state` found them (``ckpt`` or its ``"rng"`` entry)."""
    state = ckpt.get("rng", ckpt)
    version = random.getstate()[0]
    random.setstate((version, tuple(int(x) for x in state["python"]), state["python_pos"]))
    torch.set_rng_state(state["torch"].cpu() if isinstance(state["torch"], Tensor) else state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    step: int,
    state: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    ema: nn.Module | Mapping[str, Tensor] | None = None,
    scaler: Any = None,
) -> Path:
    """Write everything needed to continue training at ``step``, atomically; returns the path.

    ``state``: the loop's own counters (epoch, batch within the epoch, best metric ...), plain values.
    ``config``: the run's config as plain data (recorded; resuming checks nothing against it).
    """
    ckpt: dict[str, Any] = {
        "step": int(step),
        "model": {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()},
        "rng": rng_state(),
        "state": dict(state or {}),
    }
    if optimizer is not None:
        ckpt["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        ckpt["scheduler"] = scheduler.state_dict()
    if scaler is not None:
        ckpt["scaler"] = scaler.state_dict()
    if ema is not None:
        ema_state = ema.state_dict() if isinstance(ema, nn.Module) else ema
        ckpt["ema"] = {k: v.detach().cpu() for k, v in ema_state.items()}
    if config is not None:
        ckpt["config"] = dict(config)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        torch.save(ckpt, f)
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint written by :func:`save_checkpoint`, as a dict (no arbitrary unpickling)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {str(path)!r}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated, corrupt, not a checkpoint
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "step" not in ckpt:
        raise CheckpointError(f"{str(path)!r} is not a zoo training checkpoint (no 'model'/'step' entries)")
    return ckpt


def list_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """The periodic checkpoints ``ckpt-<step>.pt`` in ``out_dir``, oldest first."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out_dir.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def prune_checkpoints(out_dir: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` periodic checkpoints; returns what was deleted."""
    found = list_checkpoints(out_dir)
    doomed = found[:-keep] if keep > 0 else found
    for p in doomed:
        p.unlink(missing_ok=True)
    return doomed


def average_state_dicts(states: Iterable[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The element-wise arithmetic mean of floating-point tensors (accumulated in float64, returned
    in each tensor's own dtype); integer and boolean tensors must agree and are kept as they are."""
    states = list(states)
    if not states:
        raise ValueError("average_state_dicts: nothing to average")
    keys = list(states[0])
    for i, s in enumerate(states[1:], 1):
        if list(s) != keys:
            missing, extra = set(keys) - set(s), set(s) - set(keys)
            raise ValueError(f"state {i} has different tensors (missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]})")
    out: dict[str, Tensor] = {}
    for k in keys:
        first = states[0][k]
        shapes = {tuple(s[k].shape) for s in states}
        if len(shapes) > 1:
            raise ValueError(f"{k}: shapes differ between checkpoints: {sorted(shapes)}")
        if first.is_floating_point():
            acc = torch.zeros(first.shape, dtype=torch.float64)
            for s in states:
                acc += s[k].detach().to("cpu", torch.float64)
            out[k] = (acc / len(states)).to(first.dtype)
        else:
            if any(not torch.equal(s[k].cpu(), first.cpu()) for s in states[1:]):
                raise ValueError(f"{k}: a non-floating tensor differs between checkpoints; cannot average it")
            out[k] = first.detach().cpu().clone()
    return out


def average_checkpoints(paths: Iterable[str | os.PathLike], key: str = "model") -> dict[str, Tensor]:
    """The mean of the ``key`` weights of several checkpoints (the paper averages the last 5 / 20).

    Also accepts safetensors files written by ``zoo.save`` (their tensors, tied names once)."""
    states = []
    for p in paths:
        p = Path(p)
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            states.append(load_file(str(p)))
        else:
            states.append(load_checkpoint(p)[key])
    return average_state_dicts(states)
