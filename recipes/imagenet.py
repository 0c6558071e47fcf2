#!/usr/bin/env python
"""Train a zoo Vision Transformer on image classification.

    python recipes/imagenet.py                                   # embedded default: Fashion-MNIST (expected ~10 min on 2 CPU cores)
    python recipes/imagenet.py data.path=/data/imagenet model=vit-small-16 --config imagenet-vit-s16.yaml
    torchrun --nproc_per_node 8 recipes/imagenet.py data.path=/data/imagenet ...   # DDP, same script
    python recipes/imagenet.py --resume                          # continue from the newest checkpoint

Data: with ``data.path`` an ImageNet-layout folder (``train/<class>/*``, ``val/<class>/*``) read by
torchvision's ImageFolder through timm's transforms (RandomResizedCrop, flip, RandAugment, random
erasing; Mixup/CutMix), unreadable images skipped and counted. Without it, Fashion-MNIST from the
Debian package ``dataset-fashion-mnist``, held as tensors and augmented in batch (random crop with
padding, flip).

Writes to ``run.out_dir``: ``metrics.jsonl``, ``curves.png``, ``ckpt-<step>.pt`` (atomic; ``--resume``
continues exactly: data position, RNG, optimizer, schedule, EMA), ``model.safetensors`` (and
``model-ema.safetensors``) via ``zoo.save``, re-loaded with ``zoo.load`` and re-evaluated, and
``results.json``. See docs/recipes/imagenet.md.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt
from torch import Tensor, nn

import zoo
from zoo.data.images import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    DatasetMissing,
    SafeImageFolder,
    augment_batch,
    collate_skipping,
    image_transforms,
    load_fashion_mnist,
    normalize,
)
from zoo.train import (
    EMA,
    CheckpointError,
    Config,
    Dist,
    MetricsLog,
    OptimConfig,
    Progress,
    RunConfig,
    ScheduleConfig,
    attention_kernels,
    autocast,
    build_optimizer,
    build_scheduler,
    checkpoint_name,
    distributed,
    latest_checkpoint,
    load_checkpoint,
    parse_args,
    plot_metrics,
    prune_checkpoints,
    resolve_precision,
    restore_rng,
    save_checkpoint,
    seed_everything,
    tune_malloc,
    unwrap,
)

DEFAULT_CONFIG = Path(__file__).with_suffix(".yaml")


# ------------------------------------------------------------------------------------- config
class DataConfig(Config):
    path: Path | None = Field(None, description="ImageNet-layout folder (train/, val/); null: Fashion-MNIST")
    fashion_mnist_dir: Path | None = Field(None, description="Fashion-MNIST files; default: the Debian package's folder")
    cache_dir: Path | None = Field(None, description="where the decoded Fashion-MNIST tensors are cached")
    batch_size: PositiveInt = Field(256, description="global batch, split over processes")
    eval_batch_size: PositiveInt = 1000
    workers: NonNegativeInt = Field(8, description="DataLoader workers per process (image folders)")
    train_limit: PositiveInt | None = Field(None, description="use only the first N training images")
    valid_limit: PositiveInt | None = Field(None, description="evaluate on the first N validation images")
    # the tensor default's augmentation
    crop_padding: NonNegativeInt = 0
    flip: bool = True
    # image folders: timm's pipeline
    image_size: PositiveInt | None = Field(None, description="crop size; default: the model's image_size")
    auto_augment: str | None = "rand-m9-mstd0.5-inc1"
    re_prob: NonNegativeFloat = 0.25
    interpolation: str = "bicubic"
    crop_pct: float = Field(0.875, gt=0.0, le=1.0)
    mixup: NonNegativeFloat = Field(0.0, description="Mixup alpha (0: off); DeiT 0.8")
    cutmix: NonNegativeFloat = Field(0.0, description="CutMix alpha (0: off); DeiT 1.0")


class TrainConfig(Config):
    epochs: PositiveInt = 8
    max_steps: PositiveInt | None = Field(None, description="stop after this many optimizer steps (schedule included)")
    warmup_epochs: NonNegativeFloat | None = Field(None, description="warmup in epochs; overrides schedule.warmup")
    label_smoothing: NonNegativeFloat = 0.1


class RecipeConfig(Config):
    model: str = "vitc-fashion-mnist-7"
    model_overrides: list[str] = []
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    optim: OptimConfig = OptimConfig(lr=1e-3)
    schedule: ScheduleConfig = ScheduleConfig(warmup=200, min_lr_ratio=0.01)
    run: RunConfig = RunConfig(out_dir=Path("runs/imagenet"), ema=0.995)


# --------------------------------------------------------------------------------------- data
class TensorImages:
    """Fashion-MNIST as uint8 tensors: shuffled by a DistributedSampler, augmented per batch with
    a generator seeded by (seed, epoch, batch, rank), so any batch can be replayed exactly."""

    def __init__(self, cfg: RecipeConfig, dist: Dist, batch: int) -> None:
        data = load_fashion_mnist(cfg.data.fashion_mnist_dir, cfg.data.cache_dir)
        lim, vlim = cfg.data.train_limit, cfg.data.valid_limit
        self.train_x, self.train_y = data["train_x"][:lim], data["train_y"][:lim]
        self.valid_x, self.valid_y = data["test_x"][:vlim], data["test_y"][:vlim]
        self.num_classes, self.in_channels, self.image_size = 10, 1, 28
        self.cfg, self.dist, self.batch = cfg, dist, batch
        self.sampler = dist.sampler(range(len(self.train_y)), shuffle=True, seed=cfg.run.seed, drop_last=True)
        self.batches_per_epoch = len(self.sampler) // batch
        self.n_train, self.n_valid = len(self.train_y), len(self.valid_y)

    def train_batches(self, epoch: int, start: int) -> Iterator[tuple[Tensor, Tensor, int]]:
        self.sampler.set_epoch(epoch)
        order = torch.tensor(list(self.sampler), dtype=torch.long)
        d, seed = self.cfg.data, self.cfg.run.seed
        for b in range(start, self.batches_per_epoch):
            idx = order[b * self.batch:(b + 1) * self.batch]
            g = torch.Generator().manual_seed(
                (seed * 1_000_003 + (epoch * self.batches_per_epoch + b) * self.dist.world_size + self.dist.rank) % 2**63
            )
            x = augment_batch(self.train_x[idx], generator=g, padding=d.crop_padding, flip=d.flip)
            yield normalize(x, FASHION_MNIST_MEAN, FASHION_MNIST_STD), self.train_y[idx], 0

    def valid_batches(self) -> Iterator[tuple[Tensor, Tensor, int]]:
        shard = torch.tensor(list(self.dist.shard(self.n_valid)), dtype=torch.long)
        for i in range(0, len(shard), self.cfg.data.eval_batch_size):
            idx = shard[i:i + self.cfg.data.eval_batch_size]
            yield normalize(self.valid_x[idx], FASHION_MNIST_MEAN, FASHION_MNIST_STD), self.valid_y[idx], 0


class _Skip(torch.utils.data.Sampler):
    """The indices of ``sampler`` after the first ``start`` (resuming inside an epoch)."""

    def __init__(self, sampler: torch.utils.data.Sampler, start: int) -> None:
        self.sampler, self.start = sampler, start

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.start, None)

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.start)


class FolderImages:
    """An ImageNet-layout folder through timm's transforms and DataLoader workers."""

    def __init__(self, cfg: RecipeConfig, dist: Dist, batch: int, image_size: int) -> None:
        d = cfg.data
        root = Path(d.path)
        for split in ("train", "val"):
            if not (root / split).is_dir():
                raise DatasetMissing(f"data.path {str(root)!r} has no {split}/ folder; expected {root}/train/<class>/*.JPEG and {root}/val/<class>/*.JPEG")
        train_tf = image_transforms(image_size, training=True, auto_augment=d.auto_augment, re_prob=d.re_prob,
                                    interpolation=d.interpolation)
        eval_tf = image_transforms(image_size, training=False, interpolation=d.interpolation, crop_pct=d.crop_pct)
        self.train_set = SafeImageFolder(str(root / "train"), transform=train_tf)
        self.valid_set = SafeImageFolder(str(root / "val"), transform=eval_tf)
        if self.valid_set.classes != self.train_set.classes:
            raise DatasetMissing(f"{root}/val has classes that differ from {root}/train ({len(self.valid_set.classes)} vs {len(self.train_set.classes)})")
        train: Any = self.train_set
        if d.train_limit:
            train = torch.utils.data.Subset(self.train_set, range(min(d.train_limit, len(self.train_set))))
        self.train = train
        n_valid = min(d.valid_limit or len(self.valid_set), len(self.valid_set))
        self.num_classes, self.in_channels, self.image_size = len(self.train_set.classes), 3, image_size
        self.cfg, self.dist, self.batch = cfg, dist, batch
        self.sampler = dist.sampler(train, shuffle=True, seed=cfg.run.seed, drop_last=True)
        self.batches_per_epoch = len(self.sampler) // batch
        self.n_train, self.n_valid = len(train), n_valid
        self.pin = dist.device.type == "cuda"

    def _loader(self, data: Any, sampler: Any, batch: int, seed: int) -> torch.utils.data.DataLoader:
        w = self.cfg.data.workers
        return torch.utils.data.DataLoader(
            data, batch_size=batch, sampler=sampler, num_workers=w, pin_memory=self.pin, drop_last=False,
            collate_fn=collate_skipping, persistent_workers=False, prefetch_factor=4 if w else None,
            generator=torch.Generator().manual_seed(seed),
        )

    def train_batches(self, epoch: int, start: int) -> Iterator[tuple[Tensor, Tensor, int]]:
        self.sampler.set_epoch(epoch)
        seed = self.cfg.run.seed * 1_000_003 + epoch * self.dist.world_size + self.dist.rank
        loader = self._loader(self.train, _Skip(self.sampler, start * self.batch), self.batch, seed)
        yield from itertools.islice(loader, self.batches_per_epoch - start)

    def valid_batches(self) -> Iterator[tuple[Tensor, Tensor, int]]:
        subset = torch.utils.data.Subset(self.valid_set, list(self.dist.shard(self.n_valid)))
        yield from self._loader(subset, None, self.cfg.data.eval_batch_size, 0)


