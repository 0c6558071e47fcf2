"""Images as lists of patches (NaViT, Dehghani et al. 2023; timm's NaFlexVit): each image keeps its
own size and aspect ratio, cut into patches that are padded to one length per batch.

    PatchBatch(patches [B, N, P*P*C], coords [B, N, 2], valid [B, N])
    PatchBatch.from_images([image [C, H, W], ...], patch_size)      # raster order, padded to the longest

``patches``: each patch's pixels flattened by (row, column, channel) (timm's ``Patchify``);
``coords``: each patch's (row, column) on its image's patch grid; ``valid``: True at real patches,
False at padding. An image's grid is (1 + its largest row, 1 + its largest column) among its valid
patches. A ViT (:class:`zoo.models.vit.VisionTransformer`) takes a PatchBatch where it takes images:
each image's positions fitted to its own grid, the padding hidden from attention and left out of
pooling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PatchBatch"]


@dataclass(frozen=True)
class PatchBatch:
    """A batch of images as padded patch lists (see the module docstring)."""

    patches: Tensor
    coords: Tensor
    valid: Tensor

    @classmethod
    def from_images(cls, images: Sequence[Tensor], patch_size: int, length: int | None = None) -> PatchBatch:
        """Images [C, H, W] of any sizes (multiples of ``patch_size``) as one batch: each image's
        patches in raster order, padded with zeros (at coordinates (0, 0)) to ``length`` patches
        (default: the most any image has)."""
        if not images:
            raise ValueError("images: give at least one image [C, H, W]")
        lists = []
        for i, img in enumerate(images):
            if not isinstance(img, Tensor) or img.dim() != 3 or img.shape[1] % patch_size or img.shape[2] % patch_size:
                got = tuple(img.shape) if isinstance(img, Tensor) else type(img).__name__
                raise ValueError(f"images[{i}]: expected a tensor [C, H, W] with H and W multiples of patch_size "
                                 f"({patch_size}), got {got}; crop or pad the image")
            c, h, w = img.shape
            gh, gw = h // patch_size, w // patch_size
            flat = img.reshape(c, gh, patch_size, gw, patch_size).permute(1, 3, 2, 4, 0).reshape(gh * gw, -1)
            ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
            lists.append((flat, torch.stack([ys.flatten(), xs.flatten()], dim=1)))
        n = length if length is not None else max(len(f) for f, _ in lists)
        if n < max(len(f) for f, _ in lists):
            raise ValueError(f"length: {n} patches cannot hold an image of {max(len(f) for f, _ in lists)}; "
                             f"give a longer length or smaller images")
        first = images[0]
        patches = first.new_zeros(len(lists), n, lists[0][0].shape[1])
        coords = torch.zeros(len(lists), n, 2, dtype=torch.long, device=first.device)
        valid = torch.zeros(len(lists), n, dtype=torch.bool, device=first.device)
        for i, (flat, xy) in enumerate(lists):
            patches[i, : len(flat)], coords[i, : len(flat)], valid[i, : len(flat)] = flat, xy.to(first.device), True
        return cls(patches, coords, valid)

    def grids(self, patch_size: int, in_channels: int) -> list[tuple[int, int]]:
        """Each image's patch grid (rows, columns), refusing shapes a model of ``patch_size`` and
        ``in_channels`` cannot take (the message names the field)."""
        p, c, v = self.patches, self.coords, self.valid
        want = patch_size * patch_size * in_channels
        if not isinstance(p, Tensor) or p.dim() != 3 or p.shape[-1] != want or not p.is_floating_point():
            got = f"{tuple(p.shape)} {p.dtype}" if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"patches: expected a float tensor [batch, patches, {want}] (patch_size^2 * in_channels, each "
                             f"patch's pixels by row, column, channel), got {got}")
        b, n = p.shape[:2]
        if not isinstance(c, Tensor) or tuple(c.shape) != (b, n, 2) or c.is_floating_point() or c.dtype == torch.bool:
            got = f"{tuple(c.shape)} {c.dtype}" if isinstance(c, Tensor) else type(c).__name__
            raise ValueError(f"coords: expected integer (row, column) grid coordinates [{b}, {n}, 2], got {got}")
        if not isinstance(v, Tensor) or tuple(v.shape) != (b, n) or v.dtype != torch.bool:
            got = f"{tuple(v.shape)} {v.dtype}" if isinstance(v, Tensor) else type(v).__name__
            raise ValueError(f"valid: expected a bool tensor [{b}, {n}], True at real patches, got {got}")
        if not bool(v.any(dim=1).all()):
            raise ValueError(f"valid: image {int((~v.any(dim=1)).nonzero()[0])} has no valid patch; give each image one at least")
        if bool((c[v] < 0).any()):
            raise ValueError("coords: a valid patch has a negative row or column; count them from 0")
        rows = torch.where(v, c[..., 0], 0).amax(dim=1) + 1
        cols = torch.where(v, c[..., 1], 0).amax(dim=1) + 1
        return list(zip(rows.tolist(), cols.tolist()))

    def positions(self, grids: list[tuple[int, int]], table_for, prefix: int) -> tuple[Tensor, Tensor] | None:
        """Each image's position rows: (prefix rows [B, prefix, D], patch rows [B, N, D]) read from
        ``table_for(grid)`` (a [prefix + rows * columns, D] table fitted to the grid, or None when the
        model adds none) at each patch's coordinates; padding reads the first grid row."""
        b, n = self.valid.shape
        pre = pos = None
        for grid in sorted(set(grids)):
            table = table_for(grid)
            if table is None:
                return None
            if pos is None:
                pre = table.new_zeros(b, prefix, table.shape[-1])
                pos = table.new_zeros(b, n, table.shape[-1])
            rows = torch.tensor([i for i, g in enumerate(grids) if g == grid], device=pos.device)
            c = self.coords[rows]
            cell = torch.where(self.valid[rows], c[..., 0] * grid[1] + c[..., 1], 0) + prefix  # (b, N)
            pos[rows] = table[cell]
            pre[rows] = table[:prefix]
        return pre, pos
