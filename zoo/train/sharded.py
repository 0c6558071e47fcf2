"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): what ``run.strategy: fsdp`` writes.

    save_sharded_checkpoint(out / "ckpt-0000500.dcp", model=model, optimizer=opt, scheduler=sched,
                            step=500, state={...}, config=cfg_dict, ema=ema, dist=dist)   # every process
    meta = load_sharded_checkpoint(path, model=model, optimizer=opt, ema=ema)           # every process

Every process writes its own shards of the model, the optimizer state and the EMA into a folder
``<name>.tmp``; rank 0 adds ``train_state.pt`` (step, the loop's counters, RNG, the schedule, the
config) and renames the folder to its name once everything is on disk, so a process killed during
a save leaves only a ``.tmp`` folder, which is never resumed from. Loading goes through DCP's
resharding: a checkpoint written by N processes loads on any number of processes, sharded or not
(``torch.distributed.checkpoint.state_dict`` gives each model and optimizer state by parameter
name, whatever the wrapping).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from zoo.atomic import atomic_write
from zoo.train.checkpoint import TRAIN_STATE, CheckpointError, check_compatible, rng_state, saved_shapes, single_process_dcp
from zoo.train.distributed import Dist

__all__ = ["save_sharded_checkpoint", "load_sharded_checkpoint", "read_train_state"]


def _states(model: nn.Module, optimizer: torch.optim.Optimizer | None, ema: nn.Module | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        tensors = {"model": get_model_state_dict(model)}
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        tensors = {"model": model_state, "optimizer": optim_state}
    if ema is not None:
        tensors["ema"] = get_model_state_dict(ema)
    return tensors


def save_sharded_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    step: int,
    state: Mapping[str, Any],
    config: Mapping[str, Any] | None,
    ema: nn.Module | None,
    dist: Dist,
) -> Path:
    """Write a sharded checkpoint folder at ``path``; every process calls it (collective)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    with single_process_dcp(not dist.enabled):
        dcp.save(_states(model, optimizer, ema), checkpoint_id=str(tmp), no_dist=not dist.enabled)
    if dist.is_main:
        meta: dict[str, Any] = {"step": int(step), "rng": rng_state(), "state": dict(state), "world_size": dist.world_size}
        if scheduler is not None:
            meta["scheduler"] = scheduler.state_dict()
        if config is not None:
            meta["config"] = dict(config)
        with atomic_write(tmp / TRAIN_STATE) as f:
            torch.save(meta, f)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    dist.barrier()
    return path


def read_train_state(path: str | os.PathLike) -> dict[str, Any]:
    """A sharded checkpoint's ``train_state.pt`` (no arbitrary unpickling)."""
    path = Path(path)
    try:
        return torch.load(path / TRAIN_STATE, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{str(path)!r} is not a complete sharded checkpoint (no {TRAIN_STATE})") from None
    except Exception as e:
        raise CheckpointError(f"cannot read {str(path / TRAIN_STATE)!r}: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def load_sharded_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    ema: nn.Module | None,
    dist: Dist,
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Load a sharded checkpoint into ``model``/``optimizer``/``ema`` (any sharding, any number of
    processes; collective) and return its train state (step, state, rng, scheduler, config)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    path = Path(path)
    meta = read_train_state(path)
    check_compatible(str(path), saved_shapes(path), model, meta.get("config"), config)
    if ema is not None and not saved_shapes(path, "ema"):
        raise CheckpointError(f"{str(path)!r} has no EMA weights; resume with run.ema=null")
    tensors = _states(model, optimizer, ema)
    with single_process_dcp(not dist.enabled):
        dcp.load(tensors, checkpoint_id=str(path), no_dist=not dist.enabled)
    if optimizer is None:
        set_model_state_dict(model, tensors["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=tensors["model"], optim_state_dict=tensors["optimizer"])
    if ema is not None:
        set_model_state_dict(ema, tensors["ema"])
    return meta