# --------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(model: nn.Module, data: Any, dist: Dist, precision: str) -> dict[str, float]:
    """Loss, top-1 and top-5 (percent) over the whole validation split, summed over processes."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(5, dtype=torch.float64)  # loss sum, top-1, top-5, images, skipped
    for x, y, skipped in data.valid_batches():
        totals[4] += skipped
        if len(y) == 0:
            continue
        x, y = x.to(dist.device, non_blocking=True), y.to(dist.device, non_blocking=True)
        with autocast(dist.device, precision):
            logits = model(x)
        logits = logits.float()
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        totals[0] += F.cross_entropy(logits, y, reduction="sum").item()
        totals[1] += (top[:, 0] == y).sum().item()
        totals[2] += (top == y[:, None]).any(dim=-1).sum().item()
        totals[3] += len(y)
    dist.all_reduce(totals)
    model.train(was_training)
    n = max(totals[3].item(), 1.0)
    return {"loss": totals[0].item() / n, "top1": 100 * totals[1].item() / n, "top5": 100 * totals[2].item() / n,
            "images": int(totals[3].item()), "skipped": int(totals[4].item())}


def _loss_fn(cfg: RecipeConfig, mixup: Any):
    if mixup is not None:
        from timm.loss import SoftTargetCrossEntropy

        return SoftTargetCrossEntropy()
    return nn.CrossEntropyLoss(label_smoothing=cfg.train.label_smoothing)


# --------------------------------------------------------------------------------------- main
def train(cfg: RecipeConfig, resume: str | None, dist: Dist) -> dict[str, Any]:
    wall_start = time.perf_counter()
    cfg.run.precision = resolve_precision(cfg.run.precision, dist.device)
    out = Path(cfg.run.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    if cfg.data.batch_size % (dist.world_size * cfg.run.grad_accum):
        raise SystemExit(f"data.batch_size ({cfg.data.batch_size}) must divide by processes x run.grad_accum "
                         f"({dist.world_size} x {cfg.run.grad_accum})")
    micro = cfg.data.batch_size // (dist.world_size * cfg.run.grad_accum)
    seed_everything(cfg.run.seed)

    # data, then the model it implies
    spec = zoo.load_spec(cfg.model, cfg.model_overrides)
    if cfg.data.path is None:
        data: Any = TensorImages(cfg, dist, micro)
    else:
        data = FolderImages(cfg, dist, micro, cfg.data.image_size or spec.image_size)
    fit = {"num_classes": data.num_classes, "in_channels": data.in_channels, "image_size": data.image_size}
    fixes = [f"{k}={v}" for k, v in fit.items() if getattr(spec, k) != v]
    if fixes:
        spec = zoo.load_spec(cfg.model, list(cfg.model_overrides) + fixes)
    model = zoo.build(spec, seed=cfg.run.seed).to(dist.device)
    accum = cfg.run.grad_accum
    steps_per_epoch = data.batches_per_epoch // accum
    if steps_per_epoch == 0:
        raise SystemExit(f"{data.n_train} training images make no full batch of {cfg.data.batch_size}; lower data.batch_size")
    total_steps = steps_per_epoch * cfg.train.epochs
    if cfg.train.max_steps:
        total_steps = min(total_steps, cfg.train.max_steps)
    schedule = cfg.schedule
    if cfg.train.warmup_epochs is not None:
        schedule = schedule.model_copy(update={"warmup": round(cfg.train.warmup_epochs * steps_per_epoch)})

    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, schedule, total_steps)
    ema = EMA(model, cfg.run.ema) if cfg.run.ema else None
    mixup = None
    if cfg.data.mixup > 0 or cfg.data.cutmix > 0:
        from timm.data import Mixup

        mixup = Mixup(mixup_alpha=cfg.data.mixup, cutmix_alpha=cfg.data.cutmix,
                      label_smoothing=cfg.train.label_smoothing, num_classes=data.num_classes)
    criterion = _loss_fn(cfg, mixup)

    # resume
    start_step, state = 0, {"epoch": 0, "batch": 0}
    if resume is not None:
        path = latest_checkpoint(out) if resume == "latest" else Path(resume)
        if path is None:
            raise SystemExit(f"--resume: no checkpoint in {out}")
        ckpt = load_checkpoint(path)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        if ema is not None:
            if "ema" not in ckpt:
                raise CheckpointError(f"{path} has no EMA weights; resume with run.ema=null")
            ema.load_state_dict(ckpt["ema"])
        restore_rng(ckpt)
        start_step, state = int(ckpt["step"]), dict(ckpt["state"])
        dist.print(f"resuming from {path} at step {start_step} (epoch {state['epoch']}, batch {state['batch']})")

    n_params = zoo.count_parameters(model)
    dist.print(f"{spec.name or 'vit'}: {n_params / 1e6:.2f}M parameters, {spec.n_tokens} tokens | "
               f"{data.n_train} train / {data.n_valid} valid images, {data.num_classes} classes | "
               f"{dist.world_size} process(es) on {dist.device}, batch {cfg.data.batch_size}, "
               f"{steps_per_epoch} steps/epoch, {total_steps} steps, {cfg.run.precision}")

    train_model: nn.Module = dist.wrap(model)
    if cfg.run.compile:
        train_model = torch.compile(train_model)
    log = MetricsLog(out / "metrics.jsonl", enabled=dist.is_main, resume_step=start_step if resume else None)
    progress = Progress(total_steps, initial=start_step, desc="train", enabled=dist.is_main, every=cfg.run.log_every,
                        force_bar=None if cfg.run.progress else False)
    eval_every = cfg.run.eval_every or steps_per_epoch
    ckpt_every = cfg.run.checkpoint_every or steps_per_epoch
    # running sums since the last log line (saved in checkpoints so a resumed log reads the same)
    acc = {k: float(state.get(k, 0.0)) for k in ("loss_sum", "correct", "seen", "skipped", "train_time")}
    images_seen = int(state.get("images_seen", 0))
    skipped_total = int(state.get("skipped_total", 0))
    last_valid: dict[str, Any] = dict(state.get("last_valid", {}))
    step, epoch, k = start_step, int(state["epoch"]), int(state["batch"])
    interval_start, interval_images = time.perf_counter(), 0

    synced = [model] + ([ema.module] if ema is not None else [])  # BatchNorm statistics: rank 0's everywhere

    def run_eval() -> dict[str, Any]:
        dist.sync_buffers(*synced)
        rec = {f"{n}": v for n, v in evaluate(model, data, dist, cfg.run.precision).items()}
        if ema is not None:
            rec.update({f"ema_{n}": v for n, v in evaluate(ema.module, data, dist, cfg.run.precision).items()
                        if n in ("loss", "top1", "top5")})
        rec["epoch"] = round(step / steps_per_epoch, 3)
        log.write(step=step, split="valid", **rec)
        msg = f"step {step}: valid loss {rec['loss']:.4f} top-1 {rec['top1']:.2f}% top-5 {rec['top5']:.2f}%"
        if ema is not None:
            msg += f" | EMA top-1 {rec['ema_top1']:.2f}%"
        progress.write(msg)
        return rec

    def checkpoint() -> None:
        dist.sync_buffers(*synced)
        st = {"epoch": epoch, "batch": k, "images_seen": images_seen, "skipped_total": skipped_total,
              "last_valid": last_valid, **acc}
        if dist.is_main:
            save_checkpoint(out / checkpoint_name(step), model=model, optimizer=optimizer, scheduler=scheduler,
                            step=step, state=st, config=cfg.model_dump(mode="json"), ema=ema)
            prune_checkpoints(out, cfg.run.keep_checkpoints)
        dist.barrier()

    with attention_kernels(cfg.run.attention):
        train_model.train()
        while step < total_steps:
            batches = data.train_batches(epoch, k * accum)
            epoch_done = False
            while not epoch_done and step < total_steps:
                t0 = time.perf_counter()
                for m in range(accum):
                    x, y, skipped = next(batches)
                    acc["skipped"] += skipped
                    skipped_total += skipped
                    x, y = x.to(dist.device, non_blocking=True), y.to(dist.device, non_blocking=True)
                    target = y
                    if mixup is not None and len(y) > 1:
                        if len(y) % 2:
                            x, y = x[:-1], y[:-1]
                        import numpy as np

                        np.random.seed((cfg.run.seed * 7919 + step * accum + m) * dist.world_size + dist.rank)
                        x, target = mixup(x, y)
                    sync = dist.enabled and m < accum - 1
                    with (train_model.no_sync() if sync and hasattr(train_model, "no_sync") else contextlib.nullcontext()):
                        with autocast(dist.device, cfg.run.precision):
                            logits = train_model(x)
                        loss = criterion(logits.float(), target) if len(y) else logits.sum() * 0.0
                        (loss / accum).backward()
                    acc["loss_sum"] += loss.item() * len(y)
                    acc["correct"] += (logits.argmax(-1) == y).sum().item()
                    acc["seen"] += len(y)
                    images_seen += len(y) * dist.world_size
                    interval_images += len(y) * dist.world_size
                if cfg.optim.clip_grad:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip_grad)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                if ema is not None:
                    ema.update(model)
                acc["train_time"] += time.perf_counter() - t0
                step, k = step + 1, k + 1
                if k == steps_per_epoch:
                    epoch, k, epoch_done = epoch + 1, 0, True
                progress.update(1, loss=loss.item(), acc=100 * acc["correct"] / max(acc["seen"], 1),
                                img_s=round(interval_images / max(time.perf_counter() - interval_start, 1e-9)))
                if step % cfg.run.log_every == 0 or step == total_steps:
                    sums = dist.all_reduce(torch.tensor([acc["loss_sum"], acc["correct"], acc["seen"], acc["skipped"]],
                                                        dtype=torch.float64))
                    elapsed = time.perf_counter() - interval_start
                    log.write(step=step, split="train", loss=sums[0].item() / max(sums[2].item(), 1),
                              acc=100 * sums[1].item() / max(sums[2].item(), 1), lr=scheduler.get_last_lr()[0],
                              epoch=round(step / steps_per_epoch, 3), skipped=int(sums[3].item()),
                              images_per_s=round(interval_images / max(elapsed, 1e-9), 1))
                    acc.update(loss_sum=0.0, correct=0.0, seen=0.0, skipped=0.0)
                    interval_start, interval_images = time.perf_counter(), 0
                if step % eval_every == 0 or step == total_steps:
                    last_valid = run_eval()
                if step % ckpt_every == 0 or step == total_steps:
                    checkpoint()
                    interval_start = time.perf_counter()  # checkpoint writes are not training throughput
            batches.close()
    progress.close()
    train_time = sum(dist.gather_object(acc["train_time"])) / dist.world_size
    if not last_valid:  # resumed from the final checkpoint
        last_valid = run_eval()

    # export, reload, re-check
    dist.sync_buffers(*synced)
    exported = {"model": out / "model.safetensors"}
    if ema is not None:
        exported["ema"] = out / "model-ema.safetensors"
    if dist.is_main:
        zoo.save(model, exported["model"])
        if ema is not None:
            zoo.save(ema.module, exported["ema"])
    dist.barrier()
    reloaded = {}
    for name, path in exported.items():
        again = zoo.load(path, device=dist.device)
        reloaded[name] = evaluate(again, data, dist, cfg.run.precision)
    results = {
        "model": spec.name, "parameters": n_params, "steps": step, "epochs": round(step / steps_per_epoch, 3),
        "world_size": dist.world_size, "batch_size": cfg.data.batch_size, "valid_images": last_valid["images"],
        "top1": last_valid["top1"], "top5": last_valid["top5"], "loss": last_valid["loss"],
        "ema_top1": last_valid.get("ema_top1"), "ema_top5": last_valid.get("ema_top5"), "ema_loss": last_valid.get("ema_loss"),
        "reloaded_top1": reloaded["model"]["top1"], "reloaded_top5": reloaded["model"]["top5"],
        "reloaded_loss": reloaded["model"]["loss"],
        "reloaded_ema_top1": reloaded["ema"]["top1"] if "ema" in reloaded else None,
        "reloaded_ema_loss": reloaded["ema"]["loss"] if "ema" in reloaded else None,
        "skipped_train_images": skipped_total, "skipped_valid_images": last_valid["skipped"],
        "train_images_per_s": round(images_seen / max(train_time, 1e-9), 1) if train_time else None,
        "train_s": round(train_time, 1), "wall_s": round(time.perf_counter() - wall_start, 1),
    }
    same = results["reloaded_top1"] == results["top1"] and abs(results["reloaded_loss"] - results["loss"]) < 1e-6
    if dist.is_main:
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        if cfg.run.plot:
            plot_metrics(out / "metrics.jsonl", out / "curves.png",
                         panels=[("loss", ["train/loss", "valid/loss", "valid/ema_loss"]),
                                 ("accuracy (%)", ["train/acc", "valid/top1", "valid/top5", "valid/ema_top1"])],
                         title=f"{spec.name or 'vit'} on {'Fashion-MNIST' if cfg.data.path is None else cfg.data.path}")
    line = (f"done: {step} steps | top-1 {results['top1']:.2f}% top-5 {results['top5']:.2f}% on {results['valid_images']} images")
    if ema is not None:
        line += f" | EMA top-1 {results['ema_top1']:.2f}% top-5 {results['ema_top5']:.2f}%"
    line += (f" | reloaded {exported['model'].name}: top-1 {results['reloaded_top1']:.2f}% ({'same' if same else 'DIFFERS'})"
             f" | {results['train_images_per_s']} img/s | skipped images {skipped_total} | {results['wall_s']:.0f}s")
    dist.print(line)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    tune_malloc()
    cfg, args = parse_args(RecipeConfig, argv, default=DEFAULT_CONFIG, description=__doc__.split("\n\n")[0])
    try:
        with distributed(cfg.run.device) as dist:
            return train(cfg, args.resume, dist)
    except (DatasetMissing, CheckpointError) as e:
        print(f"imagenet.py: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
