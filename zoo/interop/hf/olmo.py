"""OLMo: ``OlmoForCausalLM`` <-> a zoo decoder laid out as LLaMA (``model.layers.{i}.self_attn.{q,k,v,o}_proj``,
``mlp.{gate,up,down}_proj``) with OLMo's non-parametric LayerNorm (Groeneveld et al. 2024): no weight and no
bias, eps 1e-5 (``block.norm: {kind: layernorm, affine: false}``), so the norms have no tensors; the MLP has
no biases and the head size is hidden_size / heads.

``clip_qkv`` (q, k and v clamped to [-clip_qkv, clip_qkv], OLMo-7B-0424) is refused by name: zoo's
attention does not clamp its projections.
"""

from __future__ import annotations

from zoo.interop.hf.llama import LLAMA, Llama
from zoo.interop.hf.table import Fixed, Refuse, Tokens, table
from zoo.interop.hf.traits import heads

__all__ = ["Olmo"]


class Olmo(Llama):
    name = "OlmoForCausalLM"
    config_name = "OlmoConfig"
    model_type = "olmo"
    base = "OlmoModel"
    table = table(
        LLAMA, heads(head_dim_field=False),
        Fixed("block.norm.kind", "layernorm", why="LayerNorm without weight or bias (layernorm, affine: false)"),
        Fixed("block.norm.affine", False, why="LayerNorm without weight or bias (affine: false)"),
        Fixed("block.norm.bias", False, why="LayerNorm without weight or bias (bias: false)"),
        Fixed("block.norm.eps", 1e-5, why="OLMo's LayerNorm eps, 1e-5"),
        Fixed("block.ffn.bias", False),
        Refuse("clip_qkv", None, "OLMo's clip_qkv clamps q, k and v to [-clip_qkv, clip_qkv]; zoo's attention does not "
               "clamp its projections"),
        Tokens({"bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1}),
    )
