"""The scalings of RoPE's frequencies (``position: {kind: rope, scaling: {kind: ...}}``), each as
HF transformers computes it (``modeling_rope_utils.ROPE_INIT_FUNCTIONS``): ``linear``
(position interpolation), ``dynamic`` (NTK-aware, growing with the sequence), ``llama3``,
``yarn`` and ``longrope``. The frequencies themselves are :mod:`zoo.components.rope`.

A scaling is a closed choice of the rope position (:class:`~zoo.spec.base.Kinds`), not a
registered part. Lengths are in tokens; ``original_max_position_embeddings`` is the context the
model was pretrained with, and ``dynamic`` (and ``longrope`` without a ``factor``) read the model's
``max_seq_len`` as HF reads ``max_position_embeddings``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, ValidationInfo, field_validator

from zoo.spec.base import Kinds, Spec

__all__ = [
    "AnyRopeScaling", "DynamicScalingSpec", "LinearScalingSpec", "Llama3ScalingSpec", "LongRopeScalingSpec",
    "RopeScalingSpec", "YarnScalingSpec",
]

FACTOR = "how much longer a context the scaled frequencies serve (HF's factor), >= 1"
ORIGINAL = "the context length the model was pretrained with (HF's original_max_position_embeddings)"


class RopeScalingSpec(Spec):
    """A scaling of RoPE's frequencies; ``kind`` picks it. ``problems`` names what does not fit
    ``rotary_dims`` rotated dimensions (the rope's, after ``fraction``)."""

    kind: str

    def problems(self, *, rotary_dims: int, field: str) -> list[str]:
        return []


class LinearScalingSpec(RopeScalingSpec):
    """Position interpolation (Chen et al. 2023; kaiokendev): every frequency divided by ``factor``,
    i.e. positions squeezed ``factor`` times (HF ``rope_type: linear``; Gemma 3's global layers)."""

    kind: Literal["linear"] = Field("linear", description="linear: every frequency / factor")
    factor: float = Field(ge=1.0, description=FACTOR)


class DynamicScalingSpec(RopeScalingSpec):
    """Dynamic NTK scaling (bloc97, emozilla; HF ``rope_type: dynamic``): while the sequence is at
    most ``max_seq_len`` long the frequencies are the plain ones; past it, the base grows to
    base * (factor * L / max_seq_len - (factor - 1))^(R / (R - 2)) for a sequence of L tokens. As in
    HF, the frequencies are recomputed when a forward pass reaches a longer L than any before (keys
    already cached keep their rotation) and reset when one is shorter than ``max_seq_len`` again."""

    kind: Literal["dynamic"] = Field("dynamic", description="dynamic: NTK base growth past max_seq_len")
    factor: float = Field(ge=1.0, description=FACTOR)

    def problems(self, *, rotary_dims: int, field: str) -> list[str]:
        if rotary_dims <= 2:
            return [(f"{field}.kind: dynamic raises the base to the power R / (R - 2) for R rotated dimensions, so "
                     f"it needs R >= 4, got {rotary_dims}; rotate more dimensions or use another scaling")]
        return []


class Llama3ScalingSpec(RopeScalingSpec):
    """LLaMA 3.1's scaling (HF ``rope_type: llama3``): wavelengths shorter than
    original_max_position_embeddings / high_freq_factor keep their frequency, those longer than
    original_max_position_embeddings / low_freq_factor are divided by ``factor``, and those between
    are blended smoothly (equal factors: no band between, Llama 4 Scout's 1 and 1)."""

    kind: Literal["llama3"] = Field("llama3", description="llama3: LLaMA 3.1's frequency bands")
    factor: float = Field(ge=1.0, description=FACTOR + " (8 in LLaMA 3.1, 32 in LLaMA 3.2)")
    low_freq_factor: PositiveFloat = Field(description="wavelengths above original / low_freq_factor are divided by factor (1 in LLaMA 3.1)")
    high_freq_factor: PositiveFloat = Field(description="wavelengths below original / high_freq_factor are kept (4 in LLaMA 3.1)")
    original_max_position_embeddings: int = Field(ge=2, description=ORIGINAL + " (8192 in LLaMA 3.1)")

    @field_validator("high_freq_factor")
    @classmethod
    def _check_bands(cls, high: float, info: ValidationInfo) -> float:
        low = info.data.get("low_freq_factor")
        if low is not None and high < low:
            raise ValueError(f"must be at least low_freq_factor ({low}), got {high}: the frequencies between the "
                             f"two bands are blended; LLaMA 3.1 has low_freq_factor 1 and high_freq_factor 4")
        return high


class YarnScalingSpec(RopeScalingSpec):
    """YaRN (Peng et al. 2023; HF ``rope_type: yarn``): frequencies that turn more than ``beta_fast``
    times over the original context keep their value, those turning fewer than ``beta_slow`` times
    are divided by ``factor``, a linear ramp between; cos and sin are multiplied by the attention
    factor (so the scores by its square): ``attention_factor``, else 0.1 ln(factor) + 1, or with
    ``mscale`` and ``mscale_all_dim`` the ratio (0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim
    ln(factor) + 1) (DeepSeek)."""

    kind: Literal["yarn"] = Field("yarn", description="yarn: YaRN's ramp between kept and interpolated frequencies")
    factor: float = Field(ge=1.0, description=FACTOR)
    original_max_position_embeddings: int = Field(ge=2, description=ORIGINAL)
    beta_fast: PositiveFloat = Field(32.0, description="rotations over the original context above which a frequency is kept")
    beta_slow: PositiveFloat = Field(1.0, description="rotations below which a frequency is divided by factor")
    mscale: PositiveFloat | None = Field(None, description="with mscale_all_dim: the attention factor's numerator scale (DeepSeek); null: none")
    mscale_all_dim: PositiveFloat | None = Field(None, description="with mscale: the attention factor's denominator scale; null: none")
    attention_factor: PositiveFloat | None = Field(None, description="multiplies cos and sin; null: from factor (and mscale)")
    truncate: bool = Field(True, description="round the ramp's ends to whole dimensions (floor, ceil); false: exact (gpt-oss)")

    @field_validator("beta_slow")
    @classmethod
    def _check_ramp(cls, slow: float, info: ValidationInfo) -> float:
        fast = info.data.get("beta_fast")
        if fast is not None and slow > fast:
            raise ValueError(f"must be at most beta_fast ({fast}), got {slow}: the ramp runs from the frequencies "
                             f"turning beta_fast times over the original context down to beta_slow times; YaRN has 32 and 1")
        return slow

    @field_validator("mscale_all_dim")
    @classmethod
    def _check_mscales(cls, all_dim: float | None, info: ValidationInfo) -> float | None:
        if "mscale" in info.data and (info.data["mscale"] is None) != (all_dim is None):
            given, missing = ("mscale", "mscale_all_dim") if all_dim is None else ("mscale_all_dim", "mscale")
            raise ValueError(f"{given} is given without {missing}: the two set the attention factor together (HF "
                             f"ignores one alone); give both or neither")
        return all_dim


class LongRopeScalingSpec(RopeScalingSpec):
    """LongRoPE (Ding et al. 2024; Phi-3; HF ``rope_type: longrope``): each rotated pair's frequency
    divided by its own factor, ``short_factor`` while a forward pass's sequence is at most
    ``original_max_position_embeddings`` long and ``long_factor`` past it (keys already cached keep
    their rotation); cos and sin are multiplied by the attention factor: ``attention_factor``, else
    sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) (1 when factor <= 1)."""

    kind: Literal["longrope"] = Field("longrope", description="longrope: a factor per rotated pair, short and long")
    short_factor: list[PositiveFloat] = Field(description="one factor per rotated pair (rotated dimensions / 2), for sequences up to the original length")
    long_factor: list[PositiveFloat] = Field(description="one factor per rotated pair, for sequences past the original length")
    original_max_position_embeddings: int = Field(ge=2, description=ORIGINAL)
    factor: float | None = Field(None, ge=1.0, description="sets the default attention factor; null: max_seq_len / original_max_position_embeddings (Phi-3)")
    attention_factor: PositiveFloat | None = Field(None, description="multiplies cos and sin; null: from factor")

    def problems(self, *, rotary_dims: int, field: str) -> list[str]:
        pairs = rotary_dims // 2
        return [f"{field}.{name}: longrope has one factor per rotated pair of dimensions, {pairs} here ({rotary_dims} "
                f"rotated dimensions / 2), got {len(values)}; give {pairs} factors"
                for name, values in (("short_factor", self.short_factor), ("long_factor", self.long_factor))
                if len(values) != pairs]


SCALINGS: dict[str, type[RopeScalingSpec]] = {
    "linear": LinearScalingSpec, "dynamic": DynamicScalingSpec, "llama3": Llama3ScalingSpec, "yarn": YarnScalingSpec,
    "longrope": LongRopeScalingSpec,
}
AnyRopeScaling = Annotated[RopeScalingSpec, Kinds("rope scaling", SCALINGS)]
