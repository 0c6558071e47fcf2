"""Rotary position embeddings: the rotation, and the frequencies of each scaling
(:mod:`zoo.spec.rope`) computed exactly as HF transformers computes them
(``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` and ``dynamic_rope_update``): the same float32
arithmetic in the same order, so a converted model's rotations agree with HF's bit for bit.

Each frequency function returns ``(inv_freq [R/2], attention_factor)``: the turning rate of each
rotated pair, and the factor cos and sin are multiplied by (1 but for yarn and longrope).

Shapes: B batch, H query heads, G key/value heads, T sequence, K head size, R rotated dimensions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from zoo.components.position import Position
from zoo.protocols import DerivedBuffers
from zoo.registry import register

__all__ = ["RotaryPosition", "rope_frequencies", "rotate_half", "rotate_pairs", "scaled_frequencies"]


def rotate_half(x: Tensor) -> Tensor:
    """[x_1 | x_2] -> [-x_2 | x_1]: dimension i turned a quarter with i + R/2."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rotate_pairs(x: Tensor) -> Tensor:
    """[x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...]: each interleaved pair turned a quarter (HF
    Cohere's rotate_half)."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)


def _exponents(dim: int, device: torch.device | None = None) -> Tensor:
    """2i/R for i < R/2, in float32 (HF: ``arange(0, dim, 2, dtype=int64).float() / dim``)."""
    return torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim


def rope_frequencies(dim: int, base: float, device: torch.device | None = None) -> Tensor:
    """base^(-2i/R) for i < R/2: the turning rate of each rotated pair, as HF computes it,
    1 / base^(2i/R) in float32."""
    return 1.0 / (base ** _exponents(dim, device))  # (R/2,)


def _linear(dim: int, base: float, s, **_) -> tuple[Tensor, float]:
    return rope_frequencies(dim, base) / s.factor, 1.0


def _dynamic(dim: int, base: float, s, *, max_len: int, seq_len: int | None = None, **_) -> tuple[Tensor, float]:
    """HF's ``_compute_dynamic_ntk_parameters``: at build time (``seq_len`` None) in Python floats,
    later for a sequence of ``seq_len`` tokens in float32 tensors, as HF's forward pass computes it."""
    factor = s.factor
    if seq_len is None:
        grown = base * ((factor * max_len / max_len) - (factor - 1)) ** (dim / (dim - 2))
    else:
        length = torch.maximum(torch.tensor(seq_len), torch.tensor(max_len))
        grown = base * ((factor * length / max_len) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (grown ** _exponents(dim)), 1.0


def _llama3(dim: int, base: float, s, **_) -> tuple[Tensor, float]:
    """HF's ``_compute_llama3_parameters``."""
    inv_freq = rope_frequencies(dim, base)
    factor, low, high, old = s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)  # long wavelengths: / factor
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


def _mscale(scale: float, mscale: float = 1) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(s) -> float:
    """The factor cos and sin are multiplied by: ``attention_factor``, else from ``factor`` (and
    ``mscale``, ``mscale_all_dim``)."""
    if s.attention_factor is not None:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return float(_mscale(s.factor, s.mscale) / _mscale(s.factor, s.mscale_all_dim))
    return _mscale(s.factor)


def _yarn(dim: int, base: float, s, **_) -> tuple[Tensor, float]:
    """HF's ``_compute_yarn_parameters``."""
    factor, original = s.factor, s.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:  # the dimension turning ``rotations`` times over the context
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent a singularity
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1: the frequency kept (extrapolated), 0: divided by factor (interpolated)
    return interpolation * (1 - keep) + extrapolation * keep, yarn_attention_factor(s)


def longrope_factor(s, max_len: int) -> float:
    """``factor``, else max_seq_len / original_max_position_embeddings (Phi-3's)."""
    return s.factor if s.factor is not None else max_len / s.original_max_position_embeddings


def _longrope(dim: int, base: float, s, *, max_len: int, seq_len: int | None = None, **_) -> tuple[Tensor, float]:
    """HF's ``_compute_longrope_parameters``: ``long_factor`` for a sequence longer than the original
    context, else ``short_factor``."""
    factor, original = longrope_factor(s, max_len), s.original_max_position_embeddings
    attention = s.attention_factor
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    long = bool(seq_len) and seq_len > original
    ext = torch.tensor(s.long_factor if long else s.short_factor, dtype=torch.float32)
    return 1.0 / (ext * base ** _exponents(dim)), attention


_SCALED = {"linear": _linear, "dynamic": _dynamic, "llama3": _llama3, "yarn": _yarn, "longrope": _longrope}


def scaled_frequencies(dim: int, base: float, scaling=None, *, max_len: int | None = None,
                       seq_len: int | None = None) -> tuple[Tensor, float]:
    """(inv_freq [R/2], attention factor) of ``dim`` = R rotated dimensions with ``scaling`` (a
    :class:`~zoo.spec.rope.RopeScalingSpec`, or None for the plain frequencies), as HF's
    ``ROPE_INIT_FUNCTIONS[kind](config, seq_len=seq_len)`` with ``max_position_embeddings`` =
    ``max_len`` (the model's max_seq_len: dynamic and longrope read it)."""
    if scaling is None:
        return rope_frequencies(dim, base), 1.0
    return _SCALED[scaling.kind](dim, base, scaling, max_len=max_len, seq_len=seq_len)


