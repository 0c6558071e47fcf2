"""The specs of interchangeable parts: attention, FFNs, norms, heads and ViT pools (positions:
:mod:`zoo.spec.positions`, re-exported here). Each
part's field in a model spec takes any kind its registry knows (:class:`~zoo.spec.base.Dispatch`);
the ``Any*`` types are those fields' annotations.

Parts declare what the models and checks need to know of them as class variables (a position's
``layouts``, whether it acts ``in_layers``, a head's ``takes``), so no model or check branches on a
part's kind."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PositiveFloat, PositiveInt, ValidationInfo, field_validator, model_serializer, model_validator

from zoo.spec.base import ComponentSpec, Dispatch, Spec, register_specs
from zoo.spec.positions import (  # the positions' specs live apart; re-exported here with the other parts
    AlibiSpec,
    AnyPosition,
    LearnedSpec,
    NoPositionSpec,
    PositionSpec,
    RelativeBiasSpec,
    Rope2dSpec,
    RopeSpec,
    SinCos2dSpec,
    SinusoidalSpec,
)

__all__ = [
    "AlibiSpec", "AnyAttention", "AnyFFN", "AnyHead", "AnyNorm", "AnyPool", "AnyPosition", "AttentionSpec",
    "ClsPoolSpec", "FFNBaseSpec", "FFNSpec", "GatedFFNSpec", "GeGLUSpec", "GeluFFNSpec", "HeadSpec", "LMHeadSpec", "LayerNormSpec",
    "LearnedSpec", "LinearHeadSpec", "MLMHeadSpec", "MapPoolSpec", "MeanPoolSpec", "NoHeadSpec", "NoPositionSpec",
    "NormSpec", "PoolSpec", "PositionSpec", "QKNormSpec", "QuickGeluFFNSpec", "RMSNormSpec", "RelativeBiasSpec", "Relu2FFNSpec", "ReluFFNSpec",
    "Rope2dSpec", "RopeSpec", "SiluFFNSpec",
    "SinCos2dSpec", "SinusoidalSpec", "SwiGLUSpec", "checked_multiplier",
]


# ----------------------------------------------------------------------------------------- attention
class QKNormSpec(Spec):
    """A norm on the queries and keys before the scores (and before RoPE), which keeps the logits
    bounded (Dehghani et al. 2023; timm's ``qk_norm``, OLMo 2, Qwen3, Gemma 3). ``scope: head``
    normalises each head's K features (weights [K], shared by the heads: timm, Qwen3, Gemma 3);
    ``scope: all`` normalises the whole query projection [H*K] and the whole key projection [G*K]
    before the head split (OLMo 2)."""

    kind: Literal["layernorm", "rmsnorm"] = "layernorm"
    scope: Literal["head", "all"] = "head"
    eps: PositiveFloat = 1e-6
    unit_offset: bool = Field(
        False, description="rmsnorm only: scale by (1 + weight), the weight initialised to zero (Gemma 3's q_norm and "
        "k_norm); false: by weight, initialised to one"
    )

    @model_validator(mode="after")
    def _check_offset(self) -> QKNormSpec:
        if self.unit_offset and self.kind != "rmsnorm":
            raise ValueError(f"unit_offset: the (1 + weight) scale is an RMSNorm's, not a {self.kind}'s; "
                             f"set kind: rmsnorm or unit_offset: false")
        return self


def checked_multiplier(value: float | None, field: str, what: str, example: str) -> float | None:
    """A float multiplier of a spec (``field``, ``what`` it multiplies): positive and finite, or None."""
    if value is not None and not (0 < value < math.inf):
        raise ValueError(f"{field} is {what}, a positive finite number, got {value!r}; use e.g. {example}, or null "
                         f"for none")
    return value


def _checked_cap(value: float | None) -> float | None:
    """A soft-capping value: positive and finite, or None (no cap)."""
    if value is not None and not (0 < value < math.inf):
        raise ValueError(f"soft-capping squashes values into (-softcap, softcap), so it must be a positive finite "
                         f"number, got {value!r}; use e.g. 50.0, or null for no cap")
    return value


class AttentionSpec(ComponentSpec):
    """Multi-head attention. ``n_kv_heads`` picks MHA (= n_heads), GQA (a divisor) or MQA (1).
    ``window`` makes self-attention local: causal (sliding-window attention, Mistral) or both ways,
    window // 2 tokens each side (an encoder's, ModernBERT's local attention).

    The scores are ``q·k / sqrt(scale_dim or head size)``, or ``q·k * scale`` with a float ``scale``
    (Granite's attention_multiplier); ``softcap`` then squashes them into
    (-softcap, softcap) with ``softcap * tanh(scores / softcap)`` before the position bias and the
    mask (Gemma 2). Fused kernels (SDPA's flash and memory-efficient kernels, zoo's CPU kernel) take
    no cap, so the spec declares which path computes it (``kernel``: fused or scores): a soft-capped
    attention computes its scores explicitly, keeping its [B, H, T, S] weights for the backward pass.

    ``n_kv_heads`` may be left out but for gqa (mqa: 1; other kinds: ``n_heads``): it reads back as
    that number, and a spec written out leaves it out again, so an override of ``n_heads`` carries
    to it."""

    kind: Literal["mha", "gqa", "mqa"] = "mha"
    n_heads: PositiveInt = 8
    n_kv_heads: PositiveInt | None = Field(None, description="key/value heads; default: mha n_heads, mqa 1")
    head_dim: PositiveInt | None = Field(None, description="query/key size per head; default d_model // n_heads")
    v_head_dim: PositiveInt | None = Field(None, description="value size per head; default d_model // n_heads")
    bias: bool = Field(True, description="biases on the q, k and v projections, and on the output projection unless out_bias says otherwise")
    out_bias: bool | None = Field(None, description="a bias on the output projection; null: as bias (Qwen2: bias true, out_bias false)")
    key_bias: bool = Field(True, description="with bias: a bias on the key projection too; false: queries and values "
                           "only, the key's fixed at zero (EVA, BEiT: timm's q_bias and v_bias)")
    qk_norm: QKNormSpec | None = Field(None, description="a norm on queries and keys before the scores; null: none")
    window: int | None = Field(
        None,
        description="sliding-window attention: in a decoder each token attends to itself and the window - 1 tokens "
        "before it (Mistral's sliding_window); in an encoder to the tokens at most window // 2 slots away on either "
        "side (ModernBERT's local_attention); slots count padding too; null: to every token it may see",
    )
    scale_dim: int | None = Field(
        None, description="the scores are divided by sqrt(scale_dim) instead of sqrt(head_dim) (Gemma 2 and 3's "
        "query_pre_attn_scalar); null: the query/key head size, the paper's 1/sqrt(d_k)",
    )
    scale: float | None = Field(
        None, description="the scores are multiplied by this number instead of 1/sqrt(head_dim) (Granite's "
        "attention_multiplier, muP's 1/head_dim); null: 1/sqrt(scale_dim or the head size); not with scale_dim",
    )
    softcap: float | None = Field(
        None, description="soft-capping of the scores, softcap * tanh(scores / softcap), after the scale and before "
        "the position bias and the mask (Gemma 2's attn_logit_softcapping, 50.0); null: none. Computed on explicit "
        "scores, not by a fused kernel",
    )
    sinks: bool = Field(False, description="a learned logit per head (parameter sinks [n_heads]) joins each query's "
                        "softmax denominator and is dropped (gpt-oss's attention sinks); computed on explicit scores")
    gate: bool = Field(False, description="an output gate: each head's output times the sigmoid of a projection of x "
                       "(rows beside each head's query rows, biased as they are; Qwen3-Next's gated attention)")

    @field_validator("scale")
    @classmethod
    def _check_scale(cls, scale: float | None) -> float | None:
        return checked_multiplier(scale, "scale", "the scores' factor", "0.0078125 (Granite's attention_multiplier)")

    @field_validator("softcap")
    @classmethod
    def _check_softcap(cls, softcap: float | None) -> float | None:
        return _checked_cap(softcap)

    @field_validator("scale_dim")
    @classmethod
    def _check_scale_dim(cls, scale_dim: int | None) -> int | None:
        if scale_dim is not None and scale_dim < 1:
            raise ValueError(f"the scores are divided by sqrt(scale_dim), so it is a positive whole number, got "
                             f"{scale_dim}; use null for the head size, or the checkpoint's query_pre_attn_scalar")
        return scale_dim

    @field_validator("window")
    @classmethod
    def _check_window(cls, window: int | None) -> int | None:
        if window is not None and window < 1:
            raise ValueError(
                f"a sliding window covers at least the token itself, so window >= 1, got {window}; "
                f"use null for attention to every earlier token"
            )
        return window

    @model_validator(mode="before")
    @classmethod
    def _kv_heads_of_the_kind(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("n_kv_heads") is None and data.get("kind") != "gqa":
            n_heads = data.get("n_heads", cls.model_fields["n_heads"].default)
            data = {**data, "n_kv_heads": 1 if data.get("kind") == "mqa" else n_heads}
        return data

    @model_serializer(mode="wrap")
    def _leave_out_the_kinds_kv_heads(self, handler: Any) -> dict:
        data = handler(self)
        if self.kind != "gqa" and self.n_kv_heads == (1 if self.kind == "mqa" else self.n_heads):
            data["n_kv_heads"] = None
        return data

    @model_validator(mode="after")
    def _check_heads(self) -> AttentionSpec:
        h, g = self.n_heads, self.n_kv_heads
        if self.kind == "mha" and g not in (None, h):
            raise ValueError(f"kind mha has n_kv_heads == n_heads ({h}), got n_kv_heads={g}; use kind: gqa")
        if self.kind == "mqa" and g not in (None, 1):
            raise ValueError(f"kind mqa has one key/value head, got n_kv_heads={g}; use kind: gqa")
        if self.kind == "gqa" and g is None:
            raise ValueError("kind gqa needs n_kv_heads (a divisor of n_heads)")
        if g is not None and h % g:
            divisors = [d for d in range(1, h + 1) if h % d == 0]
            raise ValueError(f"n_heads ({h}) must be divisible by n_kv_heads ({g}); choose n_kv_heads from {divisors}")
        return self

    @model_validator(mode="after")
    def _one_scale(self) -> AttentionSpec:
        if self.scale is not None and self.scale_dim is not None:
            raise ValueError(f"scale ({self.scale}) and scale_dim ({self.scale_dim}) both set the scores' factor; "
                             f"give one of them (scale = scale_dim ** -0.5)")
        return self

    @model_validator(mode="after")
    def _check_key_bias(self) -> AttentionSpec:
        if not self.key_bias and not self.bias:
            raise ValueError("key_bias: false drops the key's share of bias: true, but bias is false (no projection "
                             "has one); remove key_bias or set bias: true")
        return self

    @property
    def has_out_bias(self) -> bool:
        """Whether the output projection has a bias (``out_bias``, else ``bias``)."""
        return self.bias if self.out_bias is None else self.out_bias

    @property
    def kernel(self) -> Literal["fused", "scores"]:
        """What computes it: ``fused`` (SDPA or zoo's CPU kernel, :func:`zoo.kernels.attention`) or
        ``scores`` (the scores made explicit, :func:`zoo.kernels.scores_attention`), which a
        soft-capped attention or one with sinks needs: no fused kernel computes them."""
        return "fused" if self.softcap is None and not self.sinks else "scores"

    def qk_size(self, d_model: int) -> int:
        return self.head_dim or d_model // self.n_heads

    def rope_size(self, d_model: int) -> int:
        """The query/key head size a rotary position turns (before its ``fraction``): the head's."""
        return self.qk_size(d_model)

    def scale_size(self, d_model: int) -> int:
        """The size whose inverse square root scales the scores: ``scale_dim``, else the query/key
        head size (a float ``scale`` replaces it)."""
        return self.scale_dim or self.qk_size(d_model)

    def score_scale(self, d_model: int) -> float | None:
        """What the scores are multiplied by where it is not 1/sqrt(head size): ``scale``, else
        ``scale_dim ** -0.5``, else None."""
        if self.scale is not None:
            return self.scale
        return None if self.scale_dim is None else self.scale_dim ** -0.5

    def v_size(self, d_model: int) -> int:
        return self.v_head_dim or d_model // self.n_heads


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
        return _checked_cap(softcap)

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
