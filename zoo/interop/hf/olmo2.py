"""OLMo 2: ``Olmo2ForCausalLM`` <-> a zoo decoder laid out as LLaMA, with RMSNorm on the whole q and k
projections before the heads are split (``block.attention.qk_norm``, scope ``all``) and the norms on
each sub-layer's output, before the residual add (``block.norm.placement: post_sublayer``)."""

from __future__ import annotations

from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Fixed, Tokens, table
from zoo.interop.hf.traits import heads, qk_norm

__all__ = ["Olmo2"]


class Olmo2(Llama):
    name = "Olmo2ForCausalLM"
    config_name = "Olmo2Config"
    model_type = "olmo2"
    base = "Olmo2Model"
    norm_names = ("post_attention_layernorm", "post_feedforward_layernorm")
    table = table(LLAMA, heads(head_dim_field=False), Fixed("block.kind", "post_sublayer", why="norms on each sub-layer's "
                  "output, before the residual add (post_sublayer)"), qk_norm("all", "OLMo 2", "the whole q and k projections"),
                  Fixed("block.ffn.bias", False), Tokens({"eos_token_id": 50279, "pad_token_id": None}))
