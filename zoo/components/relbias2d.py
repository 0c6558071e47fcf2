"""BEiT's 2-D relative position bias (Bao et al. 2022; timm's ``Beit`` with ``use_rel_pos_bias``):
each layer adds to its attention scores a learned scalar per head, looked up by the (row, column)
offset between the query's and the key's patches, with three more entries for the prefix tokens
(a prefix query, a prefix key, both).

A ViT hands the layers each token's place on the grid (:func:`zoo.components.rope2d.grid_positions`):
[T, 2] (row, column), the class token at (-1, -1). Offsets of an h x w grid index a table of
(2h - 1)(2w - 1) + 3 rows, laid out as timm's ``relative_position_bias_table`` [rows, H].

Shapes: H heads, T tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.components.position import Position
from zoo.registry import register

__all__ = ["GridRelativeBias", "grid_relative_index"]


def grid_relative_index(q: Tensor, k: Tensor, grid: tuple[int, int]) -> Tensor:
    """[Tq, Tk] rows of the table for queries at grid places ``q`` [Tq, 2] and keys at ``k`` [Tk, 2]
    (prefix tokens at (-1, -1)): a patch pair's offset (dr + h - 1) * (2w - 1) + (dc + w - 1); then
    a prefix query to a patch, a patch query to a prefix key, prefix to prefix (timm's
    ``gen_relative_position_index``)."""
    h, w = grid
    offsets = (2 * h - 1) * (2 * w - 1)
    d = q[:, None, :] - k[None, :, :]  # (Tq, Tk, 2)
    index = (d[..., 0] + h - 1) * (2 * w - 1) + (d[..., 1] + w - 1)
    q_prefix, k_prefix = (q[:, 0] < 0)[:, None], (k[:, 0] < 0)[None, :]
    index = torch.where(q_prefix & ~k_prefix, offsets, index)
    index = torch.where(~q_prefix & k_prefix, offsets + 1, index)
    return torch.where(q_prefix & k_prefix, offsets + 2, index)


class GridRelativeBias(Position):
    """A layer's 2-D relative bias over an h x w patch grid (see the module docstring): ``weight``
    [(2h - 1)(2w - 1) + 3, H], zero at initialisation (as timm). Its :meth:`bias` reads (row, column)
    grid positions [T, 2]; sequence positions [T] carry no grid, so it gives none for them (a ViT
    asks again with the grid's)."""

    def __init__(self, n_heads: int, grid: tuple[int, int]) -> None:
        super().__init__()
        self.grid = tuple(grid)
        h, w = self.grid
        self.weight = nn.Parameter(torch.zeros((2 * h - 1) * (2 * w - 1) + 3, n_heads))  # (rows, H)

    def fit_grid(self, grid: tuple[int, int], *, trained: tuple[int, int], prefix: int) -> Tensor | None:
        raise ValueError(f"relative_bias2d: the table is sized for the {trained[0]} x {trained[1]} patch grid, "
                         f"not {grid[0]} x {grid[1]}; give images of image_size")

    def bias(self, n_heads: int, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """[1, H, Tq, Tk] for grid positions ([T, 2]); None for sequence positions."""
        if q_positions.dim() != 2 or q_positions.shape[-1] != 2:
            return None
        if n_heads != self.weight.shape[1]:
            raise ValueError(f"relative_bias2d: a table of {self.weight.shape[1]} heads cannot bias {n_heads} heads")
        grid = None if torch.compiler.is_compiling() else tuple((k_positions.amax(dim=0) + 1).tolist())  # a host read
        if grid is not None and grid != self.grid:
            raise ValueError(f"relative_bias2d: the table is sized for the {self.grid[0]} x {self.grid[1]} patch grid; "
                             f"give images of image_size")
        index = grid_relative_index(q_positions, k_positions, self.grid)
        return self.weight[index].permute(2, 0, 1).unsqueeze(0)  # (1, H, Tq, Tk)

    def extra_repr(self) -> str:
        return f"grid={self.grid}, heads={self.weight.shape[1]}"


@register("position", "relative_bias2d")
def _relative_bias2d(spec, *, n_heads: int, grid: tuple[int, int] | None = None, **_) -> Position:
    if grid is None:
        raise ValueError("relative_bias2d: biases attention on a ViT's patch grid; use it in a vit spec")
    return GridRelativeBias(n_heads, grid)
