"""The specs of positions: none, sinusoidal, learned, rope, rope2d, rope2d_mixed, alibi, relative_bias, relative_bias2d,
sincos2d (each a kind of the ``position`` registry; a model spec's ``position`` field takes any of them).

A position declares what the models and checks need to know of it as class variables (its
``layouts``, whether it ``adds`` a table, acts ``in_layers``, is ``resizable``), so no model or check
branches on its kind."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from zoo.spec.base import ComponentSpec, Dispatch, register_specs
from zoo.spec.rope import AnyRopeScaling

__all__ = ["AlibiSpec", "AnyPosition", "LearnedSpec", "NoPositionSpec", "PositionSpec", "RelativeBias2dSpec", "RelativeBiasSpec",
           "Rope2dMixedSpec", "Rope2dSpec", "RopeSpec", "SinCos2dSpec", "SinusoidalSpec"]


class PositionSpec(ComponentSpec):
    """Where order information enters: added to embeddings, rotating q/k, or biasing scores.

    What a kind declares (class variables, read by the families' checks):

    * ``layouts``: the token layouts it applies to, ``sequence`` (text) and/or ``grid`` (a ViT's
      patches); a family takes the kinds that name its layout.
    * ``in_layers``: it acts inside attention (rotates q/k or biases scores), so a layer may have a
      position of its own (``layers: [{at: ..., position: ...}]``: another RoPE base, none).
    * ``adds``: it adds a vector to each token (a table of rows).
    * ``resizable``: a ViT can fit it to another patch grid (``dynamic_size``).
    * ``per_stack``: each stack of the model has a module of its own (T5's relative bias: learned,
      and bidirectional or causal as the stack is); the model itself then adds nothing.
    * ``per_layer``: each layer has a module of its own (BEiT's 2-D relative bias: a learned table
      per layer); the model itself then adds nothing.
    """

    layouts: ClassVar[frozenset[str]] = frozenset({"sequence"})
    in_layers: ClassVar[bool] = False
    adds: ClassVar[bool] = False
    resizable: ClassVar[bool] = False
    per_stack: ClassVar[bool] = False
    per_layer: ClassVar[bool] = False

    def problems(self, *, d_model: int, head_dim: int, field: str) -> list[str]:
        """What does not fit a model of width ``d_model`` whose query/key heads are ``head_dim``
        wide, each line naming ``field`` (this position's dotted path) and the fix; [] when it fits."""
        return []


class NoPositionSpec(PositionSpec):
    """No order information (a bag of tokens; NoPE layers)."""

    kind: Literal["none"] = "none"
    layouts: ClassVar[frozenset[str]] = frozenset({"sequence", "grid"})
    in_layers: ClassVar[bool] = True
    resizable: ClassVar[bool] = True


class SinusoidalSpec(PositionSpec):
    """The paper's fixed sinusoids, frequencies base^(-2i/D). ``interleaved``: sin/cos alternate (the
    paper's formula); ``concat``: all sines then all cosines (HF Marian). tensor2tensor and fairseq
    also concatenate but space their frequencies as base^(-i/(D/2-1)) (``spacing: fairseq``, a
    slightly different table, HF M2M100 and NLLB); fairseq's table also numbers positions past a
    padding index (``padding_idx``), whose row is zero."""

    kind: Literal["sinusoidal"] = "sinusoidal"
    adds: ClassVar[bool] = True
    base: PositiveFloat = 10000.0
    layout: Literal["interleaved", "concat"] = "interleaved"
    spacing: Literal["paper", "fairseq"] = Field(
        "paper", description="the frequencies: paper, base^(-2i/D) for i < ceil(D/2) (an odd D's last column a sine); "
        "fairseq, base^(-i/(D/2-1)) for i < D/2 computed in float32 as fairseq and HF M2M100 do (an odd D's last "
        "column zero)",
    )
    padding_idx: NonNegativeInt | None = Field(
        None, description="fairseq's positions (HF M2M100, NLLB): position p reads row p + padding_idx + 1 of a table "
        "of max_seq_len + padding_idx + 1 rows, and padding (padding_mask false, or a token whose id is padding_idx) "
        "the zero row padding_idx; null: position p reads row p",
    )

    @property
    def offset(self) -> int:
        """Table rows before position 0: padding_idx + 1, or none."""
        return 0 if self.padding_idx is None else self.padding_idx + 1

    def problems(self, *, d_model: int, head_dim: int, field: str) -> list[str]:
        if self.spacing == "fairseq" and d_model < 4:
            return [f"{field}.spacing: fairseq's frequencies base^(-i/(D/2-1)) need d_model >= 4, got {d_model}; "
                    f"use spacing: paper"]
        return []


class LearnedSpec(PositionSpec):
    """A learned table of positions (GPT-2, BERT, ViT). ``offset``: position p reads row p + offset
    (BART's table starts at 2). ``padding_idx``, fairseq's positions (RoBERTa, XLM-R): the table's
    first padding_idx + 1 rows are read by no real token, the real tokens read the rows after them,
    and padding tokens the row padding_idx."""

    kind: Literal["learned"] = "learned"
    layouts: ClassVar[frozenset[str]] = frozenset({"sequence", "grid"})
    adds: ClassVar[bool] = True
    resizable: ClassVar[bool] = True
    offset: NonNegativeInt = Field(
        0, description="table rows before position 0: the table has max_seq_len + offset rows and position p reads "
        "row p + offset, the first offset rows never read (BART and mBART: 2, fairseq's padding index + 1); text only",
    )
    padding_idx: NonNegativeInt | None = Field(
        None, description="fairseq's positions (RoBERTa, XLM-R): the real tokens read rows "
        "padding_idx + 1, padding_idx + 2, ... (counting real tokens, as without it) and padding tokens (padding_mask "
        "false) row padding_idx, so the table has max_seq_len + padding_idx + 1 rows (HF's max_position_embeddings); "
        "null: rows 0, 1, ... of a max_seq_len table; not with offset",
    )

    @model_validator(mode="after")
    def _one_offset(self) -> LearnedSpec:
        if self.offset and self.padding_idx is not None:
            raise ValueError(f"position.offset ({self.offset}) and position.padding_idx ({self.padding_idx}): the "
                             "padding index sets the offset (padding_idx + 1); give one of them")
        return self


class RopeSpec(PositionSpec):
    """Rotary embeddings. ``pairs`` says which dimensions turn together: ``half``, i with i + R/2
    (GPT-NeoX, HF LLaMA), or ``interleaved``, 2i with 2i + 1 (the paper, GPT-J, Cohere). ``fraction``
    < 1 rotates only the first ``int(fraction * head size)`` dimensions of each query and key head and passes the rest through
    (partial rotary, GPT-NeoX's ``rotary_pct``). ``scaling`` changes the frequencies for contexts
    longer than the model was pretrained with, as HF's ``rope_parameters`` do (``linear``,
    ``dynamic``, ``llama3``, ``yarn``, ``longrope``)."""

    kind: Literal["rope"] = "rope"
    in_layers: ClassVar[bool] = True
    base: PositiveFloat = 10000.0
    fraction: float = Field(
        1.0, gt=0.0, le=1.0,
        description="share of each query/key head's dimensions that rotate: the first int(fraction * head size) (GPT-NeoX's rotary_pct)",
    )
    scaling: AnyRopeScaling | None = Field(
        None, description="a scaling of the frequencies, chosen by kind: linear, dynamic, llama3, yarn, longrope; "
        "null: the plain frequencies base^(-2i/R)",
    )
    pairs: Literal["half", "interleaved"] = Field(
        "half", description="which dimensions turn together at frequency i of R rotated ones: half, i and i + R/2 "
        "(rotate-half: GPT-NeoX, LLaMA); interleaved, 2i and 2i + 1 (the paper, GPT-J, Cohere)",
    )

    def rotary_dims(self, head_dim: int) -> int:
        """The rotated dimensions of a query/key head of ``head_dim``: ``int(head_dim * fraction)``,
        as HF computes ``partial_rotary_factor``."""
        return int(head_dim * self.fraction)

    def problems(self, *, d_model: int, head_dim: int, field: str) -> list[str]:
        rotated = self.rotary_dims(head_dim)
        if self.fraction == 1.0 and rotated % 2:
            return [f"{field}.kind: rope rotates pairs of dimensions, so the query/key head size must be even, "
                    f"got {head_dim}; change n_heads or set block.attention.head_dim"]
        if rotated % 2 or rotated == 0:
            return [f"{field}.fraction: rope rotates pairs of dimensions, so int(head size * fraction) must be even "
                    f"and positive, got int({head_dim} * {self.fraction}) = {rotated}; choose a fraction that rotates "
                    f"an even count"]
        if self.scaling is not None:
            return self.scaling.problems(rotary_dims=rotated, field=f"{field}.scaling")
        return []


class Rope2dSpec(PositionSpec):
    """Rotary embeddings on a ViT's patch grid (EVA-02; timm's ``RotaryEmbeddingCat``): the first half of
    each query/key head turns with the patch's row, the second half with its column, in interleaved
    pairs (dimensions 2i and 2i + 1), at the frequencies base^(-i/(K/4)) for i < K/4. The class token
    and the registers are not turned. ``ref_grid`` stretches the coordinates of an h x w grid to
    ``ref_grid`` cells a side (row * ref_grid / h): a model fine-tuned at another size keeps the turns
    it was pretrained with (timm's ``ref_feat_shape``).

    DINOv3 (timm's ``RotaryEmbeddingDinoV3``) is ``coords: centered, pairs: half``: each side's patch
    centres mapped to [-1, 1] ((row + 0.5) / h * 2 - 1), turned by 2 pi times that over the periods
    base^(i/(K/4)), and dimension i paired with i + K/2 (row bands, then column bands, in each half)."""

    kind: Literal["rope2d"] = "rope2d"
    layouts: ClassVar[frozenset[str]] = frozenset({"grid"})
    in_layers: ClassVar[bool] = True
    resizable: ClassVar[bool] = True
    base: PositiveFloat = Field(10000.0, description="the frequencies' base (timm's rope_temperature)")
    ref_grid: PositiveInt | None = Field(
        None, description="patches a side the coordinates are stretched to (timm's ref_feat_shape; EVA-02: 16); "
        "null: the grid's own row and column indices"
    )
    coords: Literal["index", "centered"] = Field(
        "index", description="index: row and column indices (EVA-02); centered: patch centres mapped to [-1, 1] on "
        "each side and the angles times 2 pi (DINOv3)"
    )
    pairs: Literal["interleaved", "half"] = Field(
        "interleaved", description="which dimensions turn together: interleaved, 2i with 2i + 1 (EVA-02); half, i with "
        "i + K/2 (DINOv3; timm's rope_rotate_half)"
    )

    def problems(self, *, d_model: int, head_dim: int, field: str) -> list[str]:
        if head_dim % 4:
            return [f"{field}.kind: rope2d turns pairs of dimensions by row and by column, so the query/key head size "
                    f"must be divisible by 4, got {head_dim}; change n_heads or set block.attention.head_dim"]
        if self.coords == "centered" and self.ref_grid is not None:
            return [f"{field}.ref_grid: centered coordinates are already relative to the grid's sides; set ref_grid: "
                    f"null or coords: index"]
        return []


class Rope2dMixedSpec(PositionSpec):
    """RoPE-Mixed (Heo et al. 2024; timm's ``RotaryEmbeddingMixed``, ``rope_type='mixed'``): 2-D rotary
    embeddings whose frequencies are learned, per layer and per head. Each layer holds ``freqs`` [2, H,
    K/2]: the interleaved pair (2j, 2j + 1) of head h turns by x * freqs[0, h, j] + y * freqs[1, h, j],
    x the patch's column and y its row (``indexing: xy``; ``ij``: x the row, y the column). They start
    at the magnitudes base^(-4i/K), i < K/4, each head's pointed along a random direction a and its
    second quarter along a + 90 degrees (timm's ``init_random_2d_freqs``). The class token and the
    registers are not turned; any grid is turned by its own indices (nothing to resample). Each
    layer has a module of its own (``per_layer``)."""

    kind: Literal["rope2d_mixed"] = "rope2d_mixed"
    layouts: ClassVar[frozenset[str]] = frozenset({"grid"})
    in_layers: ClassVar[bool] = True
    resizable: ClassVar[bool] = True
    per_layer: ClassVar[bool] = True
    base: PositiveFloat = Field(10.0, description="the initial frequencies' base (timm's rope_temperature; RoPE-Mixed: 10)")
    indexing: Literal["xy", "ij"] = Field(
        "xy", description="which coordinate each frequency table multiplies: xy, freqs[0] the column and freqs[1] the "
        "row (timm's rope_grid_indexing='xy', RoPE-ViT's checkpoints); ij, freqs[0] the row"
    )

    def problems(self, *, d_model: int, head_dim: int, field: str) -> list[str]:
        if head_dim % 4:
            return [f"{field}.kind: rope2d_mixed starts from magnitudes for every fourth dimension, so the query/key "
                    f"head size must be divisible by 4, got {head_dim}; change n_heads or set block.attention.head_dim"]
        return []


class AlibiSpec(PositionSpec):
    """Linear biases on attention scores (Press et al. 2022)."""

    kind: Literal["alibi"] = "alibi"
    in_layers: ClassVar[bool] = True


class RelativeBiasSpec(PositionSpec):
    """T5's relative position bias (Raffel et al. 2020, sec. 2.1): a learned scalar per head for each
    bucket of key-minus-query distance, added to the scores. Half the buckets hold one distance
    each, the rest logarithmically wider bins up to ``max_distance``; farther keys share the last.
    Each stack has a table of its own (``per_stack``), with buckets for both directions in a
    bidirectional stack (an encoder) and for earlier keys only in a causal one (a decoder);
    cross-attention has none."""

    kind: Literal["relative_bias"] = "relative_bias"
    in_layers: ClassVar[bool] = True
    per_stack: ClassVar[bool] = True
    num_buckets: PositiveInt = Field(32, description="buckets of distance per direction set (T5: 32)")
    max_distance: PositiveInt = Field(128, description="distances from here on share the last bucket (T5: 128)")

    def problems(self, *, d_model: int, head_dim: int, field: str) -> list[str]:
        if self.num_buckets < 4:
            return [f"{field}.num_buckets: a bidirectional stack splits the buckets by direction, then into exact and "
                    f"logarithmic halves, so num_buckets >= 4, got {self.num_buckets}; use e.g. 32"]
        if self.max_distance <= self.num_buckets // 2:
            return [f"{field}.max_distance: the logarithmic buckets reach from num_buckets // 2 ({self.num_buckets // 2}) "
                    f"to max_distance, so it must be larger, got {self.max_distance}; use e.g. {4 * self.num_buckets}"]
        return []


class RelativeBias2dSpec(PositionSpec):
    """BEiT's 2-D relative position bias (Bao et al. 2022; timm's ``Beit`` with ``use_rel_pos_bias``):
    a learned scalar per head for each (row, column) offset between two patches of the h x w grid,
    (2h - 1)(2w - 1) rows, and three more: a prefix token (the class token) as query to a patch, a
    patch to a prefix token, and prefix to prefix, added to the scores. Each layer has a table of its
    own (``per_layer``), laid out as timm's ``relative_position_bias_table`` [rows, heads]. The table
    is sized by the model's grid, so the image size is fixed (no ``dynamic_size``)."""

    kind: Literal["relative_bias2d"] = "relative_bias2d"
    layouts: ClassVar[frozenset[str]] = frozenset({"grid"})
    in_layers: ClassVar[bool] = True
    per_layer: ClassVar[bool] = True


class SinCos2dSpec(PositionSpec):
    """Fixed 2-D sin-cos table over the patch grid (ViT; MAE layout, zero row for the class token)."""

    kind: Literal["sincos2d"] = "sincos2d"
    layouts: ClassVar[frozenset[str]] = frozenset({"grid"})
    adds: ClassVar[bool] = True
    resizable: ClassVar[bool] = True
    base: PositiveFloat = 10000.0

    def problems(self, *, d_model: int, head_dim: int, field: str) -> list[str]:
        if d_model % 4:
            return [f"{field}.kind: sincos2d splits d_model in four (row/column x sin/cos); d_model ({d_model}) must "
                    f"be divisible by 4"]
        return []


AnyPosition = Annotated[ComponentSpec, Dispatch("position")]

register_specs("position", PositionSpec, {"none": NoPositionSpec, "sinusoidal": SinusoidalSpec, "learned": LearnedSpec,
                                          "rope": RopeSpec, "alibi": AlibiSpec, "relative_bias": RelativeBiasSpec,
                                          "relative_bias2d": RelativeBias2dSpec,
                                          "sincos2d": SinCos2dSpec, "rope2d": Rope2dSpec,
                                          "rope2d_mixed": Rope2dMixedSpec})
