"""Checkpoints: atomic, resumable, averaged, and carrying the model's spec; one file or, from a
sharded (FSDP) run, one folder.

    save_checkpoint(out_dir / "ckpt-0000500.pt", model=model, optimizer=opt, scheduler=sched, step=500,
                    state={"epoch": 1, "pos": 37}, config=cfg.model_dump(mode="json"), spec=model_spec(model))
    ckpt = load_checkpoint(latest_checkpoint(out_dir))     # a dict; restore_rng(ckpt) for exact resume
    averaged = average_checkpoints(paths)                   # the paper's checkpoint averaging
    spec = checkpoint_spec(path)                            # the model's spec as JSON data, or None

A checkpoint is one file ``ckpt-<step>.pt``, or a folder ``ckpt-<step>.dcp`` written by
``torch.distributed.checkpoint`` (DCP) with every process writing its own shards
(:func:`save_sharded_checkpoint`, what ``run.strategy: fsdp`` writes). Either is written under a
temporary name in the same folder and renamed over the target, so a crash mid-write never leaves a
half checkpoint under a checkpoint's name; one damaged afterwards is named with its missing part
before anything reads it (zoo.train.integrity). Loading uses ``torch.load(weights_only=True)``: tensors,
numbers, strings, lists and dicts only, never arbitrary pickled objects. RNG states (Python, torch
CPU and CUDA) travel with the checkpoint so dropout and data order continue exactly where they
stopped. A checkpoint of a zoo model records its spec (``model.spec`` as JSON data), so ``zoo
average`` rebuilds the model from the checkpoints alone.

A sharded folder holds each process's shards of the model, the optimizer state and the EMA, and
``train_state.pt`` (step, the loop's counters, RNG, the schedule, the config, the spec), added by
rank 0 before the rename. Loading goes through DCP's resharding: a checkpoint written by N processes
loads on any number of processes, sharded or not (``torch.distributed.checkpoint.state_dict`` gives
each model and optimizer state by parameter name, whatever the wrapping).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch import Tensor, nn

from zoo.atomic import atomic_write
from zoo.train.distributed import Dist
from zoo.train.errors import CheckpointError
from zoo.train.integrity import TRAIN_STATE, check_checkpoint, checkpoint_problem

__all__ = [
    "CheckpointError", "save_checkpoint", "load_checkpoint", "latest_checkpoint", "list_checkpoints",
    "prune_checkpoints", "average_checkpoints", "average_state_dicts", "rng_state", "restore_rng", "unwrap",
    "checkpoint_name", "check_compatible", "model_spec", "checkpoint_spec", "resolve_resume", "restore_checkpoint",
    "save_sharded_checkpoint", "load_sharded_checkpoint", "read_train_state", "read_sharded_tensors", "saved_shapes",
    "saved_tensors", "single_process_dcp", "TRAIN_STATE", "check_checkpoint", "checkpoint_problem",
]

_NAME = re.compile(r"^ckpt-(\d+)\.(pt|dcp)$")


def unwrap(model: nn.Module) -> nn.Module:
    """The bare module inside DDP and ``torch.compile`` wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def checkpoint_name(step: int, sharded: bool = False) -> str:
    return f"ckpt-{step:07d}." + ("dcp" if sharded else "pt")


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


