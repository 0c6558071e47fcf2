"""LLaMA: ``LlamaForCausalLM`` <-> a zoo decoder with RoPE (its base and scaling: ``rope_parameters``,
:mod:`zoo.interop.hf.rope`), RMSNorm and a gated FFN (MHA, GQA or MQA).

:class:`Llama` is also the base of the references laid out as LLaMA (``model.layers.{i}.self_attn.
{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``): Mistral, Qwen2, Qwen3, Gemma, OLMo 2, Phi-3,
StableLM, Granite, Cohere and SmolLM3 each state their config as :data:`LLAMA`'s table (:mod:`zoo.interop.hf.table`) with the
traits they add or swap (:mod:`zoo.interop.hf.traits`), and name their tensors' differences in
class attributes: Phi-3 fuses the projections (``qkv_proj``, ``gate_up_proj``: ``qkv`` and
``gate_up``), OLMo 2 names its norms otherwise (``norm_names``).

Each has a backbone without the head (``LlamaModel``: ``base``), converted by
:meth:`~zoo.interop.hf.base.Architecture.headless`.
"""

from __future__ import annotations

from typing import ClassVar

from zoo.interop.common import Rule, rule
from zoo.interop.hf.base import Architecture, fused, weights
from zoo.interop.hf.table import Field, Fixed, Tokens, table, table_rules
from zoo.interop.hf.traits import decoder, gated_ffn, heads, one_bias, rope
from zoo.spec import FamilySpec

__all__ = ["LLAMA", "LLAMA_ACTS", "Llama"]

LLAMA_ACTS = {("swiglu", "none"): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh"}

# LlamaConfig <-> a zoo decoder, field by field
LLAMA = table(
    decoder(),
    rope(),
    heads(),
    gated_ffn(LLAMA_ACTS),
    Field("mlp_bias", "block.ffn.bias"),
    Fixed("block.norm.kind", "rmsnorm", why="RMSNorm (rmsnorm)"), Field("rms_norm_eps", "block.norm.eps"),
    Fixed("block.kind", "pre", why="norms before each sub-layer (pre)"),
    one_bias(),
    Field("attention_dropout", "dropout.attention"),
    Tokens({"bos_token_id": 1, "eos_token_id": 2}),
)


class Llama(Architecture):
    name = "LlamaForCausalLM"
    config_name = "LlamaConfig"
    model_type = "llama"
    base = "LlamaModel"
    prefix = "model"
    table = LLAMA
    norm_names: ClassVar[tuple[str, str]] = ("input_layernorm", "post_attention_layernorm")  # zoo's attn_norm, ffn_norm
    qkv: ClassVar[tuple[str, ...]] = ("q_proj", "k_proj", "v_proj")  # the attention's input projections, [q | k | v]
    gate_up: ClassVar[tuple[str, ...]] = ("gate_proj", "up_proj")  # the MLP's input projections, [gate | up]

    # ---------------------------------------------------------------------------- tensors
    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        att, nb = s.block.attention, getattr(s.block.norm, "bias", False)  # LayerNorm's bias (StableLM)
        attn_norm, ffn_norm = cls.norm_names
        rules = [rule("tok_emb.weight", "model.embed_tokens.weight")]
        for i, layer in enumerate(s.stack_layers()):
            z, h = f"stack.blocks.{i}", f"model.layers.{i}"
            rules += [
                *weights(f"{z}.attn_norm", f"{h}.{attn_norm}", bias=nb),
                *fused(f"{z}.attn.qkv", [f"{h}.self_attn.{p}" for p in cls.qkv], bias=att.bias),
                *weights(f"{z}.attn.out", f"{h}.self_attn.o_proj", bias=att.has_out_bias),
                *([] if getattr(s.block, "shared_norm", False) else weights(f"{z}.ffn_norm", f"{h}.{ffn_norm}", bias=nb)),
                *cls.ffn_rules(layer.block.ffn, z, h),
                *table_rules(cls.table, s, z, h),
            ]
        return rules + [*weights("stack.norm", "model.norm", bias=nb), rule("head.weight", "lm_head.weight")]

    @classmethod
    def ffn_rules(cls, ffn, z: str, h: str) -> list[Rule]:
        """Rules for the FFN ``ffn`` (a spec) of zoo block ``z`` and reference layer ``h``."""
        return [*fused(f"{z}.ffn.fc1", [f"{h}.mlp.{p}" for p in cls.gate_up], bias=ffn.bias),  # [gate | up]
                *weights(f"{z}.ffn.fc2", f"{h}.mlp.down_proj", bias=ffn.bias)]
