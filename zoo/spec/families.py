"""The specs of whole models: the fields every family shares (:class:`FamilySpec`: width, depth,
the block's parts, positions, dropout, initialisation) and the four families, decoder, encoder,
encoder-decoder and ViT, with the cross-field rules that name the field and the fix."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator, model_serializer, model_validator

from zoo.registry import registry
from zoo.spec.base import Dispatch, Rate, Spec, register_specs
from zoo.spec.classifier import ClassifierSpec
from zoo.spec.blocks import AnyBlock, BlockSpec, Layer, LayerPattern, PreBlockSpec, layer_key, resolve
from zoo.spec.pooling import ProjectionSpec, pool_problems
from zoo.spec.sharing import factorised_problems, shared_layers_field, sharing_problems, weight_layers
from zoo.spec.parts import (
    AnyHead,
    AnyPool,
    AnyPosition,
    ClsPoolSpec,
    LearnedSpec,
    LinearHeadSpec,
    LMHeadSpec,
    MLMHeadSpec,
    SinusoidalSpec,
    checked_multiplier,
)

__all__ = [
    "ClassifierSpec", "ConvStemSpec", "DecoderSpec", "DropoutSpec", "EmbeddingSpec", "EncoderDecoderSpec",
    "EncoderSpec", "FamilySpec", "InitSpec", "ModelSpec", "TextSpec", "VitSpec",
]


class DropoutSpec(Spec):
    """Dropout rates. The paper's P_drop is ``embedding`` (on the embedding + position sum) and
    ``residual`` (on each sub-layer output before the residual add)."""

    embedding: Rate = 0.0
    residual: Rate = 0.0
    attention: Rate = Field(0.0, description="on the attention weights")
    ffn: Rate = Field(0.0, description="on the FFN's hidden activation")
    final: Rate = Field(0.0, description="on each stack's output, after its final norm (T5)")


class InitSpec(Spec):
    """Weight initialisation. ``normal``: N(0, std) for linear and embedding weights (GPT-2, BERT);
    ``xavier``: Xavier-uniform linears and N(0, d_model^-1/2) embeddings (the paper, fairseq);
    ``trunc_normal``: N(0, std) truncated at +-2 (timm ViT's ``trunc_normal_(std=.02)``). ``scaled_residual`` divides the std of each
    residual output projection by sqrt(2 * n_layers) (GPT-2)."""

    scheme: Literal["normal", "xavier", "trunc_normal"] = "normal"
    std: PositiveFloat = 0.02
    scaled_residual: bool = False


class EmbeddingSpec(Spec):
    """Token embedding options: ``scale`` multiplies by sqrt(d_model) (the paper; sqrt(dim) where
    ``dim`` factorises the embeddings: ALBERT, ELECTRA), ``multiplier`` by a number of its own
    (Granite); ``norm`` puts a norm after the embedding sum (BERT)."""

    scale: bool = False
    norm: bool = False
    dim: PositiveInt | None = Field(
        None, description="factorised embeddings (ALBERT's and ELECTRA's embedding_size): the token, position and "
        "segment embeddings and their norm are dim wide, and a linear layer with a bias (emb_proj) maps their sum "
        "to d_model; an mlm head's transform maps to dim, so a tied projection shares the embedding; null: d_model wide, "
        "no projection",
    )
    round_scale: bool = Field(
        False,
        description="round sqrt(d_model) to the weights' dtype before multiplying (HF Gemma's normalizer; "
        "the same in float32, different in bfloat16); needs scale",
    )
    multiplier: float | None = Field(
        None, description="the token embeddings multiplied by this number (after scale, if any; Granite's "
        "embedding_multiplier, 12.0); null: none",
    )

    @field_validator("multiplier")
    @classmethod
    def _check_multiplier(cls, value: float | None) -> float | None:
        return checked_multiplier(value, "multiplier", "the token embeddings' factor", "12.0 (Granite's embedding_multiplier)")

    @model_validator(mode="after")
    def _check_round(self) -> EmbeddingSpec:
        if self.round_scale and not self.scale:
            raise ValueError("round_scale: rounds the sqrt(d_model) scale, so it needs scale: true; set scale: true or round_scale: false")
        return self


class FamilySpec(Spec):
    """Fields every model family has, and what a family declares (class variables, read by the
    checks): ``layout`` of its tokens (``sequence`` or ``grid``: which positions apply), ``output``
    its head reads (``tokens`` [B, T, D] or ``pooled`` [B, D]: which heads apply), ``windows``
    (sliding-window self-attention applies: causal in a decoder, both ways in an encoder),
    ``padded_positions`` (a position's ``padding_idx`` applies: its embedding reads the padding
    mask; the text families), and its stacks (:meth:`stacks`)."""

    layout: ClassVar[str] = "sequence"
    output: ClassVar[str] = "tokens"
    windows: ClassVar[bool] = False
    padded_positions: ClassVar[bool] = False

    family: str
    name: str | None = Field(None, description="a label; never changes behaviour")
    d_model: PositiveInt = 512
    n_layers: PositiveInt = 6
    block: AnyBlock = Field(default_factory=PreBlockSpec, description="every layer's block, chosen by kind: pre, post, "
                            "post_sublayer, parallel, ...")
    layers: list[LayerPattern] = Field(
        default_factory=list, description="layers that differ from block: each pattern's selected layers get its "
        "changes to the block and/or a position of their own (per-layer windows, RoPE bases, no positions, FFNs)"
    )
    position: AnyPosition = Field(default_factory=SinusoidalSpec)
    dropout: DropoutSpec = Field(default_factory=DropoutSpec)
    init: InitSpec = Field(default_factory=InitSpec)

    def stacks(self) -> dict[str, tuple[int, bool]]:
        """Each stack of blocks by name: (its layers, whether its blocks hold cross-attention)."""
        return {"stack": (self.n_layers, False)}

    def stack_layers(self, stack: str = "stack") -> tuple[Layer, ...]:
        """The resolved layers of ``stack``: ``block`` with the ``layers`` patterns applied."""
        return resolve(self.block, self.layers, self.stacks()[stack][0], stack)

    def weight_layers(self, stack: str = "stack") -> list[int]:
        """For each layer of ``stack``, the layer whose block it runs: itself, or with ``shared_layers``
        the first layer of its group."""
        return weight_layers(self.stacks()[stack][0], getattr(self, "shared_layers", None))

    @property
    def has_final_norm(self) -> bool:
        """A norm after the last block, as the block kind declares (``final_norm``)."""
        return type(self.block).final_norm

    @model_validator(mode="after")
    def _check_shared(self) -> FamilySpec:
        problems = self._layer_problems() + sharing_problems(self)
        if self.init.scaled_residual and self.init.scheme == "xavier":
            problems.append("init.scaled_residual: applies to scheme normal or trunc_normal, not xavier; set it to false")
        position = self.position
        problems += position.problems(d_model=self.d_model, head_dim=self._head_dim(self.block), field="position")
        if getattr(position, "padding_idx", None) is not None and not self.padded_positions:
            problems.append(f"position.padding_idx: fairseq's padding-aware positions are for token sequences, not "
                            f"family {self.family}'s; remove it")
        if self.layout not in type(position).layouts:
            allowed = [n for n in registry("position").names() if self.layout in registry("position").spec(n).layouts]
            problems.append(
                f"position.kind: {position.kind!r} does not apply to family {self.family}; use one of {', '.join(allowed)}"
            )
        head = getattr(self, "head", None)
        if head is not None and self.output not in type(head).takes:
            allowed = [n for n in registry("head").names() if self.output in registry("head").spec(n).takes]
            problems.append(f"head.kind: {head.kind!r} does not read the {self.output} family {self.family} puts out; "
                            f"use one of {', '.join(allowed)}")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _layer_problems(self) -> list[str]:
        """The rules every layer's block and position must keep, checked once per distinct layer and
        named by where it comes from (``block`` or ``layers.<i>``)."""
        stacks = self.stacks()
        problems = []
        for j, p in enumerate(self.layers):
            if p.stack is not None and p.stack not in stacks:
                problems.append(f"layers.{j}.stack: {self.family} has the stacks {', '.join(stacks)}, not {p.stack!r}")
        if problems:
            return problems
        seen: dict[str, str] = {}
        any_cross = any(cross for _, cross in stacks.values())
        for name, (n, cross) in stacks.items():
            try:
                layers = self.stack_layers(name)
            except ValueError as e:
                return str(e).split("\n")
            where = self._origins(name, n)
            for i, layer in enumerate(layers):
                key = layer_key(layer) + str(cross)
                if key not in seen:
                    seen[key] = where[i]
                    problems += self._check_layer(layer, where[i], cross, any_cross)
            if layers and type(layers[-1].block).final_norm != self.has_final_norm:
                problems.append(f"layers: the last layer's block kind ({layers[-1].block.kind}) and block.kind "
                                f"({self.block.kind}) disagree on the final norm; give the last layer block.kind")
        return list(dict.fromkeys(problems))

    def _head_dim(self, block: BlockSpec) -> int:
        """The query/key head size a position of ``block``'s attention turns (every attention spec
        subclasses AttentionSpec: the attention registry's spec base; mla: its rotary part)."""
        return block.attention.rope_size(self.d_model)

    def _origins(self, stack: str, n: int) -> list[str]:
        """For each layer, the field its spec comes from: ``block``, or the last pattern selecting it."""
        from zoo.spec.blocks import select_layers

        where = ["block"] * n
        for j, p in enumerate(self.layers):
            if p.stack in (None, stack):
                for i in select_layers(p.at, n):
                    where[i] = f"layers.{j}"
        return where

    def _check_layer(self, layer: Layer, where: str, cross: bool, any_cross: bool) -> list[str]:
        d, b = self.d_model, layer.block
        blk = "block" if where == "block" else f"{where}.block"
        problems = []
        for field, spec in (("attention", b.attention), ("cross_attention", b.cross_attention)):
            if spec is None:  # no cross-attention
                continue
            if (spec.head_dim is None or spec.v_head_dim is None) and d % spec.n_heads:
                divisors = [h for h in range(1, min(d, 64) + 1) if d % h == 0]
                problems.append(
                    f"{blk}.{field}.n_heads: d_model ({d}) must be divisible by n_heads ({spec.n_heads}); "
                    f"choose n_heads from {divisors} or set head_dim and v_head_dim"
                )
            for name, what in (("window", "sliding-window attention"), ("chunk", "chunked attention")):
                if getattr(spec, name, None) is not None and (field == "cross_attention" or not self.windows):
                    problems.append(f"{blk}.{field}.{name}: {what} is self-attention of a decoder or an encoder, "
                                    f"which family {self.family} does not have here; remove it")
            if cross and getattr(b.cross, "gate", False) and (field == "cross_attention" or b.cross_attention is None):
                problems.append(f"{blk}.{field}.gate: the output gate is self-attention's (its rows join the fused q, k, "
                                f"v projection); give {blk}.cross_attention without gate")
        if layer.position is not None and not problems:
            problems += layer.position.problems(d_model=d, head_dim=self._head_dim(b), field=f"{where}.position")
        elif where != "block" and not problems and self._head_dim(b) != self._head_dim(self.block):
            problems += self.position.problems(d_model=d, head_dim=self._head_dim(b), field="position")
        if layer.position is not None and not type(layer.position).in_layers:
            in_layers = [n for n in registry("position").names() if registry("position").spec(n).in_layers]
            problems.append(f"{where}.position: {layer.position.kind!r} is added to the embeddings once, not per layer; "
                            f"a layer's own position is one of {', '.join(in_layers)}")
        elif layer.position is not None and self.layout not in type(layer.position).layouts:
            kinds = registry("position")
            allowed = [n for n in kinds.names() if kinds.spec(n).in_layers and self.layout in kinds.spec(n).layouts]
            problems.append(f"{where}.position: {layer.position.kind!r} does not apply to family {self.family}; "
                            f"a layer's own position is one of {', '.join(allowed)}")
        if cross and not type(b).takes_cross:
            problems.append(f"{blk}.kind: a {b.kind} block has no cross-attention, which family {self.family}'s "
                            f"decoder needs; choose another block kind")
        if not any_cross and b.cross_attention is not None:
            problems.append(f"{blk}.cross_attention: family {self.family} has no cross-attention; remove it")
        return problems


class TextSpec(FamilySpec):
    padded_positions: ClassVar[bool] = True
    vocab_size: PositiveInt = 32000
    max_seq_len: PositiveInt = Field(1024, description="longest sequence; sizes learned and sinusoidal tables")
    embedding: EmbeddingSpec = Field(default_factory=EmbeddingSpec)
    head: AnyHead = Field(default_factory=LMHeadSpec, description="after the last block: lm (logits), mlm, or none "
                          "(the hidden states); a bare name stands for {kind: name}")

    @property
    def embedding_dim(self) -> int:
        """The embeddings' width: ``embedding.dim``, else d_model."""
        return self.embedding.dim or self.d_model

    @model_validator(mode="after")
    def _check_factorised(self) -> TextSpec:
        problems = factorised_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self


class DecoderSpec(TextSpec):
    """GPT-style decoder-only language model: ``model(tokens[B,T]) -> logits[B,T,V]``."""

    windows: ClassVar[bool] = True
    family: Literal["decoder"] = "decoder"
    shared_layers: PositiveInt | None = shared_layers_field()
    init: InitSpec = Field(default_factory=lambda: InitSpec(scheme="normal", std=0.02, scaled_residual=True))


class EncoderSpec(TextSpec):
    """BERT-style bidirectional encoder: ``model(tokens[B,T], padding_mask) -> logits[B,T,V]``."""

    windows: ClassVar[bool] = True
    family: Literal["encoder"] = "encoder"
    shared_layers: PositiveInt | None = shared_layers_field()
    type_vocab_size: NonNegativeInt = Field(0, description="segment (token type) embeddings; 0 for none")
    head: AnyHead = Field(default_factory=MLMHeadSpec, description="after the last block: mlm, lm, or none (the "
                          "hidden states); a bare name stands for {kind: name}")
    pooler: bool = Field(False, description="BERT's pooler: a linear layer and tanh on the first token's hidden state, "
                         "model.pool(...) -> [B, D] (HF's pooler_output); the classifier has its own")
    classifier: ClassifierSpec | None = None
    causal: bool = Field(False, description="each token attends to itself and the tokens before it (CLIP's text "
                         "tower; a window then counts back, as a decoder's); false: to every token (BERT)")
    pool: AnyPool | None = Field(None, description="how model.pool turns the hidden states into one vector: eos, last, "
                                 "cls or mean (a bare name stands for {kind: name}); null: none (or BERT's pooler)")
    projection: ProjectionSpec | None = Field(None, description="a linear map of the pooled vector (CLIP's "
                                              "text_projection, SigLIP's head); null: none")

    @model_validator(mode="after")
    def _check_pool(self) -> EncoderSpec:
        problems = pool_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self


class EncoderDecoderSpec(TextSpec):
    """The original Transformer: ``model(src[B,S], tgt_in[B,T], masks) -> logits[B,T,V]``."""

    family: Literal["encoder_decoder"] = "encoder_decoder"
    n_encoder_layers: PositiveInt | None = Field(None, description="default: n_layers")
    n_decoder_layers: PositiveInt | None = Field(None, description="default: n_layers")
    src_vocab_size: PositiveInt | None = Field(None, description="the source vocabulary; default: vocab_size (a "
                                               "shared vocabulary); left out of a written spec when it is vocab_size")
    share_embeddings: bool = Field(True, description="source and target embeddings are one matrix")
    share_positions: bool = Field(True, description="the encoder and the decoder add one position module (one "
                                  "learned table); false: each has its own (BART's two learned tables)")
    init: InitSpec = Field(default_factory=lambda: InitSpec(scheme="xavier"))

    def stacks(self) -> dict[str, tuple[int, bool]]:
        return {"encoder": (self.encoder_layers, False), "decoder": (self.decoder_layers, True)}

    @model_validator(mode="before")
    @classmethod
    def _source_vocabulary(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("src_vocab_size") is None:
            data = {**data, "src_vocab_size": data.get("vocab_size", cls.model_fields["vocab_size"].default)}
        return data

    @model_serializer(mode="wrap")
    def _leave_out_a_shared_vocabulary(self, handler: Any) -> dict:
        data = handler(self)
        if self.src_vocab_size == self.vocab_size:
            data["src_vocab_size"] = None
        return data

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

    layout: ClassVar[str] = "grid"
    output: ClassVar[str] = "pooled"

    family: Literal["vit"] = "vit"
    shared_layers: PositiveInt | None = shared_layers_field()
    image_size: PositiveInt = 224
    patch_size: PositiveInt = 16
    in_channels: PositiveInt = 3
    head: AnyHead = Field(default_factory=LinearHeadSpec, description="after pooling: linear (a classifier of "
                          "num_classes) or none (the pooled features); a bare name stands for {kind: name}")
    class_token: bool = True
    reg_tokens: NonNegativeInt = Field(
        0, description="learned register tokens after the class token (Darcet et al. 2023); read by no pool"
    )
    prefix_positions: bool = Field(
        True, description="the position table has rows for the class and register tokens too; false: patch tokens "
        "only, the prefix gets no position (timm's no_embed_class: DeiT III, registers)"
    )
    pool: AnyPool = Field(
        default_factory=ClsPoolSpec, description="how tokens become the head's input: cls, mean or map (a bare name "
        "stands for {kind: name})"
    )
    fc_norm: bool = Field(False, description="norm after pooling instead of before (timm's fc_norm)")
    pre_norm: bool = Field(
        False, description="a norm of the block's kind on the tokens (with their positions) before the first block "
        "(CLIP's ln_pre; timm's pre_norm, norm_pre)"
    )
    patch_bias: bool = Field(True, description="a bias on the patch projection (CLIP has none: timm drops it with pre_norm)")
    patch_norm: bool = Field(
        False, description="a norm of the block's kind on each patch vector right after the projection, before the "
        "prefix tokens and positions (AIMv2; timm's embed_norm_layer)"
    )
    dynamic_size: bool = Field(
        False, description="accept images of other sizes (multiples of patch_size): learned positions are resampled "
        "bicubically to the grid (timm's dynamic_img_size), sincos2d recomputed"
    )
    stem: ConvStemSpec | None = Field(None, description="convolutions before the patch projection; null: none (the plain ViT)")
    position: AnyPosition = Field(default_factory=LearnedSpec)
    init: InitSpec = Field(default_factory=lambda: InitSpec(scheme="trunc_normal"))

    @property
    def num_classes(self) -> int | None:
        """The classifier's outputs, or None without a classifier (``head: none``)."""
        return getattr(self.head, "num_classes", None)

    @model_validator(mode="after")
    def _check_vit(self) -> VitSpec:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size ({self.image_size}) must be divisible by patch_size ({self.patch_size}); "
                f"e.g. patch_size one of {[p for p in range(2, 33) if self.image_size % p == 0]}"
            )
        problems = self.pool.problems(d_model=self.d_model, block=self.block, class_token=self.class_token)
        if type(self.pool).takes_tokens:
            problems.append(f"pool: {self.pool.kind} reads token ids, which a vit has none of; use cls, mean, map or last")
        if problems:
            raise ValueError("\n".join(problems))
        position = type(self.position)
        if getattr(self.position, "offset", 0):
            raise ValueError(f"position.offset: a ViT's table has one row per token, read from row 0, got offset "
                             f"{self.position.offset}; remove offset")
        if not self.prefix_positions and not position.adds:
            raise ValueError(
                f"prefix_positions: false leaves the class and register tokens out of the position table, but "
                f"position.kind {self.position.kind} adds no table; remove prefix_positions (or use learned or sincos2d)"
            )
        if self.dynamic_size and not position.resizable:
            names = [n for n in registry("position").names() if registry("position").spec(n).resizable]
            raise ValueError(
                f"dynamic_size: positions of kind {self.position.kind!r} cannot be fitted to another grid; "
                f"use position.kind {', '.join(names)}, or set dynamic_size: false"
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
