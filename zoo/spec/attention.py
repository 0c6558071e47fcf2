"""The spec of attention (``block.attention``, kinds mha, gqa and mqa: one class, the number of
key/value heads picks among them), its qk-norm and temperature sections, and the checks of a float
factor or cap other parts share (:mod:`zoo.spec.parts` re-exports them with the other parts)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_serializer, model_validator

from zoo.spec.base import ComponentSpec, Spec

__all__ = ["AttentionSpec", "QKNormSpec", "TemperatureSpec", "checked_cap", "checked_multiplier"]


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
    affine: bool = Field(True, description="rmsnorm only: false leaves out the weight, the plain x / sqrt(mean(x^2) + "
                         "eps) of each head (Llama 4's L2 qk norm, use_qk_norm); true: a learned weight")

    @model_validator(mode="after")
    def _check_offset(self) -> QKNormSpec:
        if self.unit_offset and self.kind != "rmsnorm":
            raise ValueError(f"unit_offset: the (1 + weight) scale is an RMSNorm's, not a {self.kind}'s; "
                             f"set kind: rmsnorm or unit_offset: false")
        if not self.affine and (self.kind != "rmsnorm" or self.unit_offset or self.scope != "head"):
            raise ValueError("affine: false is a weightless rmsnorm of each head; set kind: rmsnorm, scope: head and "
                             "unit_offset: false (or affine: true)")
        return self


class TemperatureSpec(Spec):
    """Attention temperature tuning (Llama 4's NoPE layers; Nakanishi 2025, arXiv 2501.19399): each
    query multiplied by ``1 + scale * log(1 + floor((slot + 1) / floor))``, its slot the index of its key
    in the sequence, padding and cached tokens counted (HF's cache position), so a long context's
    scores sharpen."""

    floor: PositiveInt = Field(8192, description="the slots per step of the logarithm (Llama 4's floor_scale)")
    scale: float = Field(0.1, description="the strength (Llama 4's attn_scale)")


def checked_multiplier(value: float | None, field: str, what: str, example: str) -> float | None:
    """A float multiplier of a spec (``field``, ``what`` it multiplies): positive and finite, or None."""
    if value is not None and not (0 < value < math.inf):
        raise ValueError(f"{field} is {what}, a positive finite number, got {value!r}; use e.g. {example}, or null "
                         f"for none")
    return value


def checked_cap(value: float | None) -> float | None:
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
    chunk: int | None = Field(
        None, description="chunked local attention: the tokens are cut into chunks of this many positions (0..chunk-1, "
        "chunk..2*chunk-1, ...) and a token attends only within its own (Llama 4's attention_chunk_size); with a "
        "cache a layer keeps at most chunk - 1 keys between steps; null: no chunks",
    )
    temperature: TemperatureSpec | None = Field(
        None, description="attention temperature tuning: each query scaled by 1 + scale * log(1 + floor((slot + 1) / "
        "floor)) (Llama 4's attn_temperature_tuning on its NoPE layers); null: none")
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
        return checked_cap(softcap)

    @field_validator("scale_dim")
    @classmethod
    def _check_scale_dim(cls, scale_dim: int | None) -> int | None:
        if scale_dim is not None and scale_dim < 1:
            raise ValueError(f"the scores are divided by sqrt(scale_dim), so it is a positive whole number, got "
                             f"{scale_dim}; use null for the head size, or the checkpoint's query_pre_attn_scalar")
        return scale_dim

    @field_validator("chunk")
    @classmethod
    def _check_chunk(cls, chunk: int | None) -> int | None:
        if chunk is not None and chunk < 1:
            raise ValueError(f"chunk: a chunk holds at least one token, got {chunk}; use null for no chunks")
        return chunk

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
        if self.gate and not self.key_bias:
            raise ValueError("gate: the output gate's rows join the fused q, k, v projection, which key_bias: false "
                             "splits into q_bias and v_bias; remove gate or key_bias")
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
