"""The training loop the text recipes share (GPT-style causal LM, BERT-style masked LM, and
sequence-classification fine-tuning), built on the rest of ``zoo.train``.

    task = Task(batches=lambda epoch: [...], loss=lambda model, batch, step: (loss, {"tokens": n}),
                evaluate=lambda model: {"loss": 2.1, "ppl": 8.2}, panels=[("loss", ["train/loss", "valid/loss"])])
    model = fit(cfg, dist, model, task, total_steps=2000, resume=None)

``batches(epoch)`` returns the epoch's micro-batches in the same order on every rank (the loop takes
every ``world_size``-th one for this rank); it must depend on the epoch alone, so a resumed run sees
the same data. ``loss`` may draw random numbers (dropout, masking) from the global torch generator or
from a generator seeded with the step: both continue exactly after ``--resume``. The loop owns
AdamW, the schedule, bf16 autocast, gradient accumulation and clipping, DDP, the metrics log and its
plot, progress, periodic atomic checkpoints and exact resume.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from pydantic import Field, PositiveFloat, PositiveInt
from torch import Tensor, nn

from zoo.train.checkpoint import (
    checkpoint_name,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
    unwrap,
)
from zoo.train.config import Config
from zoo.train.distributed import Dist
from zoo.train.metrics import MetricsLog, Progress, plot_metrics
from zoo.train.optim import EMA, autocast, build_optimizer, build_scheduler
from zoo.train.runtime import attention_kernels

__all__ = ["Task", "fit", "resolve_resume", "TextDataConfig", "load_text", "get_tokenizer"]


@dataclass
class Task:
    """What to train on and how to score it; see the module docstring."""

    batches: Callable[[int], Sequence[Any]]
    loss: Callable[[nn.Module, Any, int], tuple[Tensor, dict[str, float]]]
    evaluate: Callable[[nn.Module], dict[str, float]]
    panels: list[tuple[str, list[str]]] = field(default_factory=lambda: [("loss", ["train/loss", "valid/loss"])])
    name: str = "train"
    last: dict[str, float] = field(default_factory=dict)  # the latest evaluation's values


def resolve_resume(resume: str | None, out_dir: Path, *, required: bool = True) -> Path | None:
    """The checkpoint ``--resume`` means: ``latest`` = the newest in ``out_dir``, else a path."""
    if resume is None:
        return None
    if resume == "latest":
        found = latest_checkpoint(out_dir)
        if found is None and required:
            raise SystemExit(f"--resume: no checkpoint in {out_dir}; start without --resume")
        return found
    return Path(resume)


def fit(cfg: Any, dist: Dist, model: nn.Module, task: Task, *, total_steps: int, resume: Path | None = None,
        out_dir: Path | None = None, config: dict | None = None) -> nn.Module:
    """Train ``model`` (already on ``dist.device``) for ``total_steps`` optimizer steps with
    ``cfg.optim``, ``cfg.schedule`` and ``cfg.run``; returns the bare model (the EMA copy where
    ``run.ema`` is set). ``resume``: a checkpoint to continue from."""
    run = cfg.run
    out_dir = Path(out_dir or run.out_dir)
    accum = run.grad_accum
    device = dist.device
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.schedule, total_steps)
    ema = EMA(model, run.ema) if run.ema else None
    step, epoch, pos = 0, 0, 0
    if resume is not None:
        ckpt = load_checkpoint(resume, map_location=device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        if ema is not None and "ema" in ckpt:
            ema.load_state_dict(ckpt["ema"])
        restore_rng(ckpt)
        step, epoch, pos = ckpt["step"], ckpt["state"]["epoch"], ckpt["state"]["pos"]
        dist.print(f"resumed from {resume} at step {step}")
    log = MetricsLog(out_dir / "metrics.jsonl", enabled=dist.is_main, resume_step=step if resume else None)
    train_model = torch.compile(model) if run.compile else model
    train_model = dist.wrap(train_model)
    first = task.batches(0)
    steps_per_epoch = len(first) // dist.world_size // accum
    if steps_per_epoch < 1:
        raise SystemExit(f"{task.name}: {len(first)} batches are too few for {dist.world_size} process(es) x "
                         f"grad_accum {accum}; use more data or a smaller batch")
    eval_every = run.eval_every or steps_per_epoch
    ckpt_every = run.checkpoint_every or steps_per_epoch
    progress = Progress(total_steps, initial=step, desc=task.name, enabled=dist.is_main, every=run.log_every)
    window = {"loss": 0.0, "n": 0, "tokens": 0.0, "t": time.perf_counter()}

    def evaluate() -> None:
        scored = ema.module if ema is not None else model
        scored.eval()
        with torch.no_grad(), autocast(device, run.precision):
            values = task.evaluate(scored)
        scored.train()
        task.last = dict(values)
        log.write(step=step, split="valid", **values)
        progress.write(f"{task.name} step {step} valid " + " ".join(f"{k} {v:.4g}" for k, v in values.items()))

    def checkpoint() -> None:
        if dist.is_main:
            save_checkpoint(out_dir / checkpoint_name(step), model=model, optimizer=optimizer, scheduler=scheduler,
                            step=step, state={"epoch": epoch, "pos": pos}, config=config, ema=ema)
            prune_checkpoints(out_dir, run.keep_checkpoints)
        dist.barrier()

    model.train()
    with attention_kernels(run.attention):
        while step < total_steps:
            batches = (first if epoch == 0 else task.batches(epoch))[dist.rank :: dist.world_size]
            while pos < steps_per_epoch and step < total_steps:
                micro = batches[pos * accum : (pos + 1) * accum]
                stats: dict[str, float] = {}
                total_loss = 0.0
                for j, batch in enumerate(micro):
                    sync = dist.enabled and j < accum - 1 and hasattr(train_model, "no_sync")
                    with train_model.no_sync() if sync else contextlib.nullcontext():
                        with autocast(device, run.precision):
                            loss, extra = task.loss(train_model, batch, step)
                        (loss / accum).backward()
                    total_loss += float(loss.detach()) / accum
                    for k, v in extra.items():
                        stats[k] = stats.get(k, 0.0) + float(v)
                if cfg.optim.clip_grad:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip_grad)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                if ema is not None:
                    ema.update(model)
                step, pos = step + 1, pos + 1
                window["loss"] += total_loss
                window["n"] += 1
                window["tokens"] += stats.get("tokens", 0.0)
                progress.update(1, loss=total_loss, lr=scheduler.get_last_lr()[0])
                if step % run.log_every == 0 or step == total_steps:
                    elapsed = time.perf_counter() - window["t"]
                    loss_t = dist.all_reduce(torch.tensor([window["loss"] / window["n"]], device=device)) / dist.world_size
                    tok_t = dist.all_reduce(torch.tensor([window["tokens"]], device=device))
                    values = {"loss": float(loss_t), "lr": scheduler.get_last_lr()[0], "epoch": epoch}
                    if window["tokens"]:
                        values["tokens_per_s"] = float(tok_t) / max(elapsed, 1e-9)
                    log.write(step=step, split="train", **values)
                    window.update(loss=0.0, n=0, tokens=0.0, t=time.perf_counter())
                if step % eval_every == 0 or step == total_steps:
                    evaluate()
                if step % ckpt_every == 0 or step == total_steps:
                    checkpoint()
            if pos >= steps_per_epoch:
                epoch, pos = epoch + 1, 0
    progress.close()
    if run.plot and dist.is_main and (out_dir / "metrics.jsonl").exists():
        plot_metrics(out_dir / "metrics.jsonl", out_dir / "curves.png", task.panels)
    return unwrap(ema.module if ema is not None else model)


# ------------------------------------------------------------------------ text data for recipes

class TextDataConfig(Config):
    """Where the text comes from and how it is tokenized (shared by recipes/lm.py and mlm.py)."""

    text: list[Path] | None = Field(None, description="plain-text files or folders of *.txt, one example a line; null: WordNet glosses")
    wordnet_dir: Path = Field(Path("/usr/share/wordnet"), description="Debian's wordnet-base data.{noun,verb,adj,adv}")
    tokenizer: Path | None = Field(None, description="an existing tokenizer.json (with <pad> <eos> <cls> <mask>) instead of training BPE")
    vocab_size: PositiveInt = Field(8192, description="byte-level BPE vocabulary trained on the training split")
    min_frequency: PositiveInt = 2
    valid_fraction: PositiveFloat = Field(0.02, lt=1.0, description="texts held out for validation")
    max_valid: PositiveInt | None = Field(5000, description="at most this many validation texts")
    split_seed: int = 1234
    limit: PositiveInt | None = Field(None, description="use only the first N texts (quick runs, tests)")


def load_text(cfg: TextDataConfig):
    """(train, valid, source description) per ``cfg``."""
    from zoo.data import text as T

    if cfg.text:
        data, source = T.read_text_files(cfg.text), ", ".join(map(str, cfg.text))
    else:
        data, source = T.read_wordnet(cfg.wordnet_dir), f"WordNet glosses ({cfg.wordnet_dir})"
    if cfg.limit:
        data = T.Texts(data.texts[: cfg.limit], data.labels[: cfg.limit])
    train, valid = T.split_texts(data, valid_fraction=cfg.valid_fraction, seed=cfg.split_seed, max_valid=cfg.max_valid)
    return train, valid, source


def get_tokenizer(cfg: TextDataConfig, train_texts: Sequence[str], out_dir: Path, dist: Dist, *, resume: bool):
    """The given tokenizer.json; on resume the run's own; else a byte-level BPE trained on the
    training texts by rank 0 and written to ``out_dir/tokenizer.json``. Returns (tokenizer, how)."""
    from zoo.data import text as T

    if cfg.tokenizer is not None:
        return T.load_bpe(cfg.tokenizer), f"from {cfg.tokenizer}"
    path = out_dir / "tokenizer.json"
    if resume and path.is_file():
        return T.load_bpe(path), f"from {path}"
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        tok = T.train_bpe(train_texts, cfg.vocab_size, min_frequency=cfg.min_frequency)
        tok.save(str(path))
    dist.barrier()
    return T.load_bpe(path), "trained on the training split"
