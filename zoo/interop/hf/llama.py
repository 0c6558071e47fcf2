"""LLaMA: ``LlamaForCausalLM`` <-> a zoo decoder with RoPE, RMSNorm and a gated FFN (MHA, GQA or MQA)."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import (
    BUILTIN_ATTENTION,
    GATED,
    Architecture,
    act_name,
    ffn_of,
    fused,
    no_dropout,
    require,
    token_ids,
    weights,
)
from zoo.spec import FamilySpec

__all__ = ["Llama"]


class Llama(Architecture):
    name = "LlamaForCausalLM"
    config_name = "LlamaConfig"
    model_type = "llama"
    acts: ClassVar[dict[tuple[str, str], str]] = {  # (zoo FFN kind, approximate) -> HF activation
        ("swiglu", "none"): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh",
    }

    @staticmethod
    def spec(c: Any, hf: nn.Module | None) -> dict:
        where = "LlamaForCausalLM -> zoo"
        rope = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {"rope_type": "default"})
        if rope.get("rope_type", "default") != "default":
            raise unsupported(where, "rope_parameters.rope_type", rope["rope_type"],
                              "zoo's rope has the default frequencies only (no scaling)")
        for key in sorted(set(rope) - {"rope_type", "rope_theta"}):
            raise unsupported(where, f"rope_parameters.{key}", rope[key], "zoo's rope rotates every dimension with the default frequencies")
        if getattr(c, "partial_rotary_factor", None) not in (None, 1.0):
            raise unsupported(where, "partial_rotary_factor", c.partial_rotary_factor, "zoo's rope rotates every dimension")
        h, g, d = c.num_attention_heads, c.num_key_value_heads, c.hidden_size
        head_dim = c.head_dim if getattr(c, "head_dim", None) and c.head_dim * h != d else None
        kind = "mha" if g == h else ("mqa" if g == 1 else "gqa")
        tied = c.tie_word_embeddings if hf is None else hf.lm_head.weight is hf.model.embed_tokens.weight
        return {
            "family": "decoder", "vocab_size": c.vocab_size, "max_seq_len": c.max_position_embeddings, "d_model": d,
            "n_layers": c.num_hidden_layers, "tie_embeddings": tied, "head_bias": False,
            "embedding": {"scale": False, "norm": False},
            "position": {"kind": "rope", "base": rope.get("rope_theta", 10000.0)},
            "block": {
                "attention": {"kind": kind, "n_heads": h, "n_kv_heads": g if kind == "gqa" else None,
                              "head_dim": head_dim, "v_head_dim": head_dim, "bias": c.attention_bias},
                "ffn": {**ffn_of(GATED, c.hidden_act, where, "hidden_act"), "hidden": c.intermediate_size, "bias": c.mlp_bias},
                "norm": {"kind": "rmsnorm", "placement": "pre", "eps": c.rms_norm_eps},
            },
            "dropout": {"attention": c.attention_dropout},
            "init": {"scheme": "normal", "std": c.initializer_range},
        }

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = "zoo -> LlamaForCausalLM"
        att, d = s.block.attention, s.d_model
        require(s.position.kind == "rope", where, "position.kind", s.position.kind,
                "LLaMA has rotary positions (a decoder with learned positions converts to GPT2LMHeadModel)")
        require(s.block.norm.kind == "rmsnorm", where, "block.norm.kind", s.block.norm.kind, "LLaMA uses RMSNorm")
        require(s.norm_placement == "pre", where, "block.norm.placement", s.norm_placement, "LLaMA is pre-norm")
        require(att.kind in BUILTIN_ATTENTION, where, "block.attention.kind", att.kind, "only zoo's built-in attention converts")
        require(att.qk_size(d) == att.v_size(d), where, "block.attention.v_head_dim", att.v_size(d),
                f"LLaMA has one head size for queries, keys and values (head_dim {att.qk_size(d)})")
        require(not s.embedding.scale and not s.embedding.norm, where, "embedding", s.embedding.model_dump(),
                "LLaMA neither scales nor normalises its embeddings")
        require(not s.head_bias, where, "head_bias", True, "LLaMA's output projection has no bias")
        no_dropout(s, where, ("embedding", "residual", "ffn"), "LLaMA's only dropout is on the attention weights")
        c = {
            "vocab_size": s.vocab_size, "hidden_size": d, "intermediate_size": s.block.ffn.hidden_size(d),
            "num_hidden_layers": s.n_layers, "num_attention_heads": att.n_heads, "num_key_value_heads": att.kv_heads,
            "head_dim": att.qk_size(d), "hidden_act": act_name(s.block.ffn, cls.acts, where),
            "max_position_embeddings": s.max_seq_len, "rms_norm_eps": s.block.norm.eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": s.position.base},
            "attention_bias": att.bias, "mlp_bias": s.block.ffn.bias, "attention_dropout": s.dropout.attention,
            "initializer_range": s.init.std, "tie_word_embeddings": s.tie_embeddings,
        }
        token_ids(c, s.vocab_size, {"bos_token_id": 1, "eos_token_id": 2}, given)
        return c

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        ab, fb = s.block.attention.bias, s.block.ffn.bias
        rules = [rule("tok_emb.weight", "model.embed_tokens.weight")]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"model.layers.{i}"
            rules += [
                rule(f"{z}.attn_norm.weight", f"{h}.input_layernorm.weight"),
                *fused(f"{z}.attn.qkv", [f"{h}.self_attn.{p}_proj" for p in "qkv"], bias=ab),
                *weights(f"{z}.attn.out", f"{h}.self_attn.o_proj", bias=ab),
                rule(f"{z}.ffn_norm.weight", f"{h}.post_attention_layernorm.weight"),
                *fused(f"{z}.ffn.fc1", [f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"], bias=fb),  # [gate | up]
                *weights(f"{z}.ffn.fc2", f"{h}.mlp.down_proj", bias=fb),
            ]
        return rules + [rule("stack.norm.weight", "model.norm.weight"), rule("head.weight", "lm_head.weight")]
