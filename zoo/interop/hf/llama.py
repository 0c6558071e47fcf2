"""LLaMA: ``LlamaForCausalLM`` <-> a zoo decoder with RoPE (its base and scaling: ``rope_parameters``,
:mod:`zoo.interop.hf.rope`), RMSNorm and a gated FFN (MHA, GQA or MQA).

:class:`Llama` is also the base of the references laid out as LLaMA (``model.layers.{i}.self_attn.
{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``): Mistral, Qwen2, Gemma and OLMo 2 subclass it and
override the hooks ``read`` (their config fields into the spec) and ``write`` (the spec into their
config fields), and the class attributes that name their differences. Phi-3 fuses the projections
(``qkv_proj``, ``gate_up_proj``: the class attributes ``qkv`` and ``gate_up``).

Each has a backbone without the head (``LlamaModel``: ``base``), converted by
:meth:`~zoo.interop.hf.base.Architecture.headless`.
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

__all__ = ["Llama", "qk_norm_rules", "rms_qk_norm"]

NORMS_AT = {"pre": "before", "post_sublayer": "after", "sandwich": "before and after"}  # by block kind


class Llama(Architecture):
    name = "LlamaForCausalLM"
    config_name = "LlamaConfig"
    model_type = "llama"
    base = "LlamaModel"
    prefix = "model"
    acts: ClassVar[dict[tuple[str, str], str]] = {  # (zoo FFN kind, approximate) -> HF activation
        ("swiglu", "none"): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh",
    }
    act_field: ClassVar[str] = "hidden_act"  # the config field naming the FFN's activation
    head_dim_field: ClassVar[bool] = True  # the config has head_dim (else the head size is hidden_size / heads)
    block_kind: ClassVar[str] = "pre"  # where the norms sit
    norm_names: ClassVar[tuple[str, str]] = ("input_layernorm", "post_attention_layernorm")  # zoo's attn_norm, ffn_norm
    claims: ClassVar[Claims] = {
        **TEXT_CLAIMS, "position.kind": one_of("rope"), "position.base": ANY, "position.scaling": ANY, "block.kind": one_of("pre"),
        "block.norm.kind": one_of("rmsnorm"), "block.attention.out_bias": ANY, "dropout.attention": ANY,
    }
    one_bias: ClassVar[bool] = True  # one attention_bias for q, k, v and the output projection
    partial_rotary: ClassVar[bool] = False  # rope_parameters' partial_rotary_factor is position.fraction (else refused)
    qkv: ClassVar[tuple[str, ...]] = ("q_proj", "k_proj", "v_proj")  # the attention's input projections, [q | k | v]
    gate_up: ClassVar[tuple[str, ...]] = ("gate_proj", "up_proj")  # the MLP's input projections, [gate | up]
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
            "position": cls.rope(c, where),
            "block": {
                "attention": {"kind": kind, "n_heads": h, "n_kv_heads": g if kind == "gqa" else None,
                              "head_dim": head_dim, "v_head_dim": head_dim},
                "ffn": cls.ffn(c, where),
                "norm": {"kind": "rmsnorm", "eps": c.rms_norm_eps},
                "kind": cls.block_kind,
            },
            "dropout": {"attention": c.attention_dropout},
            "init": {"scheme": "normal", "std": c.initializer_range},
        }
        cls.read(c, s, where)
        return s

    @classmethod
    def ffn(cls, c: Any, where: str) -> dict:
        """The model's FFN from the config: a gated FFN, its activation ``act_field``, its width
        ``intermediate_size`` (``read`` sets its bias)."""
        return {**ffn_of(GATED, getattr(c, cls.act_field), where, cls.act_field), "hidden": c.intermediate_size, "bias": False}

    @classmethod
    def rope(cls, c: Any, where: str) -> dict:
        """The zoo position of the config's rope: ``rope_theta``, any scaling zoo expresses, and with
        ``partial_rotary`` the ``partial_rotary_factor`` (:func:`zoo.interop.hf.rope.read_rope`)."""
        return read_rope(c, where, partial=cls.partial_rotary)

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
                f"{cls.name} puts its norms {NORMS_AT[cls.block_kind]} each sub-layer ({cls.block_kind})")
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
            "vocab_size": s.vocab_size, "hidden_size": d, **cls.ffn_config(s, where),
            "num_hidden_layers": s.n_layers, "num_attention_heads": att.n_heads, "num_key_value_heads": att.n_kv_heads,
            "max_position_embeddings": s.max_seq_len,
            "rms_norm_eps": s.block.norm.eps, "rope_parameters": write_rope(s.position, partial=cls.partial_rotary),
            "attention_dropout": s.dropout.attention, "initializer_range": s.init.std, "tie_word_embeddings": s.head.tied,
        }
        if cls.head_dim_field:
            c["head_dim"] = att.qk_size(d)
        cls.write(s, c, where)
        token_ids(c, s.vocab_size, cls.token_defaults, given)
        return c

    @classmethod
    def ffn_config(cls, s: FamilySpec, where: str) -> dict:
        """The config fields of the spec's FFN: its width and activation (``write`` writes its bias)."""
        return {"intermediate_size": s.block.ffn.hidden_size(s.d_model), cls.act_field: act_name(s.block.ffn, cls.acts, where)}

    @classmethod
    def write(cls, s: FamilySpec, c: dict, where: str) -> None:
        """Check what the reference's own config fields can express; write them into ``c``."""
        c.update(attention_bias=s.block.attention.bias, mlp_bias=s.block.ffn.bias)

    # ---------------------------------------------------------------------------- tensors
    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        att = s.block.attention
        attn_norm, ffn_norm = cls.norm_names
        rules = [rule("tok_emb.weight", "model.embed_tokens.weight")]
        for i, layer in enumerate(s.stack_layers()):
            z, h = f"stack.blocks.{i}", f"model.layers.{i}"
            rules += [
                rule(f"{z}.attn_norm.weight", f"{h}.{attn_norm}.weight"),
                *fused(f"{z}.attn.qkv", [f"{h}.self_attn.{p}" for p in cls.qkv], bias=att.bias),
                *weights(f"{z}.attn.out", f"{h}.self_attn.o_proj", bias=att.has_out_bias),
                rule(f"{z}.ffn_norm.weight", f"{h}.{ffn_norm}.weight"),
                *cls.ffn_rules(layer.block.ffn, z, h),
            ]
            rules += cls.layer_rules(s, z, h)
        return rules + [rule("stack.norm.weight", "model.norm.weight"), rule("head.weight", "lm_head.weight")]

    @classmethod
    def ffn_rules(cls, ffn, z: str, h: str) -> list[Rule]:
        """Rules for the FFN ``ffn`` (a spec) of zoo block ``z`` and reference layer ``h``."""
        return [*fused(f"{z}.ffn.fc1", [f"{h}.mlp.{p}" for p in cls.gate_up], bias=ffn.bias),  # [gate | up]
                *weights(f"{z}.ffn.fc2", f"{h}.mlp.down_proj", bias=ffn.bias)]

    @classmethod
    def layer_rules(cls, s: FamilySpec, z: str, h: str) -> list[Rule]:
        """Rules for a layer's tensors beyond LLaMA's (zoo block ``z``, reference layer ``h``)."""
        return []


