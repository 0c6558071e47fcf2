"""OLMoE: ``OlmoeForCausalLM`` <-> a zoo decoder laid out as LLaMA with an RMSNorm on the whole q and k
projections before the heads are split (``block.attention.qk_norm: {kind: rmsnorm, scope: all}``, as
OLMo 2: ``q_norm`` [H*K], ``k_norm`` [G*K], the blocks' eps), one ``attention_bias`` for the four
projections, the head size d_model / n_heads, pre-norm blocks, and every FFN a mixture of
``num_experts`` experts ``intermediate_size`` wide, ``num_experts_per_tok`` per token, with
``norm_topk_prob`` (:class:`~zoo.interop.hf.moe.MoEDecoder`). ``clip_qkv`` (clamping q, k and v)
zoo does not have: a config that sets it is refused."""

from __future__ import annotations

from zoo.interop.hf.llama import LLAMA
from zoo.interop.hf.moe import MoEDecoder, MoEFields, moe_ffn
from zoo.interop.hf.table import Refuse, Tokens, table
from zoo.interop.hf.traits import heads, qk_norm

__all__ = ["Olmoe"]


class Olmoe(MoEDecoder):
    name = "OlmoeForCausalLM"
    config_name = "OlmoeConfig"
    model_type = "olmoe"
    base = "OlmoeModel"
    moe = MoEFields()
    table = table(LLAMA, heads(head_dim_field=False), qk_norm("all", "OLMoE", "the whole q and k projections"),
                  Refuse("clip_qkv", None, "zoo does not clamp the queries, keys and values"),
                  Tokens({"eos_token_id": 50279, "pad_token_id": 1}), moe_ffn(moe))
