"""Positions: one interface for three mechanisms (RoPE and its scalings: :mod:`zoo.components.rope`).

Absolute positions are *added* to the embeddings, RoPE *rotates* queries and keys, ALiBi and T5's
relative bias *bias* attention scores. Every position module has all three hooks with identity defaults, so blocks call
all three and never branch on the kind. Positions are explicit integer tensors (``[T]`` or
``[B, T]``), so padded batches and cached decoding work the same for every kind.

Derived tables (sinusoids, RoPE frequencies) are non-persistent buffers: they are not saved with the
weights, and a module that has them recomputes them in place with ``reset_buffers()``, which
:func:`zoo.load` calls after materialising a model built on the meta device.

Shapes: B batch, T sequence, D model width, H heads, K head size.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

from zoo.kernels.mask import AlibiBias, RelativeBias
from zoo.protocols import DerivedBuffers, InitNormal, SummaryPart
from zoo.registry import register


class Position(nn.Module, SummaryPart):
    """Identity hooks; subclasses override the ones their mechanism uses."""

    max_len: int | None = None  # the longest sequence a table covers; None: any length
    summary_part = "embeddings"

    @property
    def rotates(self) -> bool:
        """Whether it rotates queries and keys (which keeps copies of them for the backward pass)."""
        return type(self).rotate is not Position.rotate

    @property
    def reads_host(self) -> bool:
        """Whether a forward pass reads its positions on the host (a dynamic RoPE scaling sets its
        frequencies from the longest position seen), which a compiled decoding step cannot do."""
        return False

    def fit_grid(self, grid: tuple[int, int], *, trained: tuple[int, int], prefix: int) -> Tensor | None:
        """What :meth:`add` adds for a ViT whose patch grid is ``grid`` instead of the ``trained``
        grid (``prefix`` table rows before the patches' rows): a table [rows, D], or None when
        nothing is added. A kind that cannot be fitted says so."""
        raise ValueError(f"{type(self).__name__} cannot be fitted to another patch grid")

    def add(self, x: Tensor, positions: Tensor) -> Tensor:
        """x [B, T, D] -> x with absolute position information added."""
        return x

    def added_positions(self, positions: Tensor, padding_mask: Tensor | None, tokens: Tensor | None = None) -> Tensor:
        """The positions :meth:`add` reads for ``tokens`` ([B, T] ids; None: not known) at ``positions``
        ([T] or [B, T]) whose padding is ``padding_mask`` ([B, T], True = real; None: every token
        real): ``positions`` itself, but for a table with a ``padding_idx`` (fairseq's)."""
        return positions

    def rotation(self, positions: Tensor):
        """What :meth:`rotate` reads for tokens at ``positions``, made once per forward pass and
        shared by the layers that use this module (RoPE: the cos and sin; by default the positions)."""
        return positions

    def rotate(self, q: Tensor, k: Tensor, positions) -> tuple[Tensor, Tensor]:
        """q [B, H, T, K], k [B, G, T, K] at ``positions`` (or their :meth:`rotation`) -> rotated q, k."""
        return q, k

    def bias(self, n_heads: int, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """An additive attention-score bias [B or 1, H, Tq, Tk], or None."""
        return None


class NoPosition(Position):
    """No order information (a bag of tokens, or a model that learns it another way)."""

    def fit_grid(self, grid: tuple[int, int], *, trained: tuple[int, int], prefix: int) -> Tensor | None:
        return None


class TablePosition(Position):
    """Adds row ``positions + offset`` of a [max_len + offset, D] table: learned (a parameter) or
    fixed (a buffer). The first ``offset`` rows are read by no position (BART's start at 2; fairseq's
    padding row)."""

    offset: int = 0

    @property
    def max_len(self) -> int:
        return self.weight.shape[0] - self.offset

    def add(self, x: Tensor, positions: Tensor) -> Tensor:
        rows = positions + self.offset if self.offset else positions
        return x + nn.functional.embedding(rows, self.weight).to(x.dtype)

    def fit_grid(self, grid: tuple[int, int], *, trained: tuple[int, int], prefix: int) -> Tensor | None:
        """The table's grid rows resampled bicubically to ``grid`` (timm's dynamic_img_size)."""
        return resample_grid_table(self.weight, trained, grid, prefix=prefix)


class LearnedPosition(TablePosition, InitNormal):
    """A learned table. With an ``offset``, position p reads row p + offset (BART's table starts at 2)
    and the first ``offset`` rows are weights no position reads. With ``padding_idx`` (fairseq's
    positions: RoBERTa, XLM-R) the offset is padding_idx + 1 and padding tokens read row padding_idx
    (:meth:`added_positions`); the table has ``max_len + offset`` rows and still serves ``max_len`` tokens."""

    init_normal = ("weight",)  # drawn N(0, init.std) by the model's initialisation, as embeddings

    def __init__(self, dim: int, max_len: int, offset: int = 0, *, padding_idx: int | None = None) -> None:
        super().__init__()
        if offset and padding_idx is not None:
            raise ValueError("LearnedPosition: give offset or padding_idx (whose offset is padding_idx + 1), not both")
        self.padding_idx = padding_idx
        self.offset = offset if padding_idx is None else padding_idx + 1
        self.weight = nn.Parameter(torch.empty(max_len + self.offset, dim))
        nn.init.normal_(self.weight, std=0.02)

    def added_positions(self, positions: Tensor, padding_mask: Tensor | None, tokens: Tensor | None = None) -> Tensor:
        """HF's ``create_position_ids_from_input_ids`` before :meth:`add`'s offset: with
        ``padding_idx``, padding tokens -1 (so they read row padding_idx), real tokens as they are
        (the padding mask says which are padding; ``tokens`` are not read)."""
        if self.padding_idx is None or padding_mask is None:
            return positions
        return positions.masked_fill(~padding_mask, -1)


def fairseq_sinusoid_table(rows: int, dim: int, *, base: float = 10000.0, layout: str = "concat",
                           padding_idx: int | None = None) -> Tensor:
    """fairseq's ``SinusoidalPositionalEmbedding.get_embedding`` (HF M2M100's): row r holds
    sin(r * f_i) then cos(r * f_i) for f_i = base^(-i/(D/2-1)), i < D/2, computed in float32 as
    fairseq does; an odd D's last column zero, the row ``padding_idx`` zero. ``interleaved`` puts
    the sines and cosines of each frequency side by side instead."""
    half = dim // 2
    inv_freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(base) / (half - 1)))
    angles = torch.arange(rows, dtype=torch.int64).float().unsqueeze(1) * inv_freq.unsqueeze(0)  # (rows, half)
    if layout == "interleaved":
        table = torch.stack([angles.sin(), angles.cos()], dim=2).reshape(rows, 2 * half)
    else:
        table = torch.cat([angles.sin(), angles.cos()], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    if padding_idx is not None:
        table[padding_idx] = 0
    return table


def sinusoid_table(max_len: int, dim: int, *, base: float = 10000.0, layout: str = "interleaved") -> Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/D)), PE(pos, 2i+1) = cos(...) (Vaswani et al. 2017, sec. 3.5).

    ``interleaved`` puts sin/cos in alternate columns as the formula reads; ``concat`` puts all sines
    first, then all cosines (tensor2tensor, fairseq, Marian). Odd D gets a final sine column.
    fairseq's spacing of the frequencies: :func:`fairseq_sinusoid_table`.
    """
    half = (dim + 1) // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64) * 2 / dim)  # (half,)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (max_len, half)
    sin, cos = angles.sin(), angles.cos()[:, : dim // 2]
    if layout == "interleaved":
        table = torch.zeros(max_len, dim, dtype=torch.float64)
        table[:, 0::2], table[:, 1::2] = sin, cos
    else:
        table = torch.cat([sin, cos], dim=1)
    return table.float()


class SinusoidalPosition(TablePosition, DerivedBuffers):
    """A fixed sinusoid table: the paper's frequencies, or fairseq's (``spacing``). With
    ``padding_idx`` (fairseq's positions: M2M100, NLLB) position p reads row p + padding_idx + 1 and
    padding (the padding mask's, and tokens whose id is padding_idx, as HF reads them from the ids)
    the zero row padding_idx; the table has ``max_len + padding_idx + 1`` rows."""

    def __init__(self, dim: int, max_len: int, *, base: float = 10000.0, layout: str = "interleaved",
                 spacing: str = "paper", padding_idx: int | None = None) -> None:
        super().__init__()
        self.base, self.layout, self.spacing, self.padding_idx = base, layout, spacing, padding_idx
        self.offset = 0 if padding_idx is None else padding_idx + 1
        self.register_buffer("weight", self.table(max_len + self.offset, dim), persistent=False)

    def table(self, rows: int, dim: int) -> Tensor:
        """The [rows, dim] table this module holds."""
        if self.spacing == "fairseq":
            return fairseq_sinusoid_table(rows, dim, base=self.base, layout=self.layout, padding_idx=self.padding_idx)
        table = sinusoid_table(rows, dim, base=self.base, layout=self.layout)
        if self.padding_idx is not None:
            table[self.padding_idx] = 0
        return table

    def added_positions(self, positions: Tensor, padding_mask: Tensor | None, tokens: Tensor | None = None) -> Tensor:
        """With ``padding_idx``: padding -1 (so it reads the zero row padding_idx), the padding mask's
        and the tokens whose id is padding_idx (HF's ``create_position_ids_from_input_ids``)."""
        if self.padding_idx is None:
            return positions
        pad = None if padding_mask is None else ~padding_mask.to(torch.bool)
        if tokens is not None:
            pad = tokens.eq(self.padding_idx) if pad is None else pad | tokens.eq(self.padding_idx)
        return positions if pad is None else positions.expand(pad.shape).masked_fill(pad, -1)

    def reset_buffers(self) -> None:
        """Recompute the table in place, on its device, keeping its dtype."""
        with torch.device(self.weight.device):
            self.weight.copy_(self.table(*self.weight.shape))


def sincos_2d_table(grid: tuple[int, int], dim: int, *, base: float = 10000.0, extra_tokens: int = 0) -> Tensor:
    """MAE's 2-D table: half the channels encode the row, half the column, each as 1-D sin|cos.

    Rows are patches in raster order, after ``extra_tokens`` zero rows (the class token).
    """
    if dim % 4:
        raise ValueError(f"sincos2d needs d_model divisible by 4, got {dim}")
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    inv_freq = base ** (-torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))  # (D/4,)
    parts = []
    for coord in (xs.flatten(), ys.flatten()):  # MAE: first half width, second half height
        angles = coord[:, None] * inv_freq  # (N, D/4)
        parts += [angles.sin(), angles.cos()]
    table = torch.cat(parts, dim=1)  # (N, D)
    return torch.cat([torch.zeros(extra_tokens, dim, dtype=torch.float64), table]).float()


def resample_grid_table(table: Tensor, old: tuple[int, int], new: tuple[int, int], *, prefix: int = 0) -> Tensor:
    """A [prefix + old_h * old_w, D] table of grid positions fitted to a ``new`` grid: the grid rows
    resampled bicubically in float32 (antialiased, corners not aligned: timm's
    ``resample_abs_pos_embed``, which ``dynamic_img_size`` uses), the ``prefix`` rows kept."""
    if tuple(new) == tuple(old):
        return table
    head, grid = table[:prefix], table[prefix:]
    d = table.shape[-1]
    grid = grid.float().reshape(1, old[0], old[1], d).permute(0, 3, 1, 2)  # (1, D, h, w)
    grid = nn.functional.interpolate(grid, size=tuple(new), mode="bicubic", align_corners=False, antialias=True)
    return torch.cat([head, grid.permute(0, 2, 3, 1).reshape(-1, d).to(table.dtype)])


class SinCos2dPosition(TablePosition, DerivedBuffers):
    def __init__(self, dim: int, grid: tuple[int, int], *, base: float = 10000.0, extra_tokens: int = 0) -> None:
        super().__init__()
        self.grid, self.base, self.extra_tokens = grid, base, extra_tokens
        self.register_buffer("weight", sincos_2d_table(grid, dim, base=base, extra_tokens=extra_tokens), persistent=False)

    def reset_buffers(self) -> None:
        """Recompute the table in place, on its device, keeping its dtype."""
        with torch.device(self.weight.device):
            self.weight.copy_(sincos_2d_table(self.grid, self.weight.shape[1], base=self.base, extra_tokens=self.extra_tokens))

    def fit_grid(self, grid: tuple[int, int], *, trained: tuple[int, int], prefix: int) -> Tensor | None:
        """The table computed for ``grid`` (the prefix rows stay zero)."""
        table = sincos_2d_table(grid, self.weight.shape[1], base=self.base, extra_tokens=self.extra_tokens)
        return table.to(self.weight.device)


def alibi_slopes(n_heads: int) -> list[float]:
    """Head slopes of ALiBi (Press et al. 2022): a geometric sequence 2^(-8/n), 2^(-16/n), ...; for a
    head count that is not a power of two, the closest smaller power's slopes plus every other slope
    of the next power (the paper's recipe)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return slopes


class AlibiPosition(Position):
    """Linear distance penalty on attention scores: score(i, j) -= slope_h * |i - j|."""

    def bias(self, n_heads: int, q_positions: Tensor, k_positions: Tensor) -> AlibiBias:
        """The bias as structure (slopes and positions, :class:`zoo.kernels.AlibiBias`): the blocked and
        flex backends compute the pairs they visit; only the dense one makes the [B|1, H, Tq, Tk] tensor."""
        slopes = torch.tensor(alibi_slopes(n_heads), device=q_positions.device)  # (H,)
        return AlibiBias(slopes, q_positions, k_positions)


def relative_buckets(relative: Tensor, *, num_buckets: int, max_distance: int, bidirectional: bool) -> Tensor:
    """T5's buckets of ``relative`` = key position - query position (Raffel et al. 2020, sec. 2.1;
    Mesh TensorFlow's ``_relative_position_bucket``): half the buckets (of each direction, when
    ``bidirectional``) hold one distance each, the other half distances up to ``max_distance`` in
    logarithmically wider bins; farther distances share the last bucket. Unidirectional (causal)
    buckets count distances to earlier keys only (a later key is distance 0)."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets  # later keys: the upper half
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    far = exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)).long()
    far = far.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