class RotaryPosition(Position, DerivedBuffers):
    """RoPE (Su et al. 2021) in the rotate-half layout of GPT-NeoX and HF LLaMA: dimension i pairs
    with i + K/2, and the pair turns by angle position * base^(-2i/K); with ``interleaved`` the
    paper's layout (GPT-J, Cohere): dimension 2i pairs with 2i + 1, turning by the same angle.

    ``rotary_dims`` R < K (partial rotary, GPT-NeoX): only the first R dimensions of each head turn,
    in the same layout within them (i pairs with i + R/2, angle position * base^(-2i/R)); the other
    K - R pass through unchanged.

    ``scaling`` (a :class:`~zoo.spec.rope.RopeScalingSpec`) changes the frequencies as HF does, and
    for yarn and longrope multiplies cos and sin by an attention factor. Two kinds depend on the
    longest position a forward pass sees, L = max(positions) + 1, as in HF's ``dynamic_rope_update``:
    ``longrope`` turns by its long factors when L > original_max_position_embeddings, else its short
    ones; ``dynamic`` recomputes its frequencies for L when L exceeds every length before (starting
    from ``max_len``, HF's max_position_embeddings) and returns to the plain ones when L <
    ``max_len`` after growing. The dynamic kind is thus stateful, as HF's module is: in cached
    decoding each step's keys keep the rotation of the step that made them."""

    def __init__(self, head_dim: int, *, base: float = 10000.0, rotary_dims: int | None = None, scaling=None,
                 max_len: int | None = None, interleaved: bool = False) -> None:
        super().__init__()
        self.head_dim, self.base, self.scaling, self.interleaved = head_dim, base, scaling, interleaved
        self.rotary_dims = rotary_dims or head_dim
        self.original_len = max_len  # HF's max_position_embeddings: where dynamic scaling starts
        if scaling is not None and scaling.kind in ("dynamic", "longrope") and max_len is None:
            raise ValueError(f"RotaryPosition: {scaling.kind} scaling needs max_len (the model's max_seq_len)")
        inv_freq, self.attention_factor = scaled_frequencies(self.rotary_dims, base, scaling, max_len=max_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if self.kind == "dynamic":  # the plain frequencies to return to, and the longest length seen
            self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)
            self.seen_len = max_len
        if self.kind == "longrope":  # inv_freq holds the short factors' frequencies
            self.register_buffer("long_inv_freq", self._frequencies_for(self._long_len()), persistent=False)

    @property
    def kind(self) -> str | None:
        return None if self.scaling is None else self.scaling.kind

    @property
    def reads_host(self) -> bool:
        return self.kind == "dynamic"  # its frequencies follow the longest position, read on the host

    def _frequencies_for(self, seq_len: int | None) -> Tensor:
        return scaled_frequencies(self.rotary_dims, self.base, self.scaling, max_len=self.original_len,
                                  seq_len=seq_len)[0]

    def _long_len(self) -> int:
        """A length past longrope's original context (HF computes its long frequencies for this one)."""
        return self.scaling.original_max_position_embeddings + 1

    def reset_buffers(self) -> None:
        """Recompute the frequencies in place, on their device, keeping their dtype (a dynamic
        scaling starts again from the plain frequencies)."""
        with torch.device(self.inv_freq.device):
            self.inv_freq.copy_(self._frequencies_for(None))
            if self.kind == "dynamic":
                self.original_inv_freq.copy_(self.inv_freq)
                self.seen_len = self.original_len
            if self.kind == "longrope":
                self.long_inv_freq.copy_(self._frequencies_for(self._long_len()))

    def frequencies(self, positions: Tensor) -> Tensor:
        """The frequencies [R/2] that turn ``positions`` ([T] or [B, T]), the dynamic state updated."""
        if self.kind == "longrope":
            seq_len = positions.max() + 1  # a tensor: no host sync
            return torch.where(seq_len > self.scaling.original_max_position_embeddings, self.long_inv_freq, self.inv_freq)
        if self.kind == "dynamic":
            seq_len = int(positions.max()) + 1
            seen = self.seen_len
            if seq_len > seen:  # growth: the frequencies for this length
                with torch.device(self.inv_freq.device):
                    self.inv_freq.copy_(self._frequencies_for(seq_len))
                self.seen_len = seq_len
            if seq_len < self.original_len < seen:  # back within the original length: the plain ones
                self.inv_freq.copy_(self.original_inv_freq)
                self.seen_len = self.original_len
        return self.inv_freq

    def rotation(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin) [T, R] or [B, 1, T, R] in fp32 for ``positions`` ([T] or [B, T]): once per forward
        pass for all the layers this module serves (the dynamic state updated once)."""
        inv_freq = self.frequencies(positions)
        angles = positions.to(inv_freq.dtype)[..., None] * inv_freq  # ([B,] T, R/2)
        angles = angles.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat([angles, angles], dim=-1)
        if angles.dim() == 3:  # per-row positions: (B, T, R) -> (B, 1, T, R)
            angles = angles[:, None]
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """q, k rotated at ``positions``, or by their :meth:`rotation` (cos, sin) made once a pass."""
        cos, sin = self.rotation(positions) if isinstance(positions, Tensor) else positions
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        rotate = rotate_pairs if self.interleaved else rotate_half

        def turn(x: Tensor) -> Tensor:
            if self.rotary_dims == x.shape[-1]:
                return x * cos + rotate(x) * sin
            x, rest = x[..., : self.rotary_dims], x[..., self.rotary_dims :]
            return torch.cat([x * cos + rotate(x) * sin, rest], dim=-1)

        return turn(q), turn(k)


@register("position", "rope")
def _rope(spec, *, head_dim: int, max_len: int, **_) -> Position:
    return RotaryPosition(head_dim, base=spec.base, rotary_dims=spec.rotary_dims(head_dim), scaling=spec.scaling,
                          max_len=max_len, interleaved=spec.pairs == "interleaved")
