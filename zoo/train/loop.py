"""The one training loop every recipe feeds: ``fit(model, task, optim=..., schedule=..., run=..., dist=...)``.

A recipe describes its data and loss as a :class:`Task`; the loop owns everything else, once:
the optimizer and schedule (``optim``, ``schedule``), bf16 autocast, gradient accumulation,
clipping, DDP (``no_sync`` on all but the last micro-batch) or FSDP2 (``run.strategy: fsdp``, see
zoo.train.fsdp), activation checkpointing, the EMA of the weights, a time budget, periodic
evaluation, atomic checkpoints with exact resume (model, optimizer, schedule, EMA, RNG, data position,
the running log window, the clock, the model's spec; one file, or a sharded DCP folder under fsdp that
resumes on any number of processes), the metrics log and its plot, and progress. A run that cannot
go on raises :class:`~zoo.train.errors.TrainError` (a :class:`~zoo.train.checkpoint.CheckpointError`
for a checkpoint it cannot resume from), and so does a ``run`` option that would have no effect on this
run's processes or device (``run.offload`` on one process or CPU, ``run.attention=efficient`` off CUDA,
a forced kernel torch cannot run for the model, bf16 on a GPU without it).

    class MyTask(Task):
        def steps(self, epoch): ...                     # optimizer steps in this epoch
        def epoch(self, epoch, start): ...              # this rank's micro-batches of each step, from step `start`
        def loss(self, model, batch, step): ...         # (loss, {"tokens": n, ...})
        def evaluate(self, model): ...                  # {"loss": ..., "ppl": ...}

    result = fit(model, MyTask(), optim=cfg.optim, schedule=cfg.schedule, run=cfg.run, dist=dist,
                 total_steps=2000, resume=path_or_None)

Loss scaling: ``loss`` returns the batch's loss summed over ``count(batch)`` units (target tokens,
images); by default ``count`` is 1 and the loss is the batch's mean. The loop backpropagates
``loss * world_size / (the step's total count over all micro-batches and processes)``, so a step's
gradient is the mean over its units on any number of processes, as DDP averages gradients. The
logged train loss is the same mean, of the values: the losses of a log window's micro-batches summed
over all processes, over their units counted once each (the progress bar shows rank 0's share alone).

Every value ``loss`` returns in its stats dict is summed over a log window and all processes and
handed to ``Task.train_values`` with the window's training seconds (evaluation and checkpoints
excluded); the default logs ``<key>_per_s`` for each.

A model with mixture-of-experts layers gets its routers' losses added after each micro-batch's forward
pass, weighted by one over the step's micro-batches on all processes; its experts' biases move after
each optimizer step; the train rows log ``aux_loss`` and ``z_loss`` (and dropped tokens), ``experts``
rows each layer's load per expert, and ``experts.png`` plots them (zoo.train.router). The task's
``loss`` stays what it was: the logged train ``loss`` is the task's alone.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn

from zoo.kernels.cpu import choose
from zoo.train.checkpoint import (checkpoint_name, model_spec, prune_checkpoints, restore_checkpoint, restore_rng,
                                  rng_state, save_checkpoint, save_sharded_checkpoint, unwrap)
from zoo.train.config import OptimConfig, RunConfig, ScheduleConfig
from zoo.train.distributed import Dist
from zoo.train.errors import TrainError
from zoo.train.fsdp import apply_fsdp, full_parameters, gathered, set_activation_checkpointing
from zoo.train.metrics import MetricsLog, Progress, plot_metrics
from zoo.train.optim import EMA, autocast, build_optimizer, build_scheduler, resolve_precision
from zoo.train.router import LOAD_SPLIT, RouterTraining, plot_expert_load
from zoo.train.runtime import attention_kernels

__all__ = ["Task", "ListTask", "Fitted", "fit"]


class Task:
    """What a recipe tells :func:`fit`: its data, its loss, its evaluation. Subclass it."""

    name = "train"  #: the progress bar's label
    panels: list[tuple[str, list[str]]] = [("loss", ["train/loss", "valid/loss"])]  #: curves.png's panels
    plot_options: dict[str, Any] = {}  #: more keyword arguments of plot_metrics (title, log_y)

    def steps(self, epoch: int) -> int:
        """Optimizer steps in ``epoch``, the same on every process."""
        raise NotImplementedError

    def epoch(self, epoch: int, start: int) -> Iterator[Sequence[Any]]:
        """This process's micro-batches of each optimizer step of ``epoch``, from step ``start`` on.
        It must depend on (epoch, rank) alone, so a resumed run sees the same data."""
        raise NotImplementedError

    def count(self, batch: Any) -> float:
        """How many units ``loss`` sums over in ``batch`` (1: ``loss`` is the batch's mean)."""
        return 1.0

    def loss(self, model: nn.Module, batch: Any, step: int) -> tuple[Tensor, dict[str, float]]:
        """The batch's loss (see the module docstring) and stats to sum over the log window. Random
        draws come from the global torch generator or a generator seeded with ``step``: both continue
        exactly after a resume."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """Validation values, over all processes; a value that is a dict becomes its own log row
        (split ``valid_<key>``), e.g. a score per domain. Runs under no_grad and autocast."""
        raise NotImplementedError

    def train_values(self, sums: dict[str, float], seconds: float) -> dict[str, float]:
        """The train log row's values from the window's summed stats (all processes)."""
        return {f"{k}_per_s": v / max(seconds, 1e-9) for k, v in sums.items()}

    def state_dict(self) -> dict[str, Any]:
        """Anything else the task must carry across a resume."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def resume_at(self, epoch: int, pos: int, world: int, accum: int, here: tuple[int, int]) -> int:
        """This run's step of ``epoch`` that continues a checkpoint written at its step ``pos`` by a
        run of ``world`` processes and ``grad_accum`` ``accum``, this run's being ``here``. What a step
        covers is the task's own, so by default only an unchanged (processes, grad_accum), or the start of
        an epoch, continues; a task whose step is the same data whatever the split returns ``pos``."""
        if pos == 0 or (world, accum) == here:
            return pos
        raise TrainError(f"run.grad_accum: the checkpoint stopped inside epoch {epoch} of a run of {world} process(es) "
                         f"x grad_accum {accum}, and {self.name} cannot place that on {here[0]} x {here[1]}; resume "
                         f"with {world} x {accum}, or from a checkpoint at an epoch's end")


class ListTask(Task):
    """A task whose epoch is a list of micro-batches the same on every process (``batches(epoch)``):
    each process takes every ``world_size``-th one and a step takes ``grad_accum`` of them."""

    def __init__(self, dist: Dist, grad_accum: int) -> None:
        self.dist, self.accum = dist, grad_accum
        self._cache: tuple[int, list[Any]] | None = None

    def batches(self, epoch: int) -> Sequence[Any]:
        raise NotImplementedError

    def epoch_batches(self, epoch: int) -> list[Any]:
        """``batches(epoch)``, made once per epoch."""
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, list(self.batches(epoch)))
        return self._cache[1]

    def steps(self, epoch: int) -> int:
        return len(self.epoch_batches(epoch)) // self.dist.world_size // self.accum

    def epoch(self, epoch: int, start: int) -> Iterator[Sequence[Any]]:
        mine = self.epoch_batches(epoch)[self.dist.rank :: self.dist.world_size]
        for s in range(start, self.steps(epoch)):
            yield mine[s * self.accum : (s + 1) * self.accum]

    def resume_at(self, epoch: int, pos: int, world: int, accum: int, here: tuple[int, int]) -> int:
        """Steps ``0..pos-1`` of a run of ``world`` x ``accum`` took the epoch's first
        ``pos * world * accum`` micro-batches, whatever the order within a step; this run goes on
        after them when its step, ``processes x grad_accum`` micro-batches, divides that (exact), and
        refuses otherwise (it would repeat or skip some). The micro-batches themselves (the task's
        batch size, its data) must be the checkpoint's: their number in the epoch is compared."""
        then = getattr(self, "_then", None)
        if pos and then is not None and then[0] == epoch and then[1] != len(self.epoch_batches(epoch)):
            raise TrainError(f"{self.name}: epoch {epoch} had {then[1]} micro-batches when the checkpoint was written, "
                             f"{len(self.epoch_batches(epoch))} now (another batch size or other data); resume with the "
                             f"checkpoint's settings, or from a checkpoint at an epoch's end")
        done, step = pos * world * accum, here[0] * here[1]
        if done % step:
            raise TrainError(f"run.grad_accum: the checkpoint stopped inside epoch {epoch} after {done} micro-batches "
                             f"({pos} steps of {world} process(es) x grad_accum {accum}), not a whole number of this "
                             f"run's steps of {here[0]} x {here[1]}; resume with processes x run.grad_accum dividing "
                             f"{done}, or from a checkpoint at an epoch's end")
        return done // step

    def state_dict(self) -> dict[str, Any]:
        """The number of micro-batches of the epoch last made, which a resume compares."""
        return {} if self._cache is None else {"epoch_batches": [self._cache[0], len(self._cache[1])]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._then = tuple(state["epoch_batches"]) if "epoch_batches" in state else None


@dataclass
class Fitted:
    """What :func:`fit` hands back."""

    model: nn.Module  # the bare model (no DDP / compile wrapper)
    ema: nn.Module | None  # the EMA copy, where ``run.ema`` is set
    step: int
    epoch: int
    valid: dict[str, Any]  # the last evaluation (``ema_``-prefixed values for the EMA copy)
    train_seconds: float  # time in training steps (this process; evaluation and checkpoints excluded)
    elapsed: float  # wall-clock seconds of the loop over all sessions of the run (the budget's clock)
    stopped_early: bool = False  # the time budget ran out before ``total_steps``
    sums: dict[str, float] = field(default_factory=dict)  # stats summed over this session (this process)
    log: MetricsLog | None = None  # the run's metrics log, for the recipe's final rows

    @property
    def best(self) -> nn.Module:
        """The model to export: the EMA copy where there is one."""
        return self.ema if self.ema is not None else self.model

    @property
    def best_valid(self) -> dict[str, Any]:
        """The last evaluation of :attr:`best` (the ``ema_`` values, unprefixed, where there is an EMA)."""
        if self.ema is None:
            return {k: v for k, v in self.valid.items() if not k.startswith("ema_")}
        return {k[4:]: v for k, v in self.valid.items() if k.startswith("ema_")}


def _fmt(values: dict[str, Any]) -> str:
    flat = " ".join(f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, (int, float)))
    rows = "".join(f"; {k}: " + " ".join(f"{a} {b:.4g}" for a, b in v.items()) for k, v in values.items()
                   if isinstance(v, dict))
    return flat + rows


