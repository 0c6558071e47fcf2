"""The spec of the gated DeltaNet linear-attention mixer (``attention.kind: gated_deltanet``;
Yang et al. 2024, Qwen3-Next's ``Qwen3NextGatedDeltaNet``): a recurrent state per value head
[key size x value size] that each token decays and corrects by the delta rule, in place of
attention over every earlier token, so a decoder carries a fixed-size state instead of a KV cache."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_serializer, model_validator

from zoo.spec.base import register_specs
from zoo.spec.parts import AttentionSpec

__all__ = ["GatedDeltaNetSpec"]


class GatedDeltaNetSpec(AttentionSpec):
    """Gated DeltaNet (HF ``Qwen3NextGatedDeltaNet``).

    ``n_heads`` value heads of ``v_head_dim`` and ``key_heads`` query/key heads of ``head_dim``
    (each query/key head serves n_heads / key_heads consecutive value heads). x -> queries, keys,
    values and an output gate z (one projection), and per value head the write strength b and the
    decay input a (another); queries, keys and values pass a causal depthwise convolution of
    ``conv_kernel`` taps and a SiLU; queries and keys are L2-normalised, queries scaled by
    1/sqrt(head_dim). Per token and value head the state S [head_dim, v_head_dim] decays by
    exp(-exp(A_log) * softplus(a + dt_bias)) and is corrected toward v by the delta rule with
    strength sigmoid(b); the output q·S passes an RMSNorm (``norm_eps``) gated by SiLU(z), then the
    output projection. The cache holds the convolution's last inputs and S: a fixed size per layer,
    not per token. No biases, no positions (give its layers ``position: {kind: none}`` in a mix)."""

    kind: Literal["gated_deltanet"] = "gated_deltanet"
    n_heads: PositiveInt = 32
    key_heads: PositiveInt = Field(16, description="query/key heads; each serves n_heads / key_heads value heads")
    head_dim: PositiveInt | None = Field(128, description="query/key size per head")
    v_head_dim: PositiveInt | None = Field(128, description="value size per head (the state is head_dim x v_head_dim)")
    conv_kernel: PositiveInt = Field(4, description="taps of the causal depthwise convolution on queries, keys and values")
    norm_eps: PositiveFloat = Field(1e-6, description="eps of the gated RMSNorm on the output")
    bias: bool = Field(False, description="always false: the mixer's projections have no biases")

    @model_validator(mode="before")
    @classmethod
    def _no_kv_heads(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("n_kv_heads") not in (None, data.get("n_heads", 32)):
                raise ValueError("n_kv_heads: gated_deltanet's query/key heads are key_heads; leave n_kv_heads out")
            data = {**data, "n_kv_heads": data.get("n_heads", 32)}
        return data

    @model_serializer(mode="wrap")
    def _leave_out_derived(self, handler: Any) -> dict:
        data = handler(self)
        data.pop("n_kv_heads", None)
        return data

    @model_validator(mode="after")
    def _check_deltanet(self) -> GatedDeltaNetSpec:
        if self.n_heads % self.key_heads:
            raise ValueError(f"key_heads: each query/key head serves a whole number of value heads, so n_heads "
                             f"({self.n_heads}) must be divisible by key_heads, got {self.key_heads}")
        for name, bad in (("bias", self.bias), ("out_bias", self.out_bias), ("qk_norm", self.qk_norm is not None),
                          ("window", self.window is not None), ("scale", self.scale is not None),
                          ("scale_dim", self.scale_dim is not None), ("softcap", self.softcap is not None),
                          ("sinks", self.sinks), ("gate", self.gate), ("chunk", self.chunk is not None),
                          ("temperature", self.temperature is not None)):
            if bad:
                raise ValueError(f"{name}: gated_deltanet has no {name} (its queries and keys are L2-normalised, its "
                                 f"output gated); remove {name}")
        return self

    def cache_size(self, d_model: int) -> int:
        """Elements a layer caches per token: none (its state has a fixed size, :meth:`state_size`)."""
        return 0

    def state_size(self, d_model: int) -> int:
        """Elements of a layer's decoding state per sequence: the recurrent state
        (n_heads x head_dim x v_head_dim) and the convolution's last conv_kernel - 1 inputs."""
        K, V = self.qk_size(d_model), self.v_size(d_model)
        return self.n_heads * K * V + (self.conv_kernel - 1) * (2 * self.key_heads * K + self.n_heads * V)


register_specs("attention", AttentionSpec, {"gated_deltanet": GatedDeltaNetSpec})
