"""The specs of whole models: the fields every family shares (:class:`FamilySpec`: width, depth,
the block's parts, positions, dropout, initialisation) and the four families, decoder, encoder,
encoder-decoder and ViT, with the cross-field rules that name the field and the fix."""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_validator

from zoo.registry import registry
from zoo.spec.base import Dispatch, Rate, Spec, register_specs
from zoo.spec.parts import (
    FFN,
    Attention,
    AttentionSpec,
    ClsPoolSpec,
    LayerNormSpec,
    LearnedSpec,
    MapPoolSpec,
    Norm,
    Pool,
    Position,
    ReluFFNSpec,
    SinusoidalSpec,
)

__all__ = [
    "BlockSpec", "ClassifierSpec", "ConvStemSpec", "DecoderSpec", "DropoutSpec", "EmbeddingSpec", "EncoderDecoderSpec",
    "EncoderSpec", "FamilySpec", "InitSpec", "MLMHeadSpec", "ModelSpec", "ParallelSpec", "TextSpec", "VitSpec",
]


# ------------------------------------------------------------------------------------ shared pieces
class ParallelSpec(Spec):
    """Attention and FFN side by side on the same input, both added to it (Wang & Komatsuzaki 2021,
    GPT-J; GPT-NeoX; PaLM): ``x + attn(norm1(x)) + ffn(norm2(x))``, or with ``shared_norm``
    ``x + attn(norm(x)) + ffn(norm(x))``. Needs pre-norm placement."""

    shared_norm: bool = Field(False, description="one norm feeds attention and FFN (GPT-J, PaLM); false: each has its own (GPT-NeoX)")


class BlockSpec(Spec):
    """One layer: self-attention [+ cross-attention] + FFN, each with a residual and a norm.

    ``layer_scale`` (LayerScale, Touvron et al. 2021, CaiT; DeiT III; timm's ``init_values``)
    multiplies each sub-layer's output by a learned per-channel vector, initialised to this value,
    before the residual add (in both placements: Post-Norm adds the scaled output, then norms)."""

    attention: Attention = Field(default_factory=AttentionSpec)
    cross_attention: Attention | None = Field(None, description="encoder-decoder only; default: as attention")
    ffn: FFN = Field(default_factory=ReluFFNSpec)
    norm: Norm = Field(default_factory=LayerNormSpec)
    layer_scale: float | None = Field(
        None, description="initial value of the per-channel scale on each sub-layer's output (e.g. 1e-5); null: none"
    )
    parallel: ParallelSpec | None = Field(
        None, description="attention and FFN side by side (GPT-NeoX, GPT-J, PaLM); null: one after the other"
    )

    @field_validator("layer_scale")
    @classmethod
    def _check_layer_scale(cls, value: float | None) -> float | None:
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(
                f"layer_scale is the initial value of the scales and must be a positive number, got {value!r}; "
                f"use a small value such as 1e-5 (CaiT) or 1e-6 (DeiT III), or null for no layer scale"
            )
        return value

    @property
    def cross(self) -> AttentionSpec:
        return self.cross_attention or self.attention


class DropoutSpec(Spec):
    """Dropout rates. The paper's P_drop is ``embedding`` (on the embedding + position sum) and
    ``residual`` (on each sub-layer output before the residual add)."""

    embedding: Rate = 0.0
    residual: Rate = 0.0
    attention: Rate = Field(0.0, description="on the attention weights")
    ffn: Rate = Field(0.0, description="on the FFN's hidden activation")


class InitSpec(Spec):
    """Weight initialisation. ``normal``: N(0, std) for linear and embedding weights (GPT-2, BERT);
    ``xavier``: Xavier-uniform linears and N(0, d_model^-1/2) embeddings (the paper, fairseq);
    ``trunc_normal``: N(0, std) truncated at +-2 (timm ViT's ``trunc_normal_(std=.02)``). ``scaled_residual`` divides the std of each
    residual output projection by sqrt(2 * n_layers) (GPT-2)."""

    scheme: Literal["normal", "xavier", "trunc_normal"] = "normal"
    std: PositiveFloat = 0.02
    scaled_residual: bool = False


