"""Image data helpers (zoo.data.images): batch augmentation and skipping unreadable files."""

from __future__ import annotations

import warnings

import pytest
import torch

from zoo.data import images


def test_augment_batch_crops_each_image_at_its_own_offset():
    x = torch.arange(2 * 3 * 5 * 4, dtype=torch.uint8).reshape(2, 3, 5, 4)
    got = images.augment_batch(x, generator=torch.Generator().manual_seed(3), padding=2, flip=False)
    g = torch.Generator().manual_seed(3)  # the same draws, one image at a time
    oy, ox = torch.randint(0, 5, (2,), generator=g), torch.randint(0, 5, (2,), generator=g)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(2):
        assert torch.equal(got[i], padded[i, :, oy[i]:oy[i] + 5, ox[i]:ox[i] + 4])


def test_normalize_standardises_each_channel():
    x = torch.tensor([0, 255], dtype=torch.uint8).reshape(1, 1, 1, 2).expand(1, 2, 1, 2)
    out = images.normalize(x, mean=(0.5, 0.0), std=(0.5, 1.0))
    assert torch.equal(out, torch.tensor([[[[-1.0, 1.0]], [[0.0, 1.0]]]]))


def test_unreadable_images_are_skipped_by_name_with_a_running_count(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    folder = tmp_path / "cls"
    folder.mkdir()
    pil.fromarray((torch.rand(8, 8, 3) * 255).byte().numpy()).save(folder / "0.png")
    for name in ("1.png", "2.png"):
        (folder / name).write_bytes(b"not an image")
    data = images.SafeImageFolder(str(tmp_path), transform=lambda im: torch.zeros(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch = [data[i] for i in range(len(data))]
    assert batch[1] is None and batch[2] is None and batch[0] is not None
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and data.skipped == 2
    assert messages[0].startswith(f"skipped unreadable image {folder / '1.png'} (1 skipped so far): ")
    assert messages[1].startswith(f"skipped unreadable image {folder / '2.png'} (2 skipped so far): ")
    images_, labels, skipped = images.collate_skipping(batch)
    assert images_.shape == (1, 1) and labels.tolist() == [0] and skipped == 2