class RelativeBiasPosition(Position, InitNormal):
    """T5's relative position bias: score(i, j) += weight[bucket(j - i), h], a learned scalar per
    bucket of distance and head (see :func:`relative_buckets`). ``bidirectional``: an encoder's
    buckets (keys before and after apart); else a causal stack's. Each stack has its own table
    (the builder makes one per stack), computed once per pass and shared by its layers."""

    init_normal = ("weight",)  # drawn N(0, init.std) by the model's initialisation, as embeddings

    def __init__(self, n_heads: int, *, num_buckets: int, max_distance: int, bidirectional: bool) -> None:
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.weight = nn.Parameter(torch.empty(num_buckets, n_heads))  # (buckets, H)
        nn.init.normal_(self.weight, std=0.02)

    def bias(self, n_heads: int, q_positions: Tensor, k_positions: Tensor) -> RelativeBias:
        """The bias as structure (the table, the bucketing and the positions,
        :class:`zoo.kernels.RelativeBias`): the blocked and flex backends compute the pairs they visit,
        only the dense one makes the [B|1, H, Tq, Tk] tensor; the table trains through either."""
        if n_heads != self.weight.shape[1]:
            raise ValueError(f"relative_bias: a table of {self.weight.shape[1]} heads cannot bias {n_heads} heads")
        buckets = functools.partial(relative_buckets, num_buckets=self.num_buckets, max_distance=self.max_distance,
                                    bidirectional=self.bidirectional)
        return RelativeBias(self.weight, q_positions, k_positions, buckets)

    def extra_repr(self) -> str:
        return (f"buckets={self.num_buckets}, heads={self.weight.shape[1]}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional}")


