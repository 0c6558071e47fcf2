"""GPT-2: ``GPT2LMHeadModel`` <-> a zoo decoder with learned positions and LayerNorm (``GPT2Model``, its
backbone, <-> the same without a head)."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule
from zoo.interop.hf.base import (
    TEXT_CLAIMS,
    TWO_LAYER,
    Architecture,
    act_name,
    ffn_of,
    layernorm,
    plain_attention,
    refuse_config,
    require,
    token_ids,
    weights,
)
from zoo.spec import FamilySpec

__all__ = ["GPT2"]


class GPT2(Architecture):
    name = "GPT2LMHeadModel"
    base = "GPT2Model"
    prefix = "transformer"
    config_name = "GPT2Config"
    model_type = "gpt2"
    acts: ClassVar[dict[tuple[str, str], str]] = {  # (zoo FFN kind, approximate) -> HF activation
        ("relu", "none"): "relu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("silu", "none"): "silu",
    }
    claims: ClassVar[Claims] = {
        **TEXT_CLAIMS, "position.kind": one_of("learned"), "block.kind": one_of("pre"), "block.norm.kind": one_of("layernorm"),
        "block.norm.bias": one_of(True), "block.attention.out_bias": ANY, "dropout.embedding": ANY, "dropout.residual": ANY,
        "dropout.attention": ANY,
    }

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        where = f"{cls.name} -> zoo"
        refuse_config(c, where, {
            "scale_attn_weights": (True, "zoo always scales attention scores by 1/sqrt(head size)"),
            "scale_attn_by_inverse_layer_idx": (False, "zoo has no per-layer attention scaling"),
            "add_cross_attention": (False, "zoo decoders have no cross-attention"),
        })
        tied = c.tie_word_embeddings if hf is None else hf.lm_head.weight is hf.transformer.wte.weight
        return {
            "family": "decoder", "vocab_size": c.vocab_size, "max_seq_len": c.n_positions, "d_model": c.n_embd,
            "n_layers": c.n_layer, "head": {"kind": "lm", "bias": False, "tied": tied},
            "embedding": {"scale": False, "norm": False}, "position": {"kind": "learned"},
            "block": {
                "attention": {"kind": "mha", "n_heads": c.n_head, "bias": True},
                "ffn": {**ffn_of(TWO_LAYER, c.activation_function, where, "activation_function"),
                        "hidden": c.n_inner or 4 * c.n_embd, "bias": True},
                "norm": {"kind": "layernorm", "eps": c.layer_norm_epsilon},
                "kind": "pre",
            },
            "dropout": {"embedding": c.embd_pdrop, "residual": c.resid_pdrop, "attention": c.attn_pdrop, "ffn": 0.0},
            "init": {"scheme": "normal", "std": c.initializer_range, "scaled_residual": True},
        }

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = f"zoo -> {cls.name}"
        require(s.position.kind == "learned", where, "position.kind", s.position.kind,
                "GPT-2 has learned absolute positions (a decoder with rope converts to LlamaForCausalLM)")
        layernorm(s, where, "pre")
        plain_attention(s, where)
        require(s.block.ffn.bias, where, "block.ffn.bias", False, "GPT-2's MLP has biases")
        c = {
            "vocab_size": s.vocab_size, "n_positions": s.max_seq_len, "n_embd": s.d_model, "n_layer": s.n_layers,
            "n_head": s.block.attention.n_heads, "n_inner": s.block.ffn.hidden_size(s.d_model),
            "activation_function": act_name(s.block.ffn, cls.acts, where), "layer_norm_epsilon": s.block.norm.eps,
            "embd_pdrop": s.dropout.embedding, "resid_pdrop": s.dropout.residual, "attn_pdrop": s.dropout.attention,
            "initializer_range": s.init.std, "tie_word_embeddings": s.head.tied,
        }
        token_ids(c, s.vocab_size, {"bos_token_id": 50256, "eos_token_id": 50256}, given)
        return c

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        rules = [rule("tok_emb.weight", "transformer.wte.weight"), rule("position.weight", "transformer.wpe.weight")]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"transformer.h.{i}"
            rules += [
                *weights(f"{z}.attn_norm", f"{h}.ln_1"),
                *weights(f"{z}.attn.qkv", f"{h}.attn.c_attn", transpose=True),  # Conv1D: [in, out]
                *weights(f"{z}.attn.out", f"{h}.attn.c_proj", transpose=True),
                *weights(f"{z}.ffn_norm", f"{h}.ln_2"),
                *weights(f"{z}.ffn.fc1", f"{h}.mlp.c_fc", transpose=True),
                *weights(f"{z}.ffn.fc2", f"{h}.mlp.c_proj", transpose=True),
            ]
        return rules + [*weights("stack.norm", "transformer.ln_f"), rule("head.weight", "lm_head.weight")]