def refuse_what_cannot_apply(run: RunConfig, dist: Dist) -> None:
    """A :class:`~zoo.train.errors.TrainError` naming the first ``run`` option that would have no effect,
    or no way to work, on this run's processes and device (``run.device``'s own checks are
    :func:`~zoo.train.distributed.distributed`'s; FSDP's and checkpointing's are raised where applied)."""
    device = dist.device
    if run.offload and device.type != "cuda":
        raise TrainError(f"run.offload: moves sharded state from GPU to CPU memory, but this run is on {device}; "
                         "set run.offload=false")
    if run.offload and not dist.enabled:
        raise TrainError("run.offload: offloads FSDP's shards, but one process trains the whole model unsharded; "
                         "run under torchrun with several processes, or set run.offload=false")
    if run.attention == "efficient" and device.type != "cuda":
        raise TrainError(f"run.attention: efficient is a CUDA kernel, but this run is on {device}; "
                         "use run.attention=default, math or flash")
    if run.attention == "flex" and device.type != "cuda":
        raise TrainError(f"run.attention: flex trains on CUDA only (torch's FlexAttention has no backward pass on "
                         f"{device.type}); use run.attention=blocked (or default)")
    if (run.precision == "bf16" and device.type == "cuda" and torch.cuda.is_available()
            and not torch.cuda.is_bf16_supported()):
        raise TrainError(f"run.precision: bf16, but {torch.cuda.get_device_name(device)} has no bf16; "
                         "use run.precision=fp32 (or auto)")


