"""Qwen2: ``Qwen2ForCausalLM`` <-> a zoo decoder laid out as LLaMA, with biases on the q, k and v
projections but none on the output projection (``bias: true, out_bias: false``), the head size
hidden_size / heads, and sliding-window attention on every layer, none, or some (``layer_types``;
Qwen2's ``max_window_layers``: the layers from that index on slide), which zoo writes as a layer
pattern (:func:`~zoo.interop.hf.traits.layer_windows`)::

    block: {attention: {window: null, ...}}
    layers: [{at: "2:", block: {attention: {window: 4096}}}]     # max_window_layers 2
"""

from __future__ import annotations

from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Fixed, Tokens, table
from zoo.interop.hf.traits import heads, layer_windows, qkv_bias

__all__ = ["Qwen2"]


class Qwen2(Llama):
    name = "Qwen2ForCausalLM"
    config_name = "Qwen2Config"
    model_type = "qwen2"
    base = "Qwen2Model"
    table = table(LLAMA, heads(head_dim_field=False), qkv_bias(), Fixed("block.ffn.bias", False), layer_windows("Qwen2"),
                  Tokens({}))