@register("position", "none")
def _none(spec, **_) -> Position:
    return NoPosition()


@register("position", "learned")
def _learned(spec, *, dim: int, max_len: int, **_) -> Position:
    return LearnedPosition(dim, max_len, getattr(spec, "offset", 0), padding_idx=getattr(spec, "padding_idx", None))


@register("position", "sinusoidal")
def _sinusoidal(spec, *, dim: int, max_len: int, **_) -> Position:
    return SinusoidalPosition(dim, max_len, base=spec.base, layout=spec.layout, spacing=getattr(spec, "spacing", "paper"),
                              padding_idx=getattr(spec, "padding_idx", None))


@register("position", "alibi")
def _alibi(spec, **_) -> Position:
    return AlibiPosition()


@register("position", "relative_bias")
def _relative_bias(spec, *, n_heads: int, causal: bool = False, **_) -> Position:
    return RelativeBiasPosition(n_heads, num_buckets=spec.num_buckets, max_distance=spec.max_distance,
                                bidirectional=not causal)


@register("position", "sincos2d")
def _sincos2d(spec, *, dim: int, grid: tuple[int, int], max_len: int, **_) -> Position:
    return SinCos2dPosition(dim, grid, base=spec.base, extra_tokens=max_len - grid[0] * grid[1])
