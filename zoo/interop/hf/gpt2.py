"""GPT-2: ``GPT2LMHeadModel`` <-> a zoo decoder with learned positions and LayerNorm (``GPT2Model``, its
backbone, <-> the same without a head): a field table (:mod:`zoo.interop.hf.table`) of GPT-2's
config names, multi-head attention with biases on every projection, a two-layer MLP with biases."""

from __future__ import annotations

from zoo.interop.claims import one_of
from zoo.interop.common import Rule, rule
from zoo.interop.hf.base import Architecture, weights
from zoo.interop.hf.table import Claim, Field, Fixed, Refuse, Tokens, table
from zoo.interop.hf.traits import decoder, layernorm, mha, two_layer_ffn
from zoo.spec import FamilySpec

__all__ = ["GPT2"]


class GPT2(Architecture):
    name = "GPT2LMHeadModel"
    base = "GPT2Model"
    prefix = "transformer"
    config_name = "GPT2Config"
    model_type = "gpt2"
    tie = ("lm_head", "transformer.wte")
    table = table(
        Refuse("scale_attn_weights", True, "zoo always scales attention scores by 1/sqrt(head size)", write=False),
        Refuse("scale_attn_by_inverse_layer_idx", False, "zoo has no per-layer attention scaling", write=False),
        Refuse("add_cross_attention", False, "zoo decoders have no cross-attention", write=False),
        decoder(positions="n_positions", width="n_embd", layers="n_layer"),
        Fixed("position.kind", "learned", why="learned absolute positions (a decoder with rope converts to LlamaForCausalLM)"),
        mha("n_head"), Fixed("block.attention.bias", True), Claim("block.attention.out_bias", one_of(None, True)),
        two_layer_ffn({("relu", "none"): "relu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("silu", "none"): "silu"},
                      "activation_function", "n_inner", lambda c: 4 * c.n_embd),
        Fixed("block.ffn.bias", True),
        layernorm("layer_norm_epsilon"), Fixed("block.kind", "pre"),
        Field("embd_pdrop", "dropout.embedding"), Field("resid_pdrop", "dropout.residual"), Field("attn_pdrop", "dropout.attention"),
        Fixed("dropout.ffn", 0.0), Fixed("init.scaled_residual", True),
        Tokens({"bos_token_id": 50256, "eos_token_id": 50256}),
    )

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