def model_spec(model: nn.Module) -> dict[str, Any] | None:
    """The spec of a zoo model (``model.spec``, set by ``zoo.build``) as JSON data, the form a checkpoint
    records; None for a module without one (a wrapper around a zoo model, a plain torch module)."""
    spec = getattr(unwrap(model), "spec", None)
    return spec.model_dump(mode="json") if spec is not None and hasattr(spec, "model_dump") else None


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
    spec: Mapping[str, Any] | None = None,
) -> Path:
    """Write everything needed to continue training at ``step``, atomically; returns the path.

    ``state``: the loop's own counters (epoch, batch within the epoch, best metric ...), plain values.
    ``config``: the run's config as plain data (resuming names the settings that differ from it).
    ``spec``: the model's spec as JSON data (:func:`model_spec`), so the weights rebuild without the run.
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
    if ema is not None:
        ema_state = ema.state_dict() if isinstance(ema, nn.Module) else ema
        ckpt["ema"] = {k: v.detach().cpu() for k, v in ema_state.items()}
    if config is not None:
        ckpt["config"] = dict(config)
    if spec is not None:
        ckpt["spec"] = dict(spec)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        torch.save(ckpt, f)
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu", *,
                    mmap: bool = False) -> dict[str, Any]:
    """A checkpoint written by :func:`save_checkpoint`, as a dict (no arbitrary unpickling); ``mmap``
    maps the tensors from the file instead of reading them (cheap when only a few are needed)."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{str(path)!r} is a sharded checkpoint folder, not a .pt file")
    check_checkpoint(path)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # truncated, corrupt, not a checkpoint
        raise CheckpointError(f"cannot read checkpoint {str(path)!r}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "step" not in ckpt:
        raise CheckpointError(f"{str(path)!r} is not a zoo training checkpoint (no 'model'/'step' entries)")
    return ckpt


def list_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """The periodic checkpoints in ``out_dir`` (``ckpt-<step>.pt`` files, ``ckpt-<step>.dcp`` folders),
    oldest first; a name is only ever given to a whole checkpoint, so one that is incomplete was
    damaged afterwards: it is listed, and reading it is a :class:`CheckpointError` that names it
    (:func:`~zoo.train.integrity.check_checkpoint`). Temporary ``*.tmp`` writes are not listed."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out_dir.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint in ``out_dir``, whole or not (see :func:`list_checkpoints`)."""
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def prune_checkpoints(out_dir: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` periodic checkpoints; returns what was deleted."""
    found = list_checkpoints(out_dir)
    doomed = found[:-keep] if keep > 0 else found
    for p in doomed:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return doomed


def resolve_resume(resume: str | None, out_dir: Path, *, required: bool = True) -> Path | None:
    """The checkpoint ``--resume`` means: ``latest`` = the newest in ``out_dir``, else a path; checked
    whole (:func:`~zoo.train.integrity.check_checkpoint`). An incomplete newest checkpoint is refused,
    naming it and the newest whole one, never skipped."""
    if resume is None:
        return None
    if resume != "latest":
        return check_checkpoint(resume)
    found = list_checkpoints(out_dir)
    if not found:
        if required:
            raise CheckpointError(f"--resume: no checkpoint in {out_dir}; start without --resume")
        return None
    problem = checkpoint_problem(found[-1])
    if problem is not None:
        whole = next((p for p in reversed(found[:-1]) if checkpoint_problem(p) is None), None)
        fix = f"resume from the newest whole one: --resume {whole}" if whole else "start without --resume"
        raise CheckpointError(f"--resume: cannot read the newest checkpoint, {found[-1]}: {problem}; delete it, "
                              f"or {fix}")
    return found[-1]


def average_state_dicts(states: Iterable[Mapping[str, Tensor]], names: Iterable[str] | None = None) -> dict[str, Tensor]:
    """The element-wise arithmetic mean of floating-point tensors (accumulated in float64, returned
    in each tensor's own dtype). Integer and boolean tensors are not averaged: they are the last
    state's (counters such as BatchNorm's ``num_batches_tracked`` differ between checkpoints), as
    timm's ``avg_checkpoints`` and ``torch.optim.swa_utils`` keep them. ``names`` (one per state,
    e.g. its file) name the states in errors."""
    states = list(states)
    names = list(names) if names is not None else [f"state {i}" for i in range(len(states))]
    if not states:
        raise ValueError("average_state_dicts: nothing to average")
    keys = list(states[0])
    for name, s in zip(names[1:], states[1:]):
        if set(s) != set(keys):
            missing, extra = set(keys) - set(s), set(s) - set(keys)
            raise ValueError(f"{name} holds other tensors than {names[0]} (missing {sorted(missing)[:3]}, "
                             f"extra {sorted(extra)[:3]})")
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
            out[k] = states[-1][k].detach().cpu().clone()
    return out


def average_checkpoints(paths: Iterable[str | os.PathLike], key: str = "model") -> dict[str, Tensor]:
    """The mean of the ``key`` weights of several checkpoints (the paper averages the last 5 / 20).

    Also accepts sharded checkpoint folders (whole tensors read back from every shard, in this
    process) and safetensors files written by ``zoo.save`` (every name of the model they hold, tied
    ones included, as a training checkpoint has them)."""
    paths, states = [Path(p) for p in paths], []
    for p in paths:
        if p.is_dir():
            states.append(read_sharded_tensors(p, key))
        elif p.suffix == ".safetensors":
            from zoo.io import load

            states.append(load(p).state_dict())
        else:
            states.append(load_checkpoint(p)[key])
    return average_state_dicts(states, [str(p) for p in paths])


def checkpoint_spec(path: str | os.PathLike) -> dict[str, Any] | None:
    """The model spec (JSON data) a checkpoint records: a ``.pt`` file's, a sharded folder's, or a
    ``zoo.save`` file's; None where the checkpoint has none (its model was no zoo model)."""
    path = Path(path)
    if path.is_dir():
        return read_train_state(path).get("spec")
    if path.suffix == ".safetensors":
        from zoo.io import read_spec

        return read_spec(path).model_dump(mode="json")
    return load_checkpoint(path, mmap=True).get("spec")


# ------------------------------------------------------------------- sharded checkpoints (DCP)
@contextlib.contextmanager
def single_process_dcp(alone: bool = True) -> Iterator[None]:
    """Silence DCP's warning that it reads or writes in one process when there is no process group
    (``alone``): that is what is meant, not a missing ``init_process_group``."""
    with warnings.catch_warnings():
        if alone:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def saved_tensors(path: str | os.PathLike, key: str = "model") -> dict[str, Any]:
    """A sharded checkpoint's ``key`` tensors by name -> their storage metadata (shape, dtype), from
    its ``.metadata`` alone."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    found = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    prefix = key + "."
    return {k[len(prefix):]: m for k, m in found.items() if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}


def saved_shapes(path: str | os.PathLike, key: str = "model") -> dict[str, tuple[int, ...]]:
    """Names and shapes of a sharded checkpoint's ``key`` tensors, from its metadata alone."""
    return {k: tuple(m.size) for k, m in saved_tensors(path, key).items()}


def read_sharded_tensors(path: str | os.PathLike, key: str = "model") -> dict[str, Tensor]:
    """The whole ``key`` tensors of a sharded checkpoint folder, read in this process alone."""
    import torch.distributed.checkpoint as dcp

    path = check_checkpoint(path)
    template = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in saved_tensors(path, key).items()}
    if not template:
        raise CheckpointError(f"{str(path)!r} holds no {key!r} tensors")
    with single_process_dcp():
        dcp.load({key: template}, checkpoint_id=str(path), no_dist=True)
    return template


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
    spec: Mapping[str, Any] | None = None,
) -> Path:
    """Write a sharded checkpoint folder at ``path``; every process calls it (collective). The
    arguments are :func:`save_checkpoint`'s."""
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
        if spec is not None:
            meta["spec"] = dict(spec)
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
    """A sharded checkpoint's ``train_state.pt`` (no arbitrary unpickling), once the folder is found
    whole (:func:`~zoo.train.integrity.check_checkpoint`)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"no sharded checkpoint folder at {str(path)!r}")
    check_checkpoint(path)
    try:
        return torch.load(path / TRAIN_STATE, map_location="cpu", weights_only=True)
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


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def check_compatible(source: str, saved: Mapping[str, tuple[int, ...]], model: nn.Module,
                     saved_config: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None) -> None:
    """Raise a :class:`CheckpointError` naming what differs when ``saved`` (tensor names -> shapes of
    a checkpoint's model) does not fit ``model``; the two runs' configs, where given, name the
    settings that differ (``run.*`` aside)."""
    here = {k: tuple(v.shape) for k, v in unwrap(model).state_dict().items()}
    missing = sorted(set(here) - set(saved))
    extra = sorted(set(saved) - set(here))
    shapes = [f"{k} is {list(saved[k])} there, {list(here[k])} here" for k in here if k in saved and saved[k] != here[k]]
    if not (missing or extra or shapes):
        return
    problems = []
    if shapes:
        problems.append("shapes differ: " + "; ".join(shapes[:3]) + (f" (+{len(shapes) - 3} more)" if len(shapes) > 3 else ""))
    if missing:
        problems.append(f"missing there: {', '.join(missing[:3])}" + (f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""))
    if extra:
        problems.append(f"not in this model: {', '.join(extra[:3])}" + (f" (+{len(extra) - 3} more)" if len(extra) > 3 else ""))
    if saved_config is not None and config is not None:
        a, b = _flat(saved_config), _flat(config)
        differ = [k for k in sorted(set(a) | set(b)) if not k.startswith("run.") and a.get(k) != b.get(k)]
        if differ:
            problems.append("the configs differ in " + ", ".join(f"{k} ({a.get(k)!r} there, {b.get(k)!r} here)"
                                                                 for k in differ[:5]))
    raise CheckpointError(f"{source} holds another model than this run builds: " + "; ".join(problems)
                          + "; resume with the config it was trained with, or start a new run (another run.out_dir)")


def restore_checkpoint(path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, ema: nn.Module | None,
                       dist: Dist, config: Mapping[str, Any] | None = None, sharded: bool = False) -> dict[str, Any]:
    """Load a checkpoint (a file or a sharded folder) into a run's model, optimizer and EMA (``sharded``:
    the model is under FSDP, each process keeps its shards of a file's whole tensors); returns the
    checkpoint's train state (step, state, rng, scheduler, config). Refuses another model's checkpoint
    naming what differs (:func:`check_compatible`)."""
    if path.is_dir():
        return load_sharded_checkpoint(path, model=model, optimizer=optimizer, ema=ema, dist=dist, config=config)
    ckpt = load_checkpoint(path, map_location=dist.device)
    check_compatible(str(path), {k: tuple(v.shape) for k, v in ckpt["model"].items()}, model, ckpt.get("config"), config)
    if ema is not None and "ema" not in ckpt:
        raise CheckpointError(f"{path} has no EMA weights; resume with run.ema=null")
    if sharded:  # whole tensors in the file: every process keeps its shards of them
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

        full = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, ckpt["model"], options=full)
        names = {id(p): n for n, p in model.named_parameters()}  # torch numbers parameters group by group
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        saved = ckpt["optimizer"]
        by_name = {"state": {order[int(i)]: v for i, v in saved["state"].items()},
                   "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]} for g in saved["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, by_name, options=full)
        if ema is not None:
            set_model_state_dict(ema, ckpt["ema"], options=full)
        return ckpt
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if ema is not None:
        ema.load_state_dict(ckpt["ema"])
    return ckpt