def rms_qk_norm(s: FamilySpec, where: str, *, scope: str, who: str, what: str) -> None:
    """Check that the spec's qk-norm is an RMSNorm over ``scope`` (``what`` it normalises, in words)
    with the block norm's eps: the references with one ``rms_norm_eps`` (OLMo 2, Qwen3)."""
    qk, norm = s.block.attention.qk_norm, s.block.norm
    require(qk is not None and (qk.kind, qk.scope, qk.unit_offset) == ("rmsnorm", scope, False), where,
            "block.attention.qk_norm", qk.model_dump() if qk is not None else None,
            f"{who} applies RMSNorm (by weight, not 1 + weight) to {what} (qk_norm: {{kind: rmsnorm, scope: {scope}}})")
    require(qk.eps == norm.eps, where, "block.attention.qk_norm.eps", qk.eps,
            f"{who} has one rms_norm_eps for every norm (block.norm.eps is {norm.eps})")


def qk_norm_rules(z: str, h: str) -> list[Rule]:
    """The qk-norm weights of zoo block ``z`` and reference layer ``h`` (``self_attn.q_norm``, ``k_norm``)."""
    return [rule(f"{z}.attn.{n}.weight", f"{h}.self_attn.{n}.weight") for n in ("q_norm", "k_norm")]
