"""The specs of interchangeable parts: attention, FFNs, norms, heads and ViT pools (attention:
:mod:`zoo.spec.attention`, positions: :mod:`zoo.spec.positions`, both re-exported here). Each
part's field in a model spec takes any kind its registry knows (:class:`~zoo.spec.base.Dispatch`);
the ``Any*`` types are those fields' annotations.

Parts declare what the models and checks need to know of them as class variables (a position's
``layouts``, whether it acts ``in_layers``, a head's ``takes``), so no model or check branches on a
part's kind."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PositiveFloat, PositiveInt, ValidationInfo, field_validator, model_validator

from zoo.spec.attention import (  # attention's spec lives apart; re-exported here with the other parts
    AttentionSpec,
    QKNormSpec,
    TemperatureSpec,
    checked_cap,
    checked_multiplier,
)
from zoo.spec.base import ComponentSpec, Dispatch, register_specs
from zoo.spec.positions import (  # the positions' specs live apart; re-exported here with the other parts
    AlibiSpec,
    AnyPosition,
    LearnedSpec,
    NoPositionSpec,
    PositionSpec,
    RelativeBias2dSpec,
    RelativeBiasSpec,
    Rope2dMixedSpec,
    Rope2dSpec,
    RopeSpec,
    SinCos2dSpec,
    SinusoidalSpec,
)

__all__ = [
    "AlibiSpec", "AnyAttention", "AnyFFN", "AnyHead", "AnyNorm", "AnyPool", "AnyPosition", "AttentionSpec",
    "ClsPoolSpec", "FFNBaseSpec", "FFNSpec", "GatedFFNSpec", "GeGLUSpec", "GeluFFNSpec", "HeadSpec", "LMHeadSpec", "LayerNormSpec",
    "LearnedSpec", "LinearHeadSpec", "MLMHeadSpec", "MapPoolSpec", "MeanPoolSpec", "NoHeadSpec", "NoPositionSpec",
    "NormSpec", "PoolSpec", "PositionSpec", "QKNormSpec", "TemperatureSpec", "QuickGeluFFNSpec", "RMSNormSpec", "RelativeBias2dSpec", "RelativeBiasSpec", "Relu2FFNSpec", "ReluFFNSpec",
    "Rope2dMixedSpec", "Rope2dSpec", "RopeSpec", "SiluFFNSpec",
    "SinCos2dSpec", "SinusoidalSpec", "SwiGLUSpec", "checked_cap", "checked_multiplier",
]


# --------------------------------------------------------------------------------------------- FFN
class FFNBaseSpec(ComponentSpec):
    """The base of every FFN kind's spec (the ffn registry's spec base): a part mapping [B, T, D] to
    [B, T, D]. ``hidden_size(d_model)``: its hidden width (a mixture of experts: each expert's)."""

    def hidden_size(self, d_model: int) -> int:
        raise NotImplementedError


class FFNSpec(FFNBaseSpec):
    """Position-wise feed-forward network. ``hidden`` defaults per kind (see ``hidden_size``)."""

    hidden: PositiveInt | None = None
    bias: bool = True
    norm: bool = Field(
        False, description="a norm of the block's kind on the hidden activation, before the output projection "
        "(NormFormer's FFN norm; timm's scale_mlp: EVA-02 base and large)"
    )

    def hidden_size(self, d_model: int) -> int:
        return self.hidden or 4 * d_model


class ReluFFNSpec(FFNSpec):
    kind: Literal["relu"] = "relu"


class GeluFFNSpec(FFNSpec):
    kind: Literal["gelu"] = "gelu"
    approximate: Literal["none", "tanh"] = "none"


class QuickGeluFFNSpec(FFNSpec):
    """Two-layer FFN with OpenAI CLIP's quick GELU, x * sigmoid(1.702 x) (timm's ``act_layer='quick_gelu'``,
    the ``*_clip_quickgelu_*`` towers)."""

    kind: Literal["quick_gelu"] = "quick_gelu"


class SiluFFNSpec(FFNSpec):
    """Two-layer FFN with SiLU (swish), as Marian's ``activation_function: swish``."""

    kind: Literal["silu"] = "silu"


class Relu2FFNSpec(FFNSpec):
    """Two-layer FFN with squared ReLU, max(0, x)^2 (So et al. 2021, Primer; Nemotron's ``hidden_act: relu2``)."""

    kind: Literal["relu2"] = "relu2"


class GatedFFNSpec(FFNSpec):
    """Gated linear unit FFN. Default hidden: 2/3 of 4 * d_model, rounded up to a multiple of 64,
    which keeps the parameter count of the two-layer FFN it replaces."""

    kind: Literal["swiglu", "geglu"] = "swiglu"

    def hidden_size(self, d_model: int) -> int:
        return self.hidden or 64 * math.ceil(8 * d_model / 3 / 64)


class GeGLUSpec(GatedFFNSpec):
    kind: Literal["geglu"] = "geglu"
    approximate: Literal["none", "tanh"] = "none"


class SwiGLUSpec(GatedFFNSpec):
    """``(up + up_offset) * g * sigmoid(alpha * g)``, g = gate; with ``limit`` the gate clamped above
    at limit and up into [-limit, limit] first (gpt-oss: limit 7, alpha 1.702, up_offset 1)."""

    kind: Literal["swiglu"] = "swiglu"
    limit: PositiveFloat | None = Field(None, description="clamp the gate above and up on both sides at this value "
                                        "(gpt-oss's swiglu_limit, 7.0); null: no clamp")
    alpha: PositiveFloat = Field(1.0, description="the sigmoid's gain, g * sigmoid(alpha * g) (gpt-oss's swiglu_alpha, "
                                 "1.702); 1: SiLU")
    up_offset: float = Field(0.0, description="added to up before the product (gpt-oss: 1.0)")

    @property
    def clamped(self) -> bool:
        """Whether it differs from the plain SwiGLU, silu(gate) * up."""
        return self.limit is not None or self.alpha != 1.0 or self.up_offset != 0.0


# -------------------------------------------------------------------------------------------- norms
class NormSpec(ComponentSpec):
    """Normalisation. Where a block puts its norms is the block's ``kind`` (``block.kind``)."""

    eps: PositiveFloat = 1e-5


class LayerNormSpec(NormSpec):
    """LayerNorm: (x - mean) / sqrt(var + eps), scaled by a weight and shifted by a bias, each optional."""

    kind: Literal["layernorm"] = "layernorm"
    bias: bool = True
    affine: bool = Field(
        True, description="a learned scale (weight) and, with bias, shift; false: neither, the plain normalisation "
        "(OLMo's non-parametric LayerNorm), and bias then defaults to false"
    )
    unit_offset: bool = Field(
        False, description="scale by (1 + weight), the weight initialised to zero (Nemotron's layernorm1p); false: by "
        "weight, initialised to one"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_bias_without_affine(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("affine") is False and "bias" not in data:
            data = {**data, "bias": False}
        return data

    @model_validator(mode="after")
    def _check_affine(self) -> LayerNormSpec:
        if not self.affine and self.bias:
            raise ValueError("bias: true needs affine: true (affine: false leaves out the weight and the bias); set bias: false "
                             "or affine: true")
        if not self.affine and self.unit_offset:
            raise ValueError("unit_offset: the (1 + weight) scale needs a weight, which affine: false leaves out; set "
                             "unit_offset: false or affine: true")
        return self


class RMSNormSpec(NormSpec):
    kind: Literal["rmsnorm"] = "rmsnorm"
    unit_offset: bool = Field(False, description="scale by (1 + weight), the weight initialised to zero (Gemma); false: by weight, initialised to one")


# ------------------------------------------------------------------------------------ ViT pooling
class PoolSpec(ComponentSpec):
    """How a ViT turns its tokens into one vector [B, D] for the head (and an encoder its hidden
    states into its pooled output). A pool sees every token and the number of prefix tokens (class
    token, registers) in front of the patch tokens; ``takes_tokens``: it reads the token ids too (a
    text family's); ``takes_padding``: it pools a padded row as the reference does (an encoder's)."""

    takes_tokens: ClassVar[bool] = False
    takes_padding: ClassVar[bool] = True

    def problems(self, *, d_model: int, block: ComponentSpec, class_token: bool) -> list[str]:
        """What does not fit the ViT (width ``d_model``, its ``block`` spec, a class token or not),
        each line naming the field and the fix; [] when it fits."""
        return []


class ClsPoolSpec(PoolSpec):
    """The class token's output (ViT; timm ``global_pool='token'``)."""

    kind: Literal["cls"] = "cls"

    def problems(self, *, d_model: int, block: ComponentSpec, class_token: bool) -> list[str]:
        if not class_token:
            return ["pool: cls needs class_token: true; set class_token: true or pool: mean (or map)"]
        return []


class MeanPoolSpec(PoolSpec):
    """The mean of the patch tokens, prefix tokens left out (timm ``global_pool='avg'``)."""

    kind: Literal["mean"] = "mean"


class MapPoolSpec(PoolSpec):
    """Multihead attention pooling (MAP; Zhai et al. 2022, "Scaling Vision Transformers"; SigLIP;
    timm ``global_pool='map'``, ``AttentionPoolLatent``): a learned latent query attends over the patch tokens, then a residual
    FFN (the block's kind, after a norm of the block's kind): ``y = attn(latent, patches);
    y = y + ffn(norm(y))``."""

    kind: Literal["map"] = "map"
    takes_padding: ClassVar[bool] = False  # its attention reads every token
    n_heads: PositiveInt | None = Field(None, description="heads of the pooling attention; default: block.attention.n_heads")
    hidden: PositiveInt | None = Field(None, description="hidden width of its FFN; default: the block FFN's")
    bias: bool = Field(True, description="biases on its projections and FFN (timm: always)")

    def problems(self, *, d_model: int, block: ComponentSpec, class_token: bool) -> list[str]:
        heads = self.n_heads or getattr(block.attention, "n_heads", 1)
        if d_model % heads:
            divisors = [h for h in range(1, min(d_model, 64) + 1) if d_model % h == 0]
            source = "pool.n_heads" if self.n_heads else "block.attention.n_heads"
            return [f"pool.n_heads: the pooling attention splits d_model ({d_model}) into {heads} heads ({source}); "
                    f"set pool.n_heads to one of {divisors}"]
        return []


# -------------------------------------------------------------------------------------------- heads
class HeadSpec(ComponentSpec):
    """What a model puts after its last block. ``takes``: the family outputs it reads, ``tokens``
    ([B, T, D]: text families) and/or ``pooled`` ([B, D]: a ViT's pooled tokens).
    ``passes_hidden_states``: the head returns what it takes unchanged, so the model's output is its
    hidden states (what ``zoo.embed`` pools)."""

    takes: ClassVar[frozenset[str]] = frozenset({"tokens"})
    passes_hidden_states: ClassVar[bool] = False


class NoHeadSpec(HeadSpec):
    """No head: a backbone whose forward returns the hidden states after the final norm ([B, T, D]),
    or a ViT's pooled features ([B, D]), as HF's ``*Model`` classes and timm's ``num_classes=0``."""

    kind: Literal["none"] = "none"
    takes: ClassVar[frozenset[str]] = frozenset({"tokens", "pooled"})
    passes_hidden_states: ClassVar[bool] = True


class LMHeadSpec(HeadSpec):
    """A linear projection of each token to the vocabulary (logits [B, T, V]); with ``scale_input``,
    its input first multiplied by d_model^-0.5 (T5 v1.0); the logits then multiplied by ``scale``
    (Cohere), divided by ``divisor`` (Granite), and with ``softcap`` squashed into (-softcap, softcap)
    by ``softcap * tanh(logits / softcap)`` (Gemma 2)."""

    kind: Literal["lm"] = "lm"
    bias: bool = Field(False, description="a bias on the projection")
    tied: bool = Field(True, description="the projection's weight is the token embedding's (tied embeddings)")
    scale_input: bool = Field(False, description="multiply the input by d_model^-0.5 before the projection (T5 v1.0's "
                              "head, which shares the embedding matrix; HF's scale_decoder_outputs)")
    softcap: float | None = Field(
        None, description="soft-capping of the logits, softcap * tanh(logits / softcap) (Gemma 2's "
        "final_logit_softcapping, 30.0); null: none",
    )
    scale: float | None = Field(
        None, description="the logits multiplied by this number (Cohere's logit_scale, 0.0625); null: none",
    )
    divisor: float | None = Field(
        None, description="the logits divided by this number, after scale (Granite's logits_scaling, 16.0); null: none",
    )

    @field_validator("softcap")
    @classmethod
    def _check_softcap(cls, softcap: float | None) -> float | None:
        return checked_cap(softcap)

    @field_validator("scale", "divisor")
    @classmethod
    def _check_factors(cls, value: float | None, info: ValidationInfo) -> float | None:
        what = {"scale": "the logits' factor", "divisor": "what the logits are divided by"}[info.field_name]
        example = {"scale": "0.0625 (Cohere's logit_scale)", "divisor": "16.0 (Granite's logits_scaling)"}[info.field_name]
        return checked_multiplier(value, info.field_name, what, example)


class MLMHeadSpec(HeadSpec):
    """BERT's masked-LM head: an optional transform (linear, GELU, a norm of the block's kind), then
    the projection to the vocabulary."""

    kind: Literal["mlm"] = "mlm"
    transform: bool = Field(True, description="linear + GELU + norm before the projection (BERT); the linear maps "
                            "to embedding.dim where the embeddings are factorised (ALBERT, ELECTRA)")
    approximate: Literal["none", "tanh"] = Field("none", description="the transform's GELU: exact (none, BERT's gelu) "
                                                 "or its tanh approximation (tanh, ALBERT's gelu_new)")
    transform_bias: bool = Field(True, description="a bias on the transform's linear; false: none (ModernBERT's "
                                 "classifier_bias: false)")
    bias: bool = Field(True, description="a bias on the projection")
    tied: bool = Field(True, description="the projection's weight is the token embedding's (tied embeddings)")


class LinearHeadSpec(HeadSpec):
    """A linear classifier of a ViT's pooled tokens (logits [B, num_classes])."""

    kind: Literal["linear"] = "linear"
    takes: ClassVar[frozenset[str]] = frozenset({"pooled"})
    num_classes: PositiveInt = 1000


AnyAttention = Annotated[ComponentSpec, Dispatch("attention")]
AnyFFN = Annotated[ComponentSpec, Dispatch("ffn")]
AnyNorm = Annotated[ComponentSpec, Dispatch("norm")]
AnyPool = Annotated[ComponentSpec, Dispatch("pool", shorthand=True)]
AnyHead = Annotated[ComponentSpec, Dispatch("head", shorthand=True)]

register_specs("attention", AttentionSpec, {"mha": AttentionSpec, "gqa": AttentionSpec, "mqa": AttentionSpec})
register_specs("ffn", FFNBaseSpec, {"relu": ReluFFNSpec, "gelu": GeluFFNSpec, "silu": SiluFFNSpec, "swiglu": SwiGLUSpec,
                                "geglu": GeGLUSpec, "quick_gelu": QuickGeluFFNSpec,
                                "relu2": Relu2FFNSpec})
register_specs("norm", NormSpec, {"layernorm": LayerNormSpec, "rmsnorm": RMSNormSpec})
register_specs("pool", PoolSpec, {"cls": ClsPoolSpec, "mean": MeanPoolSpec, "map": MapPoolSpec})
register_specs("head", HeadSpec, {"none": NoHeadSpec, "lm": LMHeadSpec, "mlm": MLMHeadSpec, "linear": LinearHeadSpec})
