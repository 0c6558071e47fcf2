"""Image data for the ViT recipe: the embedded Fashion-MNIST default (tensors, augmented in batch)
and ImageNet-layout folders (torchvision ImageFolder + timm's transforms, bad files skipped).

    data = load_fashion_mnist()                     # {"train_x": uint8 [60000,1,28,28], "train_y", "test_x", "test_y"}
    x = augment_batch(data["train_x"][idx], generator=g, padding=2, flip=True)   # float, normalised
    train = SafeImageFolder("imagenet/train", transform)                          # corrupt files -> None
    loader = DataLoader(train, collate_fn=collate_skipping, ...)                  # (images, labels, n_skipped)

Fashion-MNIST (Xiao et al. 2017, MIT) comes from the Debian package ``dataset-fashion-mnist``
(``/usr/share/datasets/fashion-mnist``); it is decoded once into a cached tensor file so that epochs
never touch the gzip files again.
"""

from __future__ import annotations

import gzip
import os
import struct
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from einops import rearrange
from torch import Tensor

from zoo.atomic import atomic_write
from zoo.dirs import cache_dir as zoo_cache_dir

__all__ = [
    "DatasetMissing", "FASHION_MNIST_DIR", "FASHION_MNIST_CLASSES", "FASHION_MNIST_MEAN", "FASHION_MNIST_STD",
    "read_idx", "load_fashion_mnist", "default_cache_dir", "augment_batch", "normalize",
    "SafeImageFolder", "collate_skipping", "image_transforms",
]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
_FILES = {
    "train_x": "train-images-idx3-ubyte.gz", "train_y": "train-labels-idx1-ubyte.gz",
    "test_x": "t10k-images-idx3-ubyte.gz", "test_y": "t10k-labels-idx1-ubyte.gz",
}
_CACHE_VERSION = 1


class DatasetMissing(RuntimeError):
    """A dataset that is not where it should be; the message says in one line how to get it."""


