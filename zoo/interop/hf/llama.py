"""LLaMA: ``LlamaForCausalLM`` <-> a zoo decoder with RoPE (its base and scaling: ``rope_parameters``,
:mod:`zoo.interop.hf.rope`), RMSNorm and a gated FFN (MHA, GQA or MQA).

:class:`Llama` is also the base of the references laid out as LLaMA (``model.layers.{i}.self_attn.
{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``): Mistral, Qwen2, Gemma and OLMo 2 subclass it and
override the hooks ``read`` (their config fields into the spec) and ``write`` (the spec into their
config fields), and the class attributes that name their differences.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule
from zoo.interop.hf.base import (
    BUILTIN_ATTENTION,
    GATED,
    TEXT_CLAIMS,
    Architecture,
    act_name,
    ffn_of,
    fused,
    require,
    token_ids,
    weights,
)
from zoo.interop.hf.rope import read_rope, write_rope
from zoo.spec import FamilySpec

__all__ = ["Llama"]


class Llama(Architecture):
    name = "LlamaForCausalLM"
    config_name = "LlamaConfig"
    model_type = "llama"
    acts: ClassVar[dict[tuple[str, str], str]] = {  # (zoo FFN kind, approximate) -> HF activation
        ("swiglu", "none"): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh",
    }
    head_dim_field: ClassVar[bool] = True  # the config has head_dim (else the head size is hidden_size / heads)
    block_kind: ClassVar[str] = "pre"  # where the norms sit
    norm_names: ClassVar[tuple[str, str]] = ("input_layernorm", "post_attention_layernorm")  # zoo's attn_norm, ffn_norm
    claims: ClassVar[Claims] = {
        **TEXT_CLAIMS, "position.kind": one_of("rope"), "position.base": ANY, "position.scaling": ANY, "block.kind": one_of("pre"),
        "block.norm.kind": one_of("rmsnorm"), "block.attention.out_bias": ANY, "dropout.attention": ANY,
    }
    one_bias: ClassVar[bool] = True  # one attention_bias for q, k, v and the output projection
    token_defaults: ClassVar[dict[str, int | None]] = {"bos_token_id": 1, "eos_token_id": 2}

    # ------------------------------------------------------------------ reference -> zoo
    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        where = f"{cls.name} -> zoo"
        h, g, d = c.num_attention_heads, c.num_key_value_heads, c.hidden_size
        head_dim = getattr(c, "head_dim", None)
        head_dim = head_dim if head_dim and head_dim * h != d else None
        kind = "mha" if g == h else ("mqa" if g == 1 else "gqa")
        tied = c.tie_word_embeddings if hf is None else hf.lm_head.weight is hf.model.embed_tokens.weight
        s = {
            "family": "decoder", "vocab_size": c.vocab_size, "max_seq_len": c.max_position_embeddings, "d_model": d,
            "n_layers": c.num_hidden_layers, "head": {"kind": "lm", "bias": False, "tied": tied},
            "embedding": {"scale": False, "norm": False},
            "position": read_rope(c, where),
            "block": {
                "attention": {"kind": kind, "n_heads": h, "n_kv_heads": g if kind == "gqa" else None,
                              "head_dim": head_dim, "v_head_dim": head_dim},
                "ffn": {**ffn_of(GATED, c.hidden_act, where, "hidden_act"), "hidden": c.intermediate_size, "bias": False},
                "norm": {"kind": "rmsnorm", "eps": c.rms_norm_eps},
                "kind": cls.block_kind,
            },
            "dropout": {"attention": c.attention_dropout},
            "init": {"scheme": "normal", "std": c.initializer_range},
        }
        cls.read(c, s, where)
        return s

    @classmethod
    def read(cls, c: Any, s: dict, where: str) -> None:
        """The reference's own config fields into the spec mapping ``s``."""
        s["block"]["attention"]["bias"] = c.attention_bias
        s["block"]["ffn"]["bias"] = c.mlp_bias

    # ------------------------------------------------------------------ zoo -> reference
    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = f"zoo -> {cls.name}"
        att, d = s.block.attention, s.d_model
        require(s.position.kind == "rope", where, "position.kind", s.position.kind,
                f"{cls.name} has rotary positions (a decoder with learned positions converts to GPT2LMHeadModel)")
        require(s.block.norm.kind == "rmsnorm", where, "block.norm.kind", s.block.norm.kind, f"{cls.name} uses RMSNorm")
        require(s.block.kind == cls.block_kind, where, "block.kind", s.block.kind,
                f"{cls.name} puts its norms {'before' if cls.block_kind == 'pre' else 'after'} each sub-layer ({cls.block_kind})")
        require(att.kind in BUILTIN_ATTENTION, where, "block.attention.kind", att.kind, "only zoo's built-in attention converts")
        require(att.qk_size(d) == att.v_size(d), where, "block.attention.v_head_dim", att.v_size(d),
                f"{cls.name} has one head size for queries, keys and values (head_dim {att.qk_size(d)})")
        if cls.one_bias:
            require(att.has_out_bias == att.bias, where, "block.attention.out_bias", att.out_bias,
                    f"{cls.name} has one bias setting (attention_bias) for every attention projection")
        if not cls.head_dim_field:
            require(att.qk_size(d) * att.n_heads == d, where, "block.attention.head_dim", att.qk_size(d),
                    f"{cls.name}'s head size is hidden_size / num_attention_heads ({d} / {att.n_heads})")
        c = {
            "vocab_size": s.vocab_size, "hidden_size": d, "intermediate_size": s.block.ffn.hidden_size(d),
            "num_hidden_layers": s.n_layers, "num_attention_heads": att.n_heads, "num_key_value_heads": att.n_kv_heads,
            "hidden_act": act_name(s.block.ffn, cls.acts, where), "max_position_embeddings": s.max_seq_len,
            "rms_norm_eps": s.block.norm.eps, "rope_parameters": write_rope(s.position),
            "attention_dropout": s.dropout.attention, "initializer_range": s.init.std, "tie_word_embeddings": s.head.tied,
        }
        if cls.head_dim_field:
            c["head_dim"] = att.qk_size(d)
        cls.write(s, c, where)
        token_ids(c, s.vocab_size, cls.token_defaults, given)
        return c

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        """Check what the reference's own config fields can express; write them into ``c``."""
        c.update(attention_bias=s.block.attention.bias, mlp_bias=s.block.ffn.bias)

    # ---------------------------------------------------------------------------- tensors
    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        att, fb = s.block.attention, s.block.ffn.bias
        attn_norm, ffn_norm = cls.norm_names
        rules = [rule("tok_emb.weight", "model.embed_tokens.weight")]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"model.layers.{i}"
            rules += [
                rule(f"{z}.attn_norm.weight", f"{h}.{attn_norm}.weight"),
                *fused(f"{z}.attn.qkv", [f"{h}.self_attn.{p}_proj" for p in "qkv"], bias=att.bias),
                *weights(f"{z}.attn.out", f"{h}.self_attn.o_proj", bias=att.has_out_bias),
                rule(f"{z}.ffn_norm.weight", f"{h}.{ffn_norm}.weight"),
                *fused(f"{z}.ffn.fc1", [f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"], bias=fb),  # [gate | up]
                *weights(f"{z}.ffn.fc2", f"{h}.mlp.down_proj", bias=fb),
            ]
            rules += cls.layer_rules(s, z, h)
        return rules + [rule("stack.norm.weight", "model.norm.weight"), rule("head.weight", "lm_head.weight")]

    @classmethod
    def layer_rules(cls, s: FamilySpec, z: str, h: str) -> list[Rule]:
        """Rules for a layer's tensors beyond LLaMA's (zoo block ``z``, reference layer ``h``)."""
        return []
