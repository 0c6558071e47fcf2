"""Qwen's mixture-of-experts decoders (:class:`~zoo.interop.hf.moe.MoEDecoder`), each with dense
layers where ``decoder_sparse_step`` and ``mlp_only_layers`` say (a layer pattern in zoo):

``Qwen2MoeForCausalLM`` (Qwen1.5-MoE, Qwen2-57B-A14B) <-> Qwen2's attention (biases on q, k and v by
``qkv_bias``, none on the output, the head size d_model / n_heads, sliding windows per layer by
``layer_types``: :func:`~zoo.interop.hf.traits.layer_windows`) and MoE blocks of ``num_experts``
experts ``moe_intermediate_size`` wide plus a shared expert (``shared_expert_intermediate_size``)
scaled by the sigmoid of its gate.

``Qwen3MoeForCausalLM`` (Qwen3-30B-A3B, Qwen3-235B-A22B) <-> Qwen3's attention (an RMSNorm on each
query and key head, its own ``head_dim``, one ``attention_bias``), ``sliding_window`` on every layer
or none (``use_sliding_window``), and MoE blocks without a shared expert."""

from __future__ import annotations

from zoo.interop.claims import ANY
from zoo.interop.hf.base import same_layers
from zoo.interop.hf.llama import LLAMA
from zoo.interop.hf.moe import MoEDecoder, MoEFields, moe_ffn
from zoo.interop.hf.table import Derived, Tokens, table
from zoo.interop.hf.traits import heads, layer_windows, qk_norm, qkv_bias
from zoo.spec import FamilySpec

__all__ = ["Qwen2Moe", "Qwen3Moe"]


class Qwen2Moe(MoEDecoder):
    name = "Qwen2MoeForCausalLM"
    config_name = "Qwen2MoeConfig"
    model_type = "qwen2_moe"
    base = "Qwen2MoeModel"
    moe = MoEFields(expert="moe_intermediate_size", shared=True, dense_layers=True)
    table = table(LLAMA, heads(head_dim_field=False), qkv_bias("qkv_bias"), layer_windows("Qwen2-MoE", parts=("ffn",)),
                  Tokens({}), moe_ffn(moe))


def _window(c, where: str) -> dict:
    return {"block.attention.window": c.sliding_window if c.use_sliding_window else None}


def _write_window(s: FamilySpec, where: str) -> dict:
    same_layers(s, where, parts=("ffn",))  # one window for every layer
    window = s.block.attention.window
    return {"use_sliding_window": window is not None, "sliding_window": window}


class Qwen3Moe(MoEDecoder):
    name = "Qwen3MoeForCausalLM"
    config_name = "Qwen3MoeConfig"
    model_type = "qwen3_moe"
    base = "Qwen3MoeModel"
    moe = MoEFields(expert="moe_intermediate_size", dense_layers=True)
    table = table(LLAMA, qk_norm("head", "Qwen3-MoE", "each query and key head"),
                  Derived("window", _window, _write_window, {"block.attention.window": ANY}), Tokens({}), moe_ffn(moe))
