"""The spec of multi-head latent attention (``attention.kind: mla``; DeepSeek-V2 and V3): queries
and keys/values each pass through a low-rank latent, and a small decoupled key shared by the heads
carries the rotary positions, so a decoder caches the latent and that key instead of every head's
keys and values."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_serializer, model_validator

from zoo.spec.base import register_specs
from zoo.spec.parts import AttentionSpec

__all__ = ["MLASpec"]


class MLASpec(AttentionSpec):
    """Multi-head latent attention (DeepSeek-V2, Liu et al. 2024; HF ``DeepseekV3Attention``).

    Queries: ``q_lora_rank`` set, x -> a linear down to the rank -> an RMSNorm -> a linear up to
    n_heads * (qk_nope_head_dim + qk_rope_head_dim); null, one linear (DeepSeek-V2-Lite). Keys and
    values: x -> a linear down to ``kv_lora_rank`` + ``qk_rope_head_dim``; the first part, through an
    RMSNorm, is the latent, which a linear expands into each head's key part without positions
    (``qk_nope_head_dim``) and its value (``v_head_dim``); the second is one rotary key part shared
    by every head. A head's key is [its no-position part | the shared rotary part], its query alike,
    and only the ``qk_rope_head_dim`` rotary parts turn: the position's head size is theirs
    (:meth:`rope_size`). The cache holds the latent and the shared rotary key per token
    (kv_lora_rank + qk_rope_head_dim elements per layer, for every head together).

    ``head_dim`` is qk_nope_head_dim + qk_rope_head_dim (the scores' default scale 1/sqrt of it);
    ``scale`` sets another (yarn's mscale, as HF's DeepSeek-V3 folds it in). ``bias``: biases on the
    two down projections and, unless ``out_bias`` says otherwise, on the output projection (HF's
    attention_bias); the single query projection and the up projections have none.

    ``fold`` chooses how a pass with a cache computes, never what: folded (absorbed, as DeepSeek's
    inference code and vLLM decode) scores each head's query, carried into the latent's space by
    the head's key rows of the up projection, against the cached latents themselves and passes the
    weighted latents through the head's value rows, expanding nothing per cached token; unfolded
    expands every cached latent into the heads' keys and values. ``auto`` folds a pass with a
    cache when that takes fewer multiply-adds (decoding steps), and never without one (training);
    ``always`` and ``never`` force either."""

    kind: Literal["mla"] = "mla"
    q_lora_rank: PositiveInt | None = Field(
        None, description="the queries' latent size (a down projection, an RMSNorm, an up projection); null: one "
        "query projection (DeepSeek-V2-Lite)")
    kv_lora_rank: PositiveInt = Field(512, description="the keys' and values' latent size, what the cache holds per token "
                                      "besides the rotary key")
    qk_nope_head_dim: PositiveInt = Field(128, description="each head's query/key part without positions")
    qk_rope_head_dim: PositiveInt = Field(64, description="the rotary query/key part (the key's shared by the heads)")
    latent_eps: PositiveFloat = Field(1e-6, description="eps of the RMSNorms on the query and key/value latents (HF: "
                                      "always 1e-6, not rms_norm_eps)")
    bias: bool = Field(False, description="biases on the down projections (q and kv latents) and, unless out_bias "
                       "says otherwise, on the output projection (HF's attention_bias)")
    fold: Literal["auto", "always", "never"] = Field(
        "auto", description="cached decoding in the latent's space (absorbed up projections: nothing expanded per "
        "cached token): auto where it takes fewer multiply-adds with a cache, always, never; the same function")

    @model_validator(mode="before")
    @classmethod
    def _head_size(cls, data: Any) -> Any:
        if isinstance(data, dict):
            size = data.get("qk_nope_head_dim", 128) + data.get("qk_rope_head_dim", 64)
            if data.get("head_dim") not in (None, size):
                raise ValueError(f"head_dim: an mla head's query/key size is qk_nope_head_dim + qk_rope_head_dim "
                                 f"({size}), got {data['head_dim']}; leave head_dim out")
            data = {**data, "head_dim": size}
        return data

    @model_serializer(mode="wrap")
    def _leave_out_derived(self, handler: Any) -> dict:
        data = handler(self)
        data.pop("head_dim", None)
        data.pop("n_kv_heads", None)
        return data

    @model_validator(mode="after")
    def _check_mla(self) -> MLASpec:
        if self.n_kv_heads != self.n_heads:
            raise ValueError(f"n_kv_heads: mla expands every head's keys and values from one latent, so n_kv_heads is "
                             f"n_heads ({self.n_heads}), got {self.n_kv_heads}; leave n_kv_heads out")
        if self.qk_norm is not None:
            raise ValueError("qk_norm: mla normalises its latents (latent_eps), not the queries and keys; remove qk_norm")
        if not self.key_bias:
            raise ValueError("key_bias: mla's key projection is its key/value latent's; remove key_bias")
        for name, bad in (("sinks", self.sinks), ("gate", self.gate), ("temperature", self.temperature is not None)):
            if bad:
                raise ValueError(f"{name}: mla has no {name} (attention.kind: gqa has); remove {name}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim: rope rotates pairs of dimensions, so it must be even, got "
                             f"{self.qk_rope_head_dim}")
        return self

    def rope_size(self, d_model: int) -> int:
        """The rotated part of a query/key head: ``qk_rope_head_dim``."""
        return self.qk_rope_head_dim

    def cache_size(self, d_model: int) -> int:
        """Elements a layer caches per token: the latent and the shared rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


register_specs("attention", AttentionSpec, {"mla": MLASpec})
