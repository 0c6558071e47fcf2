"""Distributed set-up over torch.distributed: the same script runs alone or under ``torchrun``.

    with distributed("auto") as dist:        # reads torchrun's RANK / WORLD_SIZE / LOCAL_RANK
        model = dist.wrap(model)             # DistributedDataParallel when world_size > 1
        dist.print("only rank 0 prints")

Backends: NCCL on GPU, gloo on CPU. Each process reads its share of the data through torch's
``DistributedSampler`` (training) or a strided slice (``eval_indices``: evaluation, no padding
duplicates); metrics are summed with ``all_reduce``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sized

import torch
import torch.distributed as td
from torch import nn
from torch.utils.data import DistributedSampler

from zoo.train.errors import TrainError

__all__ = ["Dist", "distributed", "resolve_device"]


def resolve_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto``: this process's GPU when CUDA is available, else the CPU. A device that cannot be had is
    a :class:`~zoo.train.errors.TrainError` naming ``run.device``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise TrainError(f"run.device: {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TrainError(f"run.device: {name!r} asked for, but CUDA is not available here; use run.device=cpu "
                             "(or auto)")
        if device.index is None:
            device = torch.device("cuda", local_rank)
    return device


@dataclass(frozen=True)
class Dist:
    """This process's place in the job, and the few collective operations recipes use."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only, flushed."""
        if self.is_main:
            print(*args, **kwargs, flush=True)

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` in DistributedDataParallel when there is more than one process."""
        if not self.enabled:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def sampler(self, data: Sized, *, shuffle: bool = True, seed: int = 0, drop_last: bool = True) -> DistributedSampler:
        """torch's DistributedSampler for this rank (one replica when alone); call ``set_epoch``."""
        return DistributedSampler(
            data, num_replicas=self.world_size, rank=self.rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )

    def eval_indices(self, n: int) -> range:
        """This rank's items of ``n`` for evaluation (or decoding): every ``world_size``-th from its rank,
        so every item is seen once over all ranks, none twice and none dropped."""
        return range(self.rank, n, self.world_size)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum (or max/min) ``tensor`` over ranks, in place; returns it. A no-op when alone. A CPU
        tensor on GPU processes travels through this process's GPU (NCCL reduces GPU tensors only)."""
        if self.enabled:
            ops = {"sum": td.ReduceOp.SUM, "max": td.ReduceOp.MAX, "min": td.ReduceOp.MIN}
            moved = tensor.to(self.device) if self.device.type == "cuda" and tensor.device.type != "cuda" else tensor
            td.all_reduce(moved, op=ops[op])
            if moved is not tensor:
                tensor.copy_(moved)
        return tensor

    def sync_buffers(self, *modules: nn.Module) -> None:
        """Give every rank rank 0's buffers (BatchNorm's running statistics). DDP broadcasts them
        before each training forward, so after the last one every other rank holds its own batch's
        update; call this before evaluating, checkpointing or exporting. A no-op when alone."""
        if self.enabled:
            for module in modules:
                for buffer in module.buffers():
                    td.broadcast(buffer, src=0)

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (picklable objects; small ones)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        td.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            td.barrier(device_ids=[self.device.index] if self.device.type == "cuda" else None)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


@contextlib.contextmanager
def distributed(device: str = "auto", *, timeout_minutes: float = 30.0) -> Iterator[Dist]:
    """Join the process group torchrun describes (if any) for the ``with`` block; leave it after.

    Without torchrun's environment this is a single process and nothing is initialised.
    """
    world = _env_int("WORLD_SIZE", 1)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if world > 1 and device.startswith("cuda:"):
        raise TrainError(f"run.device: {device} puts all {world} processes on one GPU; use run.device=cuda "
                         "(each process takes its LOCAL_RANK's GPU; CUDA_VISIBLE_DEVICES picks which GPUs)")
    dev = resolve_device(device, local_rank)
    if world == 1:
        yield Dist(device=dev)
        return
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    started = not td.is_initialized()
    if started:
        td.init_process_group(
            backend=backend, rank=rank, world_size=world, timeout=datetime.timedelta(minutes=timeout_minutes),
            device_id=dev if dev.type == "cuda" else None,
        )
    try:
        yield Dist(rank=rank, world_size=world, local_rank=local_rank, device=dev)
    finally:
        if started and td.is_initialized():
            if sys.exc_info()[0] is None:
                td.barrier()
            td.destroy_process_group()
