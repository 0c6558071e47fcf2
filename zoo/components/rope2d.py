"""Rotary embeddings on a ViT's patch grid (EVA-02; timm's ``RotaryEmbeddingCat``), computed with the
same float32 arithmetic as timm, so a converted model's rotations agree with timm's.

A ViT hands the layers each token's place on the grid (:func:`grid_positions`): [T, 2] (row,
column), the class token and the registers at (-1, -1), which are not turned. Each query/key head of
K dimensions turns its first K/2 dimensions by the row and the rest by the column, in interleaved
pairs (2i, 2i + 1), at the frequencies base^(-j/(K/4)) for j < K/4. DINOv3's variant (timm's
``RotaryEmbeddingDinoV3``: ``coords="centered"``, ``pairs="half"``) turns by the patch centres mapped
to [-1, 1], 2 pi over the periods base^(j/(K/4)), dimension i with i + K/2.

RoPE-Mixed (Heo et al. 2024, "Rotary Position Embedding for Vision"; timm's ``RotaryEmbeddingMixed``,
:class:`MixedGridRotaryPosition`) learns the frequencies: each layer holds, for each head, K/2
frequency pairs (f_x, f_y) and turns the interleaved pair (2j, 2j + 1) by column * f_x[j] + row *
f_y[j] (``indexing="xy"``; ``"ij"`` swaps the axes), so a pair may turn along any direction of the grid.

Shapes: B batch, H query heads, G key/value heads, T tokens, K head size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from zoo.components.position import Position
from zoo.protocols import DerivedBuffers
from zoo.registry import register

__all__ = ["GridRotaryPosition", "MixedGridRotaryPosition", "grid_positions", "mixed_frequencies"]


def grid_positions(grid: tuple[int, int], prefix: int, device: torch.device | None = None) -> Tensor:
    """[prefix + h*w, 2]: (-1, -1) for each prefix token, then (row, column) of each patch in raster order."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    cells = torch.stack([rows.flatten(), cols.flatten()], dim=-1)  # (h*w, 2)
    return torch.cat([torch.full((prefix, 2), -1, dtype=cells.dtype, device=device), cells])