@contextlib.contextmanager
def _forced_kernel(run: RunConfig, device: torch.device) -> Iterator[None]:
    """``run.attention``'s kernel for the block; torch finding no such kernel for the model is a
    TrainError naming the field."""
    with attention_kernels(run.attention):
        try:
            yield
        except RuntimeError as e:
            if run.attention in ("default", "dense", "blocked", "flex") or not any(
                    t in str(e) for t in ("No available kernel", "No viable backend")):
                raise
            precision = resolve_precision(run.precision, device)
            raise TrainError(f"run.attention: torch has no {run.attention} attention kernel for this model on {device} "
                             f"in {precision} (dropout and masks count too); use run.attention=default or math") from None


def fit(model: nn.Module, task: Task, *, optim: OptimConfig, schedule: ScheduleConfig, run: RunConfig, dist: Dist,
        total_steps: int, resume: Path | None = None, config: Mapping[str, Any] | None = None,
        minutes: float | None = None, d_model: int | None = None, info: Mapping[str, Any] | None = None) -> Fitted:
    """Train ``model`` (already on ``dist.device``) on ``task`` for ``total_steps`` optimizer steps.

    ``optim``, ``schedule`` and ``run`` are the recipe's configs (zoo.train.config): the run writes
    its checkpoints, ``metrics.jsonl`` and ``curves.png`` to ``run.out_dir``; ``resume`` is a checkpoint
    to continue from (:func:`~zoo.train.checkpoint.resolve_resume`); ``config`` (the recipe's whole
    config as plain data) and the model's spec are stored in each checkpoint; ``minutes`` stops the run
    early when that much wall-clock has passed (a cooldown in ``schedule`` then follows the clock);
    ``d_model`` is for the inverse-sqrt schedule; ``info`` is logged once at step 0 of a fresh run.
    Raises :class:`~zoo.train.errors.TrainError` where the run cannot go on.
    """
    out_dir = Path(run.out_dir)
    device = dist.device
    world = dist.world_size
    budget = minutes * 60 if minutes else None
    clock = {"elapsed": 0.0}  # the same on every process, so a cooldown that follows the clock agrees
    fsdp = run.strategy == "fsdp"
    sharded = fsdp and dist.enabled  # one process has nothing to shard: it trains the plain model
    spec = model_spec(model)  # recorded in every checkpoint (None for a wrapper around a zoo model)
    refuse_what_cannot_apply(run, dist)
    if run.threads:
        torch.set_num_threads(run.threads)
    try:
        if run.activation_checkpointing:
            set_activation_checkpointing(model)
        ema = EMA(model, run.ema) if run.ema else None  # copied before sharding: FSDP modules cannot be copied
        if sharded:
            apply_fsdp(model, dist, precision=resolve_precision(run.precision, device), offload=run.offload)
            if ema is not None:
                apply_fsdp(ema.module, dist, offload=run.offload)  # fp32, sharded like the model's master weights
        optimizer = build_optimizer(model, optim)
        scheduler = build_scheduler(optimizer, schedule, total_steps, d_model=d_model, done=None if budget is None else
                                    (lambda s: max(s / total_steps, clock["elapsed"] / budget)))
    except ValueError as e:  # settings this model or machine cannot take: the message names them
        raise TrainError(str(e)) from None
    router = RouterTraining.of(model)  # None for a model without MoE layers
    step, epoch, pos, elapsed_before = 0, 0, 0, 0.0
    window: dict[str, float] = {}
    valid: dict[str, Any] = {}
    if resume is not None:
        ckpt = restore_checkpoint(Path(resume), model=model, optimizer=optimizer, ema=ema, dist=dist, config=config,
                                  sharded=sharded)
        scheduler.load_state_dict(ckpt["scheduler"])
        st = ckpt["state"]
        step, epoch, pos = int(ckpt["step"]), int(st["epoch"]), int(st["pos"])
        task.load_state_dict(st.get("task", {}))
        then = (int(st.get("world", world)), int(st.get("grad_accum", run.grad_accum)))
        at = task.resume_at(epoch, pos, *then, (world, run.grad_accum)) if pos else pos
        if then != (world, run.grad_accum):  # what a step covers changed: the task placed the epoch's position
            accum = f" x grad_accum {then[1]}" if then[1] != run.grad_accum else ""
            dist.print(f"resuming a run of {then[0]} process(es){accum} on {world}{f' x {run.grad_accum}' if accum else ''}: "
                       f"step {step}, epoch {epoch} continues at its step {at} (from its step {pos})")
        pos = at
        elapsed_before, window, valid = float(st.get("elapsed", 0.0)), dict(st.get("window", {})), dict(st.get("valid", {}))
        if router is not None:
            router.load_state_dict(st.get("router", {}))
        ranks = st.get("rng_ranks")  # every process's generators: their draws differ with their batches
        restore_rng(ranks[dist.rank] if ranks is not None and len(ranks) == world else ckpt)
        if "kernels" in st and not choose.adopt(st["kernels"]):  # the CPU kernels the run used, on its machine
            dist.print("the checkpoint was written on another machine: CPU kernel choices are this machine's own")
        dist.print(f"resumed from {resume} at step {step} (epoch {epoch}, step {pos} of it)")
    log = MetricsLog(out_dir / "metrics.jsonl", enabled=dist.is_main, resume_step=step if resume else None)
    if info and resume is None:
        log.write(step=0, split="info", **info)
    train_model = torch.compile(model) if run.compile else model
    if not sharded:
        train_model = dist.wrap(train_model)
    per_epoch = task.steps(0)
    if per_epoch < 1:
        raise TrainError(f"{task.name}: an epoch makes no full optimizer step on {world} process(es) "
                         f"(grad_accum {run.grad_accum}); use more data or a smaller batch")
    eval_every = run.eval_every or per_epoch
    ckpt_every = run.checkpoint_every or per_epoch
    progress = Progress(total_steps, initial=step, desc=task.name, enabled=dist.is_main, every=run.log_every,
                        force_bar=None if run.progress else False)
    synced = [model] + ([ema.module] if ema is not None else [])  # BatchNorm statistics: rank 0's everywhere
    train_seconds = 0.0
    totals: dict[str, float] = {}

    def evaluate() -> dict[str, Any]:
        dist.sync_buffers(*synced)
        values: dict[str, Any] = {}
        with full_parameters(model, ema.module if ema is not None else None):
            for prefix, m in [("", model)] + ([("ema_", ema.module)] if ema is not None else []):
                m.eval()
                with torch.no_grad(), autocast(device, run.precision):
                    got = task.evaluate(m)
                m.train()
                values.update({prefix + k: v for k, v in got.items()})
        for k, v in values.items():
            if isinstance(v, dict):
                log.write(step=step, split=f"valid_{k}", **v)
        log.write(step=step, split="valid", **{"epoch": epoch, **{k: v for k, v in values.items() if not isinstance(v, dict)}})
        progress.write(f"{task.name} step {step}: valid {_fmt(values)}")
        return values

    def checkpoint(at_end: bool) -> None:
        dist.sync_buffers(*synced)
        state = {"epoch": epoch + 1 if at_end else epoch, "pos": 0 if at_end else pos, "elapsed": clock["elapsed"],
                 "window": window, "valid": valid, "task": task.state_dict(), "world": world,
                 "grad_accum": run.grad_accum,
                 "kernels": choose.record()}
        if router is not None:
            state["router"] = router.state_dict()
        if dist.enabled:
            state["rng_ranks"] = dist.gather_object(rng_state())
        if fsdp:
            save_sharded_checkpoint(out_dir / checkpoint_name(step, sharded=True), model=model, optimizer=optimizer,
                                    scheduler=scheduler, step=step, state=state, config=config, ema=ema, dist=dist,
                                    spec=spec)
            if dist.is_main:
                prune_checkpoints(out_dir, run.keep_checkpoints)
        elif dist.is_main:
            save_checkpoint(out_dir / checkpoint_name(step), model=model, optimizer=optimizer, scheduler=scheduler,
                            step=step, state=state, config=config, ema=ema, spec=spec)
            prune_checkpoints(out_dir, run.keep_checkpoints)
        dist.barrier()

    t_loop = time.perf_counter()
    clock["elapsed"] = elapsed_before
    stopped = False
    model.train()
    with _forced_kernel(run, device):
        while step < total_steps and not stopped:
            n_steps = task.steps(epoch)
            groups = task.epoch(epoch, pos)
            while pos < n_steps and step < total_steps:
                t_step = time.perf_counter()
                group = list(next(groups))
                mine = float(sum(task.count(b) for b in group))  # this process's units: the window sums them
                total, batches = dist.all_reduce(torch.tensor([mine, len(group)], dtype=torch.float64)).tolist()
                stats = {"loss": 0.0, "count": mine}
                for j, batch in enumerate(group):
                    if sharded:  # FSDP's no_sync: reduce-scatter the gradients after the last micro-batch only
                        model.set_requires_gradient_sync(j == len(group) - 1)
                    sync = not dist.enabled or j == len(group) - 1 or not hasattr(train_model, "no_sync")
                    with contextlib.nullcontext() if sync else train_model.no_sync():
                        with autocast(device, run.precision):
                            loss, extra = task.loss(train_model, batch, step)
                        scaled = loss * (world / total)
                        if router is not None:  # before backward: checkpointing's recomputation must not count
                            scaled = scaled + router.micro_batch() * (world / batches)
                        scaled.backward()
                    stats["loss"] += float(loss.detach())
                    for k, v in extra.items():
                        stats[k] = stats.get(k, 0.0) + float(v)
                if optim.clip_grad:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip_grad)
                optimizer.step()
                if router is not None:
                    router.after_step(dist)
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                if ema is not None:
                    ema.update(model)
                step, pos = step + 1, pos + 1
                seconds = time.perf_counter() - t_step
                train_seconds += seconds
                stats["seconds"] = seconds
                for k, v in stats.items():
                    window[k] = window.get(k, 0.0) + v
                    totals[k] = totals.get(k, 0.0) + v
                lr = max(scheduler.get_last_lr())  # the top layer's, where optim.layer_decay lowers the others
                progress.update(1, loss=stats["loss"] / max(stats["count"], 1e-9), lr=lr)
                if budget is not None:
                    elapsed = torch.tensor([elapsed_before + time.perf_counter() - t_loop], dtype=torch.float64)
                    clock["elapsed"] = float(dist.all_reduce(elapsed, "max")[0])
                    stopped = clock["elapsed"] >= budget and step < total_steps
                else:
                    clock["elapsed"] = elapsed_before + time.perf_counter() - t_loop
                final = step == total_steps or stopped
                if step % run.log_every == 0 or final:
                    secs = window.pop("seconds", 0.0)
                    keys = sorted(window)
                    summed = dist.all_reduce(torch.tensor([window[k] for k in keys], dtype=torch.float64))
                    sums = dict(zip(keys, summed.tolist()))
                    loss_sum, count = sums.pop("loss"), sums.pop("count")
                    values = {"loss": loss_sum / max(count, 1e-9), "lr": lr, "epoch": epoch}
                    routed, loads = router.log_values(dist) if router is not None else ({}, None)
                    log.write(step=step, split="train", **{**values, **routed, **task.train_values(sums, secs)})
                    if loads is not None:
                        log.write(step=step, split=LOAD_SPLIT, **loads)
                    window = {}
                if step % eval_every == 0 or final:
                    valid = evaluate()
                if step % ckpt_every == 0 or final:
                    checkpoint(at_end=pos >= n_steps)
                if stopped:
                    progress.write(f"{task.name}: {minutes} minutes reached at step {step} of {total_steps}: stopping")
                    break
            if pos >= n_steps:
                epoch, pos = epoch + 1, 0
            if hasattr(groups, "close"):
                groups.close()
    progress.close()
    if not valid:  # resumed from the final checkpoint of a run saved before its evaluation
        valid = evaluate()
    if run.plot and dist.is_main and (out_dir / "metrics.jsonl").exists():
        plot_metrics(out_dir / "metrics.jsonl", out_dir / "curves.png", task.panels, **task.plot_options)
        if router is not None:
            plot_expert_load(out_dir / "metrics.jsonl", out_dir / "experts.png")
    final_model, final_ema = unwrap(model), ema.module if ema is not None else None
    if sharded:  # whole copies on every process, for the recipe's test, decoding and export
        final_model = gathered(model)
        final_ema = gathered(ema.module) if ema is not None else None
    return Fitted(model=final_model, ema=final_ema, step=step, epoch=epoch, valid=valid,
                  train_seconds=train_seconds, elapsed=clock["elapsed"], stopped_early=stopped, sums=totals, log=log)
