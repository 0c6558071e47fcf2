"""Sharding a model over processes with PyTorch's FSDP2 (``run.strategy: fsdp``), and activation
checkpointing (``run.activation_checkpointing``).

    set_activation_checkpointing(model)          # every zoo Stack recomputes its blocks in backward
    apply_fsdp(model, dist, precision="bf16")    # fully_shard each block, then the root, in place
    with full_parameters(model):                 # all parameters gathered: evaluate, decode, ...
        ...
    plain = gathered(model)                      # an unsharded copy (zoo models), the same on every rank

Each block of every :class:`~zoo.components.block.Stack` is one FSDP unit (its parameters are
all-gathered just before it runs and freed after), the rest of the model (embeddings, the head, the
final norm) is the root unit. ``bf16`` keeps fp32 master weights and optimizer state, computes with
bf16 parameters and reduces gradients in fp32 (``MixedPrecisionPolicy``); BatchNorm layers are units
of their own that compute in fp32, as their running statistics are. The same code runs on gloo
(CPU) and NCCL (GPU). Nothing here shards by itself: it is ``torch.distributed.fsdp.fully_shard``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from zoo.components.stack import Stack
from zoo.train.distributed import Dist

BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)

__all__ = ["stacks", "set_activation_checkpointing", "apply_fsdp", "full_parameters", "gathered"]


def stacks(model: nn.Module) -> list[Stack]:
    """The model's block stacks (a decoder has one, an encoder-decoder two)."""
    return [m for m in model.modules() if isinstance(m, Stack)]


def set_activation_checkpointing(model: nn.Module, enabled: bool = True) -> int:
    """Turn activation checkpointing on (or off) in every stack of ``model``; returns the number of
    blocks it applies to. A model without zoo stacks is an error: nothing would be recomputed."""
    found = stacks(model)
    if enabled and not found:
        raise ValueError(f"run.activation_checkpointing: {type(model).__name__} has no zoo block stack to recompute; "
                         "set run.activation_checkpointing=false")
    for stack in found:
        stack.checkpointing = enabled
    return sum(len(s.blocks) for s in found)


def _fsdp():
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

    return fully_shard, FSDPModule, MixedPrecisionPolicy, CPUOffloadPolicy


def apply_fsdp(model: nn.Module, dist: Dist, *, precision: str = "fp32", offload: bool = False) -> nn.Module:
    """Apply FSDP2 to ``model`` in place over all of ``dist``'s processes: one unit per block, then the
    root. Build the optimizer afterwards (its parameters become sharded DTensors)."""
    import torch.distributed as td

    if not td.is_initialized():
        raise ValueError("apply_fsdp: FSDP needs a process group; run under torchrun (one process alone trains unsharded)")
    if offload and dist.device.type != "cuda":
        raise ValueError(f"run.offload: moves sharded state from GPU to CPU memory, but this run is on {dist.device}; "
                         "set run.offload=false")
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, _, MixedPrecisionPolicy, CPUOffloadPolicy = _fsdp()
    kwargs: dict = {"mesh": init_device_mesh(dist.device.type, (dist.world_size,))}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        for module in model.modules():  # BatchNorm (ViTC's stem) keeps fp32 weights beside its fp32 statistics
            if isinstance(module, BATCH_NORMS):
                fully_shard(module, **{**kwargs, "mp_policy": fp32})
    for stack in stacks(model):
        for block in dict.fromkeys(stack.blocks):  # a block shared by several layers (shared_layers) once
            fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


@contextlib.contextmanager
def full_parameters(*models: nn.Module | None) -> Iterator[None]:
    """Inside the block, every FSDP unit of ``models`` holds its whole parameters (gathered once,
    on entry), so any method may run any number of times on each process with no collective
    communication: evaluation shards its data unevenly, decoding calls ``encode``/``decode``.
    Every process must enter and leave together. A no-op for unsharded models."""
    _, FSDPModule, _, _ = _fsdp()
    units = [m for model in models if model is not None for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield
        return
    for model in models:
        if isinstance(model, FSDPModule):
            state = model._get_fsdp_state()  # the root must be known before a child's forward runs first
            state._lazy_init()
    for unit in units:
        unit.unshard()
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(not any(unit is m for m in models), recurse=False)
            unit.reshard()


def gathered(model: nn.Module, device: torch.device | None = None) -> nn.Module:
    """An unsharded copy of a sharded zoo model (built from ``model.spec``, or by the model's own
    ``rebuild()`` for a wrapper around one), with the whole weights on every process: what a recipe
    evaluates, decodes and exports after training. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from zoo.build import build

    spec = getattr(model, "spec", None)
    if spec is None and not callable(getattr(model, "rebuild", None)):
        raise ValueError(f"gathered: {type(model).__name__} has no spec to rebuild it from (nor a rebuild() method that "
                         "makes a fresh copy); read its weights with torch.distributed.checkpoint.state_dict."
                         "get_model_state_dict(full_state_dict=True)")
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    plain = (build(spec) if spec is not None else model.rebuild()).to(device or next(iter(state.values())).device)
    plain.load_state_dict(state)
    plain.train(model.training)
    return plain
