"""Qwen3: ``Qwen3ForCausalLM`` <-> a zoo decoder laid out as LLaMA, with RMSNorm on each query and key
head before RoPE (``block.attention.qk_norm: {kind: rmsnorm, scope: head}``, weights [head_dim]
shared by the heads, with the blocks' eps), a head size of its own (``head_dim``), one
``attention_bias`` for the four projections, and Qwen2's sliding windows on every layer, none, or
some (``layer_types``, ``max_window_layers``: :func:`~zoo.interop.hf.traits.layer_windows`)."""

from __future__ import annotations

from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Fixed, Tokens, table
from zoo.interop.hf.traits import layer_windows, qk_norm

__all__ = ["Qwen3"]


class Qwen3(Llama):
    name = "Qwen3ForCausalLM"
    config_name = "Qwen3Config"
    model_type = "qwen3"
    base = "Qwen3Model"
    table = table(LLAMA, qk_norm("head", "Qwen3", "each query and key head"), Fixed("block.ffn.bias", False),
                  layer_windows("Qwen3"), Tokens({}))  # Qwen3Config's token ids are None