# ------------------------------------------------------------------------------ Fashion-MNIST
def read_idx(path: str | os.PathLike) -> Tensor:
    """An IDX file (the MNIST format, optionally gzipped) as a uint8 tensor of its stored shape."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{str(path)!r} is not an unsigned-byte IDX file (magic {data[:4].hex()})")
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = data[4 + 4 * ndim:]
    n = 1
    for s in shape:
        n *= s
    if len(body) != n:
        raise ValueError(f"{str(path)!r} is truncated: {len(body)} bytes for shape {shape}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(shape)


def default_cache_dir() -> Path:
    """``$ZOO_CACHE_DIR``, else ``$XDG_CACHE_HOME/zoo``, else ``~/.cache/zoo`` (:func:`zoo.dirs.cache_dir`)."""
    return zoo_cache_dir()


def load_fashion_mnist(root: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None) -> dict[str, Tensor]:
    """Fashion-MNIST as uint8 images ``[N, 1, 28, 28]`` and int64 labels (60,000 train, 10,000 test).

    Read from ``root`` (default: the Debian package's folder) the first time, then from a cached
    tensor file in ``cache_dir``. Raises :class:`DatasetMissing` when the files are not there.
    """
    root = Path(root) if root is not None else FASHION_MNIST_DIR
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache_file = cache / f"fashion-mnist-v{_CACHE_VERSION}.pt"
    if cache_file.is_file():
        try:
            data = torch.load(cache_file, weights_only=True)
            if set(data) == set(_FILES) and data["train_x"].shape == (60000, 1, 28, 28):
                return data
        except Exception:  # a damaged cache is rebuilt from the source files
            pass
    missing = [name for name in _FILES.values() if not (root / name).is_file()]
    if missing:
        hint = ("install it with `apt-get install dataset-fashion-mnist`" if root == FASHION_MNIST_DIR
                else f"put {', '.join(_FILES.values())} there")
        raise DatasetMissing(
            f"Fashion-MNIST not found ({missing[0]} missing in {root}); {hint}, or pass data.path=<ImageNet-layout folder>"
        )
    data = {}
    for key, name in _FILES.items():
        t = read_idx(root / name)
        data[key] = rearrange(t, "n h w -> n 1 h w").contiguous() if key.endswith("_x") else t.long()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with atomic_write(cache_file) as f:
            torch.save(data, f)
    except OSError:  # a read-only cache folder only costs the decoding next time
        pass
    return data


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """uint8 (or [0, 255] float) images ``[B, C, H, W]`` -> float32, per-channel standardised."""
    x = images.float().div_(255.0)
    m = rearrange(torch.tensor(mean, dtype=x.dtype, device=x.device), "c -> 1 c 1 1")
    s = rearrange(torch.tensor(std, dtype=x.dtype, device=x.device), "c -> 1 c 1 1")
    return x.sub_(m).div_(s)


def augment_batch(images: Tensor, *, generator: torch.Generator, padding: int = 2, flip: bool = True) -> Tensor:
    """Random crop with zero padding and horizontal flip of a uint8 batch ``[B, C, H, W]``, each
    image its own draw from ``generator`` (so a batch is reproducible from its seed alone)."""
    b, c, h, w = images.shape
    x = images
    if padding:
        padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))
        oy = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
        ox = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
        rows = (oy[:, None] + torch.arange(h))[:, :, None]  # (B, H, 1)
        cols = (ox[:, None] + torch.arange(w))[:, None, :]  # (B, 1, W)
        bidx = torch.arange(b)[:, None, None]
        x = rearrange(rearrange(padded, "b c h w -> b h w c")[bidx, rows, cols], "b h w c -> b c h w")
    if flip:
        mask = torch.rand(b, generator=generator) < 0.5
        x = torch.where(mask[:, None, None, None], x.flip(-1), x)
    return x.contiguous()


# ----------------------------------------------------------------------- ImageNet-layout folders
def _image_folder_base():
    from torchvision.datasets import ImageFolder

    return ImageFolder


class SafeImageFolder(_image_folder_base()):
    """torchvision's ImageFolder, except that an image that cannot be read or decoded yields
    ``None`` instead of raising; :func:`collate_skipping` drops and counts those. Each skipped file
    is named in a warning with the running count ``skipped`` (per process: DataLoader workers each
    count their own)."""

    skipped = 0

    def __getitem__(self, index: int) -> Any:
        try:
            return super().__getitem__(index)
        except Exception as e:  # truncated, corrupt, unreadable: skipped, counted by the collate function
            self.skipped += 1
            warnings.warn(f"skipped unreadable image {self.samples[index][0]} ({self.skipped} skipped so far): "
                          f"{type(e).__name__}: {e}", stacklevel=2)
            return None


def collate_skipping(batch: list[Any]) -> tuple[Tensor, Tensor, int]:
    """``(images, labels, n_skipped)`` from a list of ``(image, label)`` pairs and ``None`` for bad files."""
    good = [b for b in batch if b is not None]
    skipped = len(batch) - len(good)
    if not good:
        return torch.empty(0), torch.empty(0, dtype=torch.long), skipped
    images = torch.stack([g[0] for g in good])
    labels = torch.tensor([int(g[1]) for g in good], dtype=torch.long)
    return images, labels, skipped


def image_transforms(image_size: int, *, training: bool, auto_augment: str | None = "rand-m9-mstd0.5-inc1",
                     re_prob: float = 0.25, interpolation: str = "bicubic", crop_pct: float = 0.875,
                     mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> Callable:
    """timm's ImageNet pipeline: RandomResizedCrop, flip, RandAugment, random erasing (training) or
    resize + center crop (evaluation), then normalisation (ImageNet mean/std by default)."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform

    mean = tuple(mean) if mean is not None else IMAGENET_DEFAULT_MEAN
    std = tuple(std) if std is not None else IMAGENET_DEFAULT_STD
    if training:
        return create_transform(image_size, is_training=True, auto_augment=auto_augment or None, re_prob=re_prob,
                                re_mode="pixel", interpolation=interpolation, mean=mean, std=std)
    return create_transform(image_size, is_training=False, interpolation=interpolation, crop_pct=crop_pct,
                            mean=mean, std=std)