def _turn_pairs(x: Tensor) -> Tensor:
    """[x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...]: each interleaved pair turned a quarter."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape(x.shape)


def _turn_halves(x: Tensor) -> Tensor:
    """[a, b] -> [-b, a] for the two halves of the last dimension (dimension i paired with i + K/2)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def grid_coords(positions: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """(which tokens are on the grid [T, 1] (the prefix tokens, at -1, are not turned), their (row,
    column) [T, 2] in float32, the prefix's 0) from a ViT's grid ``positions`` [T, 2]."""
    if positions.dim() != 2 or positions.shape[-1] != 2:
        raise ValueError(f"{kind} turns by (row, column) grid positions [T, 2], got {tuple(positions.shape)}; "
                         f"it applies to a ViT's patch grid")
    return positions[:, :1] >= 0, positions.clamp(min=0).to(torch.float32)


class GridRotaryPosition(Position, DerivedBuffers):
    """2-D RoPE over (row, column) grid positions (see the module docstring); ``ref_grid``: the side
    the coordinates of any grid are stretched to (timm's ``ref_feat_shape``), None: raw indices."""

    def __init__(self, head_dim: int, *, base: float = 10000.0, ref_grid: int | None = None, coords: str = "index",
                 pairs: str = "interleaved") -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"GridRotaryPosition: the head size must be divisible by 4, got {head_dim}")
        self.head_dim, self.base, self.ref_grid, self.coords, self.pairs = head_dim, base, ref_grid, coords, pairs
        self.register_buffer("inv_freq", self._frequencies(), persistent=False)

    def _frequencies(self) -> Tensor:
        bands = self.head_dim // 4
        if self.coords == "centered":  # DINOv3's periods base^(2i / (K/2)) (not inverted), as timm computes them
            return float(self.base) ** (2.0 * torch.arange(bands, dtype=torch.float32) / (self.head_dim // 2))
        exponents = torch.arange(0, bands, 1, dtype=torch.int64).to(torch.float32) / bands
        return 1.0 / (float(self.base) ** exponents)  # (K/4,), timm's freq_bands

    def reset_buffers(self) -> None:
        """Recompute the frequencies in place, on their device, keeping their dtype."""
        self.inv_freq.copy_(self._frequencies().to(self.inv_freq.device))

    def fit_grid(self, grid: tuple[int, int], *, trained: tuple[int, int], prefix: int) -> Tensor | None:
        return None  # adds nothing: the turns follow each input's grid

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        on_grid, coords = grid_coords(positions, "rope2d")
        size = (positions.amax(dim=0) + 1).to(torch.float32)  # (2,) the grid's h, w
        if self.coords == "centered":  # DINOv3: centres in [-1, 1], turned by 2 pi coord / base^exponent
            coords = 2.0 * ((coords + 0.5) / size) - 1.0
            angles = (2 * math.pi * coords[..., None] / self.inv_freq).flatten(-2)  # inv_freq holds the periods
        else:
            if self.ref_grid is not None:
                coords = coords / size * self.ref_grid
            angles = (coords[..., None] * self.inv_freq).flatten(-2)  # (T, K/2): the row's bands, then the column's
        sin, cos = torch.where(on_grid, angles.sin(), 0.0), torch.where(on_grid, angles.cos(), 1.0)
        half = self.pairs == "half"
        sin, cos = ((torch.cat([t, t], -1) if half else t.repeat_interleave(2, -1)) for t in (sin, cos))  # (T, K)
        turned = _turn_halves if half else _turn_pairs

        def turn(x: Tensor) -> Tensor:  # (B, H or G, T, K)
            return (x * cos + turned(x) * sin).to(x.dtype)

        return turn(q), turn(k)


def mixed_frequencies(head_dim: int, n_heads: int, *, base: float = 10.0, generator: torch.Generator | None = None,
                      device: torch.device | None = None) -> Tensor:
    """RoPE-Mixed's initial frequencies [2, H, K/2] (timm's ``init_random_2d_freqs`` for one layer):
    magnitudes base^(-4i/K) for i < K/4, each head turned by a random angle a: f_x = [m cos a, m cos(a +
    pi/2)], f_y = [m sin a, m sin(a + pi/2)]."""
    mag = 1.0 / (base ** (torch.arange(0, head_dim, 4, dtype=torch.float32, device=device) / head_dim))  # (K/4,)
    angles = torch.rand(n_heads, 1, generator=generator, dtype=torch.float32, device=device) * 2 * torch.pi  # (H, 1)
    fx = torch.cat([mag * torch.cos(angles), mag * torch.cos(angles + torch.pi / 2)], dim=-1)  # (H, K/2)
    fy = torch.cat([mag * torch.sin(angles), mag * torch.sin(angles + torch.pi / 2)], dim=-1)
    return torch.stack([fx, fy])  # (2, H, K/2)


class MixedGridRotaryPosition(Position):
    """One layer's RoPE-Mixed (see the module docstring): ``freqs`` [2, H, K/2], learned, the
    frequencies of the x axis then of the y axis (timm's ``RotaryEmbeddingMixed.freqs[:, layer]``).
    The class token and the registers are not turned; any grid is turned by its own indices."""

    def __init__(self, head_dim: int, n_heads: int, *, base: float = 10.0, indexing: str = "xy") -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"MixedGridRotaryPosition: the head size must be divisible by 4, got {head_dim}")
        self.head_dim, self.n_heads, self.base, self.indexing = head_dim, n_heads, base, indexing
        self.freqs = nn.Parameter(mixed_frequencies(head_dim, n_heads, base=base))

    def fit_grid(self, grid: tuple[int, int], *, trained: tuple[int, int], prefix: int) -> Tensor | None:
        return None  # adds nothing: the turns follow each input's grid

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        if k.shape[1] != self.n_heads:
            raise ValueError(f"rope2d_mixed: frequencies for {self.n_heads} heads cannot turn {k.shape[1]} key/value heads; "
                             f"set block.attention.n_kv_heads to n_heads")
        on_grid, coords = grid_coords(positions, "rope2d_mixed")
        t_x, t_y = (coords[:, 1], coords[:, 0]) if self.indexing == "xy" else (coords[:, 0], coords[:, 1])
        f = self.freqs.float()
        angles = t_x[:, None] * f[0][:, None, :] + t_y[:, None] * f[1][:, None, :]  # (H, T, K/2), as timm adds them
        sin = torch.where(on_grid, angles.sin(), 0.0).repeat_interleave(2, -1)  # (H, T, K)
        cos = torch.where(on_grid, angles.cos(), 1.0).repeat_interleave(2, -1)

        def turn(x: Tensor) -> Tensor:  # (B, H, T, K)
            return (x * cos + _turn_pairs(x) * sin).to(x.dtype)

        return turn(q), turn(k)

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}, head_dim={self.head_dim}, base={self.base}, indexing={self.indexing!r}"


@register("position", "rope2d_mixed")
def _rope2d_mixed(spec, *, head_dim: int, n_heads: int, **_) -> Position:
    return MixedGridRotaryPosition(head_dim, n_heads, base=spec.base, indexing=spec.indexing)


@register("position", "rope2d")
def _rope2d(spec, *, head_dim: int, **_) -> Position:
    return GridRotaryPosition(head_dim, base=spec.base, ref_grid=spec.ref_grid, coords=spec.coords, pairs=spec.pairs)
