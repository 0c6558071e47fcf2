"""Image data for the ViT recipe (recipes/imagenet.py): its ``data`` config, Fashion-MNIST held as
tensors (:class:`TensorImages`) or an ImageNet-layout folder through timm's transforms
(:class:`FolderImages`), each able to replay any batch after a resume, and top-1/top-5 evaluation
over all processes (:func:`evaluate_images`)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt
from torch import Tensor, nn

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
from zoo.train import Config, Dist, autocast

__all__ = ["ImageDataConfig", "TensorImages", "FolderImages", "evaluate_images"]


class ImageDataConfig(Config):
    """Where the images come from and how they are batched and augmented (the ViT recipe's ``data``)."""

    path: Path | None = Field(None, description="ImageNet-layout folder (train/, val/); null: Fashion-MNIST")
    fashion_mnist_dir: Path | None = Field(None, description="Fashion-MNIST files; default: the Debian package's folder")
    cache_dir: Path | None = Field(None, description="where the decoded Fashion-MNIST tensors are cached")
    batch_size: PositiveInt = Field(256, description="global batch, split over processes")
    eval_batch_size: PositiveInt = Field(1000, description="evaluation batch per process")
    workers: NonNegativeInt | None = Field(None, description="DataLoader workers per process (image folders); "
                                           "default: the CPU cores this process may use, at most 8")
    train_limit: PositiveInt | None = Field(None, description="use only the first N training images")
    valid_limit: PositiveInt | None = Field(None, description="evaluate on the first N validation images")
    # the tensor default's augmentation
    crop_padding: NonNegativeInt = Field(0, description="Fashion-MNIST: random crop with this zero padding (0: off)")
    flip: bool = Field(True, description="Fashion-MNIST: random horizontal flip")
    # image folders: timm's pipeline
    image_size: PositiveInt | None = Field(None, description="crop size (Fashion-MNIST: resized to it); default: the "
                                           "model's image_size (Fashion-MNIST: 28)")
    auto_augment: str | None = Field("rand-m9-mstd0.5-inc1", description="image folders: timm's RandAugment policy; null: off")
    re_prob: NonNegativeFloat = Field(0.25, description="image folders: random-erasing probability")
    interpolation: str = Field("bicubic", description="image folders: resize interpolation")
    crop_pct: float = Field(0.875, gt=0.0, le=1.0, description="image folders: evaluation centre crop, a fraction of the resize")
    mixup: NonNegativeFloat = Field(0.0, description="Mixup alpha (0: off); DeiT 0.8")
    cutmix: NonNegativeFloat = Field(0.0, description="CutMix alpha (0: off); DeiT 1.0")


class TensorImages:
    """Fashion-MNIST as uint8 tensors: shuffled by a DistributedSampler, augmented per batch with
    a generator seeded by (seed, epoch, batch, rank), so any batch can be replayed exactly."""

    def __init__(self, cfg: ImageDataConfig, dist: Dist, batch: int, seed: int = 0) -> None:
        data = load_fashion_mnist(cfg.fashion_mnist_dir, cfg.cache_dir)
        lim, vlim = cfg.train_limit, cfg.valid_limit
        self.train_x, self.train_y = data["train_x"][:lim], data["train_y"][:lim]
        self.valid_x, self.valid_y = data["test_x"][:vlim], data["test_y"][:vlim]
        self.num_classes, self.in_channels, self.image_size = 10, 1, cfg.image_size or 28
        self.cfg, self.dist, self.batch, self.seed = cfg, dist, batch, seed
        self.sampler = dist.sampler(range(len(self.train_y)), shuffle=True, seed=seed, drop_last=True)
        self.batches_per_epoch = len(self.sampler) // batch
        self.n_train, self.n_valid = len(self.train_y), len(self.valid_y)

    def train_batches(self, epoch: int, start: int) -> Iterator[tuple[Tensor, Tensor, int]]:
        self.sampler.set_epoch(epoch)
        order = torch.tensor(list(self.sampler), dtype=torch.long)
        d, seed = self.cfg, self.seed
        for b in range(start, self.batches_per_epoch):
            idx = order[b * self.batch:(b + 1) * self.batch]
            g = torch.Generator().manual_seed(
                (seed * 1_000_003 + (epoch * self.batches_per_epoch + b) * self.dist.world_size + self.dist.rank) % 2**63
            )
            x = augment_batch(self.train_x[idx], generator=g, padding=d.crop_padding, flip=d.flip)
            yield self._sized(normalize(x, FASHION_MNIST_MEAN, FASHION_MNIST_STD)), self.train_y[idx], 0

    def valid_batches(self) -> Iterator[tuple[Tensor, Tensor, int]]:
        mine = torch.tensor(list(self.dist.eval_indices(self.n_valid)), dtype=torch.long)
        for i in range(0, len(mine), self.cfg.eval_batch_size):
            idx = mine[i:i + self.cfg.eval_batch_size]
            yield self._sized(normalize(self.valid_x[idx], FASHION_MNIST_MEAN, FASHION_MNIST_STD)), self.valid_y[idx], 0

    def _sized(self, x: Tensor) -> Tensor:
        """``x`` at ``data.image_size`` (bilinear, antialiased when shrinking), or as it is."""
        if x.shape[-1] == self.image_size:
            return x
        return F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False,
                             antialias=self.image_size < x.shape[-1])


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

    def __init__(self, cfg: ImageDataConfig, dist: Dist, batch: int, image_size: int, seed: int = 0) -> None:
        d = cfg
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
        self.cfg, self.dist, self.batch, self.seed = cfg, dist, batch, seed
        self.sampler = dist.sampler(train, shuffle=True, seed=seed, drop_last=True)
        self.batches_per_epoch = len(self.sampler) // batch
        self.n_train, self.n_valid = len(train), n_valid
        self.pin = dist.device.type == "cuda"

    def _loader(self, data: Any, sampler: Any, batch: int, seed: int) -> torch.utils.data.DataLoader:
        w = self.cfg.workers
        if w is None:
            w = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        return torch.utils.data.DataLoader(
            data, batch_size=batch, sampler=sampler, num_workers=w, pin_memory=self.pin, drop_last=False,
            collate_fn=collate_skipping, persistent_workers=False, prefetch_factor=4 if w else None,
            generator=torch.Generator().manual_seed(seed),
        )

    def train_batches(self, epoch: int, start: int) -> Iterator[tuple[Tensor, Tensor, int]]:
        self.sampler.set_epoch(epoch)
        seed = self.seed * 1_000_003 + epoch * self.dist.world_size + self.dist.rank
        loader = self._loader(self.train, _Skip(self.sampler, start * self.batch), self.batch, seed)
        yield from itertools.islice(loader, self.batches_per_epoch - start)

    def valid_batches(self) -> Iterator[tuple[Tensor, Tensor, int]]:
        subset = torch.utils.data.Subset(self.valid_set, list(self.dist.eval_indices(self.n_valid)))
        yield from self._loader(subset, None, self.cfg.eval_batch_size, 0)


@torch.no_grad()
def evaluate_images(model: nn.Module, data: Any, dist: Dist, precision: str) -> dict[str, float]:
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
