#!/usr/bin/env python
"""Train a zoo Vision Transformer on image classification.

    python recipes/imagenet.py                                   # embedded default: Fashion-MNIST (~14 min on 2 CPU cores)
    python recipes/imagenet.py data.path=/data/imagenet model=vit-small-16 --config imagenet-vit-s16.yaml
    torchrun --nproc_per_node 8 recipes/imagenet.py data.path=/data/imagenet ...   # DDP, same script
    python recipes/imagenet.py --resume                          # continue from the newest checkpoint
    python recipes/imagenet.py init=timm-vit/ data.image_size=64 optim.layer_decay=0.75   # fine-tune a downloaded ViT
    python recipes/imagenet.py init=timm-vit/ train.probe=true   # a linear probe: the head alone on frozen features

Data: with ``data.path`` an ImageNet-layout folder (``train/<class>/*``, ``val/<class>/*``) read by
torchvision's ImageFolder through timm's transforms (RandomResizedCrop, flip, RandAugment, random
erasing; Mixup/CutMix), unreadable images skipped and counted. Without it, Fashion-MNIST from the
Debian package ``dataset-fashion-mnist``, held as tensors and augmented in batch (flip; a random crop
with ``data.crop_padding`` zero padding where set), resized to ``data.image_size`` where given.

With ``init`` (a zoo file, or a timm/HF ViT directory converted on the fly) the run starts from those
weights, and the data's class count, channels and image size become overrides of the file's spec: a
new head starts fresh, learned positions are resampled to the new grid, an RGB patch embedding is
summed for gray images (see :mod:`zoo.train.pretrained`). ``optim.layer_decay`` gives lower blocks
lower learning rates (BEiT); ``train.probe`` trains the head alone on the frozen backbone.

Writes to ``run.out_dir``: ``metrics.jsonl``, ``curves.png``, ``ckpt-<step>.pt`` (atomic; ``--resume``
continues exactly: data position, RNG, optimizer, schedule, EMA), ``model.safetensors`` (and
``model-ema.safetensors``) via ``zoo.save``, re-loaded with ``zoo.load`` and re-evaluated, and
``results.json``. See docs/recipes/imagenet.md.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from pydantic import Field, NonNegativeFloat, PositiveInt
from torch import nn

import zoo
from zoo.atomic import atomic_write_text
from zoo.data.images import DatasetMissing
from zoo.train import (Config, Dist, OptimConfig, RunConfig, ScheduleConfig, Task, TrainError, distributed, fit,
                       parse_args, resolve_precision, resolve_resume, seed_everything, tune_malloc)
from zoo.train.adapters import AdapterConfig, export_adapters, with_adapters
from zoo.train.pretrained import locate, pretrained

from imagenet_data import FolderImages, ImageDataConfig, TensorImages, evaluate_images  # beside this script

DEFAULT_CONFIG = Path(__file__).with_suffix(".yaml")
GPU_CONFIG = Path(__file__).with_suffix(".gpu.yaml")  # laid under the user's settings on CUDA


# ------------------------------------------------------------------------------------- config
class TrainConfig(Config):
    epochs: PositiveInt = Field(8, description="passes over the training images")
    max_steps: PositiveInt | None = Field(None, description="stop after this many optimizer steps (schedule included)")
    warmup_epochs: NonNegativeFloat | None = Field(None, description="warmup in epochs; overrides schedule.warmup")
    label_smoothing: NonNegativeFloat = Field(0.1, description="cross-entropy label smoothing")
    probe: bool = Field(False, description="a linear probe: train the head alone, the rest of the model frozen")


class RecipeConfig(Config):
    init: Path | None = Field(None, description="start from these weights: a zoo file, or a timm/HF ViT directory "
                              "(converted on the fly); the data's classes, channels and image size override its spec; "
                              "null: the model spec from random weights")
    model: str = Field("vitc-fashion-mnist-7", description="without init: a preset name or a spec file")
    model_overrides: list[str] = Field([], description="key=value overrides of the model spec (with init: only those "
                                       "that keep the weights meaningful: dropout, head.*, image_size, in_channels)")
    data: ImageDataConfig = ImageDataConfig()
    train: TrainConfig = TrainConfig()
    finetune: AdapterConfig = AdapterConfig()
    optim: OptimConfig = OptimConfig(lr=1e-3)
    schedule: ScheduleConfig = ScheduleConfig(warmup=200, min_lr_ratio=0.01)
    run: RunConfig = RunConfig(out_dir=Path("runs/imagenet"), ema=0.995)


class ImageTask(Task):
    """Cross-entropy with label smoothing (or Mixup/CutMix's soft targets) on ``accum`` micro-batches a step."""

    name = "train"
    panels = [("loss", ["train/loss", "valid/loss", "valid/ema_loss"]),
              ("accuracy (%)", ["train/acc", "valid/top1", "valid/top5", "valid/ema_top1"])]

    def __init__(self, cfg: RecipeConfig, dist: Dist, data: Any, accum: int) -> None:
        self.cfg, self.dist, self.data, self.accum = cfg, dist, data, accum
        self.mixup = None
        if cfg.data.mixup > 0 or cfg.data.cutmix > 0:
            from timm.data import Mixup

            self.mixup = Mixup(mixup_alpha=cfg.data.mixup, cutmix_alpha=cfg.data.cutmix,
                               label_smoothing=cfg.train.label_smoothing, num_classes=data.num_classes)
        if self.mixup is not None:
            from timm.loss import SoftTargetCrossEntropy

            self.criterion: nn.Module = SoftTargetCrossEntropy()
        else:
            self.criterion = nn.CrossEntropyLoss(label_smoothing=cfg.train.label_smoothing)
        self.skipped = 0  # unreadable training images over the whole run
        self.batch_then = None  # a resumed checkpoint's data.batch_size
        self.micro = (-1, 0)  # (step, micro-batch) for Mixup's seed

    def steps(self, epoch: int) -> int:
        return self.data.batches_per_epoch // self.accum

    def epoch(self, epoch: int, start: int) -> Iterator[list]:
        batches = self.data.train_batches(epoch, start * self.accum)
        try:
            for _ in range(start, self.steps(epoch)):
                yield list(itertools.islice(batches, self.accum))
        finally:
            batches.close()

    def resume_at(self, epoch: int, pos: int, world: int, accum: int, here: tuple[int, int]) -> int:
        """A step is ``data.batch_size`` images whatever the processes and grad_accum: the same step,
        where the checkpoint's batch size is this run's."""
        if self.batch_then not in (None, self.cfg.data.batch_size):
            raise TrainError(f"data.batch_size: the checkpoint stopped inside epoch {epoch} with batches of "
                             f"{self.batch_then}, this run's are {self.cfg.data.batch_size}; resume with "
                             f"data.batch_size={self.batch_then}, or from a checkpoint at an epoch's end")
        return pos

    def count(self, batch) -> float:
        """The images the loss covers: Mixup pairs images, so it leaves an odd batch's last one out."""
        n = len(batch[1])
        return float(n - 1 if self.mixup is not None and n > 1 and n % 2 else n)

    def loss(self, model, batch, step):
        x, y, skipped = batch
        self.skipped += skipped
        self.micro = (step, self.micro[1] + 1 if self.micro[0] == step else 0)
        x, y = x.to(self.dist.device, non_blocking=True), y.to(self.dist.device, non_blocking=True)
        target = y
        if self.mixup is not None and len(y) > 1:
            if len(y) % 2:
                x, y = x[:-1], y[:-1]
            import numpy as np

            np.random.seed((self.cfg.run.seed * 7919 + step * self.accum + self.micro[1]) * self.dist.world_size
                           + self.dist.rank)
            x, target = self.mixup(x, y)
        logits = model(x)
        loss = self.criterion(logits.float(), target) * len(y) if len(y) else logits.sum() * 0.0
        return loss, {"correct": float((logits.argmax(-1) == y).sum()), "images": float(len(y)), "skipped": float(skipped)}

    def train_values(self, sums: dict[str, float], seconds: float) -> dict[str, float]:
        return {"acc": 100 * sums["correct"] / max(sums["images"], 1), "skipped": int(sums["skipped"]),
                "images_per_s": round(sums["images"] / max(seconds, 1e-9), 1)}

    def evaluate(self, model) -> dict[str, float]:
        return evaluate_images(model, self.data, self.dist, self.cfg.run.precision)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "batch_size": self.cfg.data.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.batch_then = state.get("batch_size")


# --------------------------------------------------------------------------------------- main
def train(cfg: RecipeConfig, resume: str | None, dist: Dist) -> dict[str, Any]:
    wall_start = time.perf_counter()
    cfg.run.precision = resolve_precision(cfg.run.precision, dist.device)
    out = Path(cfg.run.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    accum = cfg.run.grad_accum
    if cfg.data.batch_size % (dist.world_size * accum):
        raise TrainError(f"data.batch_size ({cfg.data.batch_size}) must divide by processes x run.grad_accum "
                         f"({dist.world_size} x {accum})")
    micro = cfg.data.batch_size // (dist.world_size * accum)
    seed_everything(cfg.run.seed)

    # data, then the model it implies
    weights = start = None
    if cfg.init is not None:
        weights = locate(cfg.init, work_dir=out / "init", dist=dist, families=("vit",), recipe="imagenet.py")
        spec = weights.spec
        dist.print(f"init: the model and its spec come from {cfg.init}; model={cfg.model} is not used")
    else:
        spec = zoo.load_spec(cfg.model, cfg.model_overrides)
    if cfg.data.path is None:
        data: Any = TensorImages(cfg.data, dist, micro, cfg.run.seed)
    else:
        data = FolderImages(cfg.data, dist, micro, cfg.data.image_size or spec.image_size, cfg.run.seed)
    fixes = [f"{key}={v}" for key, k, v in (("head.num_classes", "num_classes", data.num_classes),
                                            ("in_channels", "in_channels", data.in_channels),
                                            ("image_size", "image_size", data.image_size)) if getattr(spec, k) != v]
    if weights is not None:
        if data.image_size % spec.patch_size:
            raise TrainError(f"data.image_size: {data.image_size}-px images are not tiled by the {spec.patch_size}-px "
                             f"patches of init={cfg.init}; set data.image_size to a multiple of {spec.patch_size} "
                             f"(the model's own: {spec.image_size})")
        start = pretrained(weights, families=("vit",), recipe="imagenet.py", overrides=[*cfg.model_overrides, *fixes],
                           work_dir=out / "init", dist=dist, seed=cfg.run.seed)
        dist.print(start.describe())
        model, spec = start.model, start.spec
    else:
        if fixes:
            spec = zoo.load_spec(cfg.model, list(cfg.model_overrides) + fixes)
        model = zoo.build(spec, seed=cfg.run.seed)
    model = model.to(dist.device)
    if cfg.train.probe:
        if cfg.finetune.lora is not None:
            raise TrainError("train.probe and finetune.lora: a probe trains the head alone, LoRA adapters beside it; "
                             "choose one")
        head = freeze_all_but_head(model)
        dist.print(f"probe: training {head:,} head parameters, the rest of the model frozen")
    model = with_adapters(model, cfg.finetune.lora, trainable=("head",), run=cfg.run, dist=dist)
    task = ImageTask(cfg, dist, data, accum)
    steps_per_epoch = task.steps(0)
    if steps_per_epoch == 0:
        raise TrainError(f"{data.n_train} training images make no full batch of {cfg.data.batch_size}; lower data.batch_size")
    total_steps = steps_per_epoch * cfg.train.epochs
    if cfg.train.max_steps:
        total_steps = min(total_steps, cfg.train.max_steps)
    schedule = cfg.schedule
    if cfg.train.warmup_epochs is not None:
        schedule = schedule.model_copy(update={"warmup": round(cfg.train.warmup_epochs * steps_per_epoch)})
    n_params = zoo.count_parameters(model)
    n_trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    dist.print(f"{spec.name or 'vit'}: {n_params / 1e6:.2f}M parameters, {spec.n_tokens} tokens | "
               f"{data.n_train} train / {data.n_valid} valid images, {data.num_classes} classes | "
               f"{dist.world_size} process(es) on {dist.device}, batch {cfg.data.batch_size}, "
               f"{steps_per_epoch} steps/epoch, {total_steps} steps, {cfg.run.precision}")
    task.plot_options = {"title": f"{spec.name or 'vit'} on {'Fashion-MNIST' if cfg.data.path is None else cfg.data.path}"}
    fitted = fit(model, task, optim=cfg.optim, schedule=schedule, run=cfg.run, dist=dist, total_steps=total_steps,
                 resume=resolve_resume(resume, out), config=cfg.model_dump(mode="json"))
    last_valid, step = fitted.valid, fitted.step

    # export, reload, re-check
    exported = {"model": out / "model.safetensors"}
    if fitted.ema is not None:
        exported["ema"] = out / "model-ema.safetensors"
    if dist.is_main:
        base = None if cfg.init is None else str(cfg.init)  # adapters (finetune.lora) saved alone, then merged
        zoo.save(export_adapters(fitted.model, out, base=base), exported["model"])
        if fitted.ema is not None:
            zoo.save(export_adapters(fitted.ema, out, base=base, name="adapters-ema.safetensors"), exported["ema"])
    dist.barrier()
    reloaded = {name: evaluate_images(zoo.load(path, device=dist.device), data, dist, cfg.run.precision)
                for name, path in exported.items()}
    train_time = sum(dist.gather_object(fitted.train_seconds)) / dist.world_size
    images = float(dist.all_reduce(torch.tensor([fitted.sums.get("images", 0.0)], dtype=torch.float64))[0])
    results = {
        "model": spec.name, "parameters": n_params, "trained_parameters": n_trained, "steps": step,
        "epochs": round(step / steps_per_epoch, 3),
        "world_size": dist.world_size, "batch_size": cfg.data.batch_size, "valid_images": last_valid["images"],
        "top1": last_valid["top1"], "top5": last_valid["top5"], "loss": last_valid["loss"],
        "ema_top1": last_valid.get("ema_top1"), "ema_top5": last_valid.get("ema_top5"), "ema_loss": last_valid.get("ema_loss"),
        "reloaded_top1": reloaded["model"]["top1"], "reloaded_top5": reloaded["model"]["top5"],
        "reloaded_loss": reloaded["model"]["loss"],
        "reloaded_ema_top1": reloaded["ema"]["top1"] if "ema" in reloaded else None,
        "reloaded_ema_loss": reloaded["ema"]["loss"] if "ema" in reloaded else None,
        "skipped_train_images": int(dist.all_reduce(torch.tensor([task.skipped]))[0]),
        "skipped_valid_images": last_valid["skipped"],
        "train_images_per_s": round(images / max(train_time, 1e-9), 1) if train_time else None,
        "train_s": round(train_time, 1), "wall_s": round(time.perf_counter() - wall_start, 1),
        "init": None if start is None else start.report(),
    }
    same = results["reloaded_top1"] == results["top1"] and abs(results["reloaded_loss"] - results["loss"]) < 1e-6
    if dist.is_main:
        atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    line = f"done: {step} steps | top-1 {results['top1']:.2f}% top-5 {results['top5']:.2f}% on {results['valid_images']} images"
    if fitted.ema is not None:
        line += f" | EMA top-1 {results['ema_top1']:.2f}% top-5 {results['ema_top5']:.2f}%"
    line += (f" | reloaded {exported['model'].name}: top-1 {results['reloaded_top1']:.2f}% ({'same' if same else 'DIFFERS'})"
             f" | {results['train_images_per_s']} img/s | skipped images {results['skipped_train_images']} "
             f"| {results['wall_s']:.0f}s")
    dist.print(line)
    return results


def freeze_all_but_head(model: nn.Module) -> int:
    """A linear probe's model: every parameter but the head's (``head.*``) frozen; returns how many
    the head has. The optimizer then holds the head alone (frozen parameters have no group)."""
    head = 0
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("head."))
        head += p.numel() if p.requires_grad else 0
    if not head:
        raise TrainError("train.probe: the model has no head (head.*) to train; set head.kind, or train.probe=false")
    return head


def main(argv: list[str] | None = None) -> dict[str, Any]:
    tune_malloc()
    cfg, args = parse_args(RecipeConfig, argv, default=DEFAULT_CONFIG, gpu=GPU_CONFIG, description=__doc__)
    try:
        with distributed(cfg.run.device) as dist:
            return train(cfg, args.resume, dist)
    except (DatasetMissing, TrainError) as e:
        print(f"imagenet.py: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