class EmbeddingSpec(Spec):
    """Token embedding options: ``scale`` multiplies by sqrt(d_model) (the paper); ``norm`` puts a
    norm after the embedding sum (BERT)."""

    scale: bool = False
    norm: bool = False
    round_scale: bool = Field(
        False,
        description="round sqrt(d_model) to the weights' dtype before multiplying (HF Gemma's normalizer; "
        "the same in float32, different in bfloat16); needs scale",
    )

    @model_validator(mode="after")
    def _check_round(self) -> EmbeddingSpec:
        if self.round_scale and not self.scale:
            raise ValueError("round_scale: rounds the sqrt(d_model) scale, so it needs scale: true; set scale: true or round_scale: false")
        return self


class FamilySpec(Spec):
    """Fields every model family has."""

    family: str
    name: str | None = Field(None, description="a label; never changes behaviour")
    d_model: PositiveInt = 512
    n_layers: PositiveInt = 6
    block: BlockSpec = Field(default_factory=BlockSpec)
    position: Position = Field(default_factory=SinusoidalSpec)
    dropout: DropoutSpec = Field(default_factory=DropoutSpec)
    init: InitSpec = Field(default_factory=InitSpec)


    @model_validator(mode="after")
    def _check_shared(self) -> FamilySpec:
        d, att = self.d_model, self.block.attention
        problems = []
        for field, spec in (("attention", att), ("cross_attention", self.block.cross_attention)):
            if not isinstance(spec, AttentionSpec):
                continue
            if (spec.head_dim is None or spec.v_head_dim is None) and d % spec.n_heads:
                divisors = [h for h in range(1, min(d, 64) + 1) if d % h == 0]
                problems.append(
                    f"block.{field}.n_heads: d_model ({d}) must be divisible by n_heads ({spec.n_heads}); "
                    f"choose n_heads from {divisors} or set head_dim and v_head_dim"
                )
        if self.position.kind == "rope" and isinstance(att, AttentionSpec):
            fraction, rotated = self.position.fraction, self.position.rotary_dims(att.qk_size(d))
            if fraction == 1.0 and rotated % 2:
                problems.append(
                    f"position.kind: rope rotates pairs of dimensions, so the query/key head size must be even, "
                    f"got {att.qk_size(d)} (d_model {d} / n_heads {att.n_heads}); change n_heads or set block.attention.head_dim"
                )
            elif rotated % 2 or rotated == 0:
                problems.append(
                    f"position.fraction: rope rotates pairs of dimensions, so int(head size * fraction) must be even and "
                    f"positive, got int({att.qk_size(d)} * {fraction}) = {rotated}; choose a fraction that rotates an even count"
                )
        for field, spec in (("attention", att), ("cross_attention", self.block.cross_attention)):
            if getattr(spec, "window", None) is not None and self.family != "decoder":
                problems.append(
                    f"block.{field}.window: sliding-window attention is causal self-attention, which family "
                    f"{self.family} does not have (only decoder); remove it"
                )
        if self.block.parallel is not None:
            if self.norm_placement != "pre":
                problems.append(
                    f"block.parallel: a parallel block normalises the input of attention and FFN (block.norm.placement: pre), "
                    f"but block.norm.placement is {self.norm_placement}; set block.norm.placement: pre or block.parallel: null"
                )
            if self.family == "encoder_decoder":
                problems.append(
                    "block.parallel: a parallel block has self-attention and FFN only, not the cross-attention of "
                    "family encoder_decoder; set block.parallel: null"
                )
        if self.block.cross_attention is not None and self.family != "encoder_decoder":
            problems.append(
                f"block.cross_attention: family {self.family} has no cross-attention (only encoder_decoder); remove it"
            )
        if self.init.scaled_residual and self.init.scheme == "xavier":
            problems.append("init.scaled_residual: applies to scheme normal or trunc_normal, not xavier; set it to false")
        allowed = self._allowed_positions()
        if self.position.kind not in allowed:
            problems.append(
                f"position.kind: {self.position.kind!r} does not apply to family {self.family}; use one of {', '.join(allowed)}"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    _foreign_positions: ClassVar[frozenset[str]] = frozenset({"sincos2d"})  # built-in kinds that do not apply

    def _allowed_positions(self) -> list[str]:
        return [n for n in registry("position").names() if n not in self._foreign_positions]

    @property
    def norm_placement(self) -> str:
        return getattr(self.block.norm, "placement", "pre")

    @property
    def has_final_norm(self) -> bool:
        """A norm after the last block: pre-norm and post-sublayer stacks end unnormalised without one;
        a post-norm stack already ends in a norm."""
        return self.norm_placement != "post"


class TextSpec(FamilySpec):
    vocab_size: PositiveInt = 32000
    max_seq_len: PositiveInt = Field(1024, description="longest sequence; sizes learned and sinusoidal tables")
    embedding: EmbeddingSpec = Field(default_factory=EmbeddingSpec)
    tie_embeddings: bool = Field(True, description="the output projection shares the token embedding")
    head_bias: bool = Field(False, description="a bias on the output projection")


class DecoderSpec(TextSpec):
    """GPT-style decoder-only language model: ``model(tokens[B,T]) -> logits[B,T,V]``."""

    family: Literal["decoder"] = "decoder"
    init: InitSpec = Field(default_factory=lambda: InitSpec(scheme="normal", std=0.02, scaled_residual=True))


class MLMHeadSpec(Spec):
    """Masked-LM head: optional transform (linear + GELU + norm, as BERT) before the projection."""

    transform: bool = True


class ClassifierSpec(Spec):
    """Sequence classification: pool the first token (optionally through a tanh ``pooler`` linear,
    as BERT), dropout, linear to ``num_labels``."""

    num_labels: PositiveInt = 2
    pooler: bool = True
    dropout: Rate = 0.1


class EncoderSpec(TextSpec):
    """BERT-style bidirectional encoder: ``model(tokens[B,T], padding_mask) -> logits[B,T,V]``."""

    family: Literal["encoder"] = "encoder"
    type_vocab_size: NonNegativeInt = Field(0, description="segment (token type) embeddings; 0 for none")
    mlm_head: MLMHeadSpec = Field(default_factory=MLMHeadSpec)
    head_bias: bool = True
    classifier: ClassifierSpec | None = None


class EncoderDecoderSpec(TextSpec):
    """The original Transformer: ``model(src[B,S], tgt_in[B,T], masks) -> logits[B,T,V]``."""

    family: Literal["encoder_decoder"] = "encoder_decoder"
    n_encoder_layers: PositiveInt | None = Field(None, description="default: n_layers")
    n_decoder_layers: PositiveInt | None = Field(None, description="default: n_layers")
    src_vocab_size: PositiveInt | None = Field(None, description="default: vocab_size (a shared vocabulary)")
    share_embeddings: bool = Field(True, description="source and target embeddings are one matrix")
    init: InitSpec = Field(default_factory=lambda: InitSpec(scheme="xavier"))

    @model_validator(mode="after")
    def _check_sharing(self) -> EncoderDecoderSpec:
        if self.share_embeddings and self.src_vocab_size not in (None, self.vocab_size):
            raise ValueError(
                f"share_embeddings: source and target embeddings can only be shared with one vocabulary, "
                f"but src_vocab_size ({self.src_vocab_size}) != vocab_size ({self.vocab_size}); "
                f"set share_embeddings: false or make the sizes equal"
            )
        return self

    @property
    def encoder_layers(self) -> int:
        return self.n_encoder_layers or self.n_layers

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    @property
    def source_vocab_size(self) -> int:
        return self.src_vocab_size or self.vocab_size


class ConvStemSpec(Spec):
    """Convolutions before the patch projection (Xiao et al. 2021, "Early convolutions help
    transformers see better"; timm's hybrid ViTs): one 3x3 conv + BatchNorm + ReLU layer per entry of
    ``channels``, with the matching ``strides`` (default 1). The patch projection then takes
    ``patch_size / prod(strides)`` pixels of the stem's output, so the token grid is unchanged:
    ViTC's ImageNet stem is ``channels: [48, 96, 192, 384], strides: [2, 2, 2, 2]`` with patch 16
    (a 1x1 projection); on small images, stride-1 layers add overlapping local features at a few
    percent of the FLOPs."""

    channels: list[PositiveInt] = Field(min_length=1, description="output channels of each 3x3 conv layer")
    strides: list[PositiveInt] | None = Field(None, description="one per layer; default all 1")

    @property
    def layer_strides(self) -> list[int]:
        return self.strides or [1] * len(self.channels)

    @property
    def stride(self) -> int:
        return math.prod(self.layer_strides)


class VitSpec(FamilySpec):
    """Vision Transformer: ``model(images[B,C,H,W]) -> logits[B,num_classes]``. The tokens are
    ``[class token?, registers..., patches...]``; the class token and the registers are the prefix."""

    family: Literal["vit"] = "vit"
    image_size: PositiveInt = 224
    patch_size: PositiveInt = 16
    in_channels: PositiveInt = 3
    num_classes: PositiveInt = 1000
    class_token: bool = True
    reg_tokens: NonNegativeInt = Field(
        0, description="learned register tokens after the class token (Darcet et al. 2023); read by no pool"
    )
    prefix_positions: bool = Field(
        True, description="the position table has rows for the class and register tokens too; false: patch tokens "
        "only, the prefix gets no position (timm's no_embed_class: DeiT III, registers)"
    )
    pool: Pool = Field(
        default_factory=ClsPoolSpec, description="how tokens become the head's input: cls, mean or map (a bare name "
        "stands for {kind: name})"
    )
    fc_norm: bool = Field(False, description="norm after pooling instead of before (timm's fc_norm)")
    dynamic_size: bool = Field(
        False, description="accept images of other sizes (multiples of patch_size): learned positions are resampled "
        "bicubically to the grid (timm's dynamic_img_size), sincos2d recomputed"
    )
    stem: ConvStemSpec | None = Field(None, description="convolutions before the patch projection; null: none (the plain ViT)")
    position: Position = Field(default_factory=LearnedSpec)
    init: InitSpec = Field(default_factory=lambda: InitSpec(scheme="trunc_normal"))

    @model_validator(mode="after")
    def _check_vit(self) -> VitSpec:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size ({self.image_size}) must be divisible by patch_size ({self.patch_size}); "
                f"e.g. patch_size one of {[p for p in range(2, 33) if self.image_size % p == 0]}"
            )
        if self.position.kind == "sincos2d" and self.d_model % 4:
            raise ValueError(f"position.kind: sincos2d splits d_model in four (row/column x sin/cos); d_model ({self.d_model}) must be divisible by 4")
        if self.pool.kind == "cls" and not self.class_token:
            raise ValueError("pool: cls needs class_token: true; set class_token: true or pool: mean (or map)")
        if isinstance(self.pool, MapPoolSpec):
            heads = self.pool.n_heads or self.block.attention.n_heads
            if self.d_model % heads:
                divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
                raise ValueError(
                    f"pool.n_heads: the pooling attention splits d_model ({self.d_model}) into {heads} heads "
                    f"({'pool.n_heads' if self.pool.n_heads else 'block.attention.n_heads'}); set pool.n_heads to one of {divisors}"
                )
        if not self.prefix_positions and self.position.kind in self._gridless_positions:
            raise ValueError(
                f"prefix_positions: false leaves the class and register tokens out of the position table, but "
                f"position.kind {self.position.kind} adds no table; remove prefix_positions (or use learned or sincos2d)"
            )
        if self.dynamic_size and self.position.kind not in self._resizable_positions:
            raise ValueError(
                f"dynamic_size: positions of kind {self.position.kind!r} cannot be fitted to another grid; "
                f"use position.kind {', '.join(sorted(self._resizable_positions))}, or set dynamic_size: false"
            )
        if self.stem is not None:
            stem = self.stem
            if stem.strides is not None and len(stem.strides) != len(stem.channels):
                raise ValueError(
                    f"stem.strides: one stride per conv layer, got {len(stem.strides)} strides for "
                    f"{len(stem.channels)} channels; give {len(stem.channels)} strides or leave strides out (all 1)"
                )
            if self.patch_size % stem.stride:
                raise ValueError(
                    f"stem.strides: their product ({stem.stride}) must divide patch_size ({self.patch_size}), "
                    f"so the patch projection covers whole stem pixels; use strides whose product divides {self.patch_size}"
                )
        return self

    _foreign_positions: ClassVar[frozenset[str]] = frozenset({"sinusoidal", "rope", "alibi"})  # 1-D text positions
    _resizable_positions: ClassVar[frozenset[str]] = frozenset({"learned", "sincos2d", "none"})
    _gridless_positions: ClassVar[frozenset[str]] = frozenset({"none"})

    @property
    def grid(self) -> tuple[int, int]:
        n = self.image_size // self.patch_size
        return (n, n)

    @property
    def n_prefix(self) -> int:
        """Tokens in front of the patches: the class token and the registers."""
        return int(self.class_token) + self.reg_tokens

    @property
    def n_tokens(self) -> int:
        return self.grid[0] * self.grid[1] + self.n_prefix

    @property
    def n_positions(self) -> int:
        """Rows of the position table: every token, or the patches only (``prefix_positions: false``)."""
        return self.n_tokens if self.prefix_positions else self.grid[0] * self.grid[1]


ModelSpec = Annotated[FamilySpec, Dispatch("family", key="family")]

register_specs("family", FamilySpec, {"decoder": DecoderSpec, "encoder": EncoderSpec,
                                      "encoder_decoder": EncoderDecoderSpec, "vit": VitSpec})
