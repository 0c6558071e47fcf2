"""T5: ``T5ForConditionalGeneration`` <-> a zoo encoder-decoder (Pre-Norm with final norms, RMSNorm
without bias, no biases anywhere, unscaled scores, T5's relative position bias per stack).

T5 v1.0 (t5-small, t5-base) has a ReLU FFN and a head tied to the embedding, its input scaled by
d_model^-0.5 (``head.scale_input``); v1.1 and Flan-T5 a gated-GELU FFN (``gelu_new``, tanh
approximation: ``geglu`` with ``approximate: tanh``) and an untied head without the scale.
transformers 5 decides the head's scale by the config's ``scale_decoder_outputs`` (read from
``tie_word_embeddings`` in older configs) and ties the head to the embedding at construction
whatever the config says, untying it where a checkpoint holds two different matrices: the tying is
read from the model, and :meth:`T5.made` unties a reference model built for an untied spec."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import GATED, TEXT_CLAIMS, TWO_LAYER, Architecture, act_name, ffn_of, require, weights
from zoo.interop.hf.table import Check, Derived, Field, Fixed, Tokens, table
from zoo.spec import FamilySpec

__all__ = ["T5"]

_DROPOUTS = ("embedding", "residual", "attention", "ffn", "final")
_ACTS = {  # (zoo FFN kind, approximate) -> feed_forward_proj
    ("relu", "none"): "relu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("silu", "none"): "silu",
    ("geglu", "tanh"): "gated-gelu", ("geglu", "none"): "gated-gelu_python", ("swiglu", "none"): "gated-silu",
}


def _ffn(c: Any, where: str) -> dict:
    acts = GATED if c.is_gated_act else TWO_LAYER
    if c.dense_act_fn not in acts:
        raise unsupported(where, "feed_forward_proj", c.feed_forward_proj, f"zoo's FFNs here are {', '.join(sorted(set(_ACTS.values())))}")
    return {"block.ffn": {**ffn_of(acts, c.dense_act_fn, where, "feed_forward_proj"), "hidden": c.d_ff, "bias": False}}


def _layers(c: Any, where: str) -> dict:
    layers = {"n_layers": c.num_layers}
    if c.num_decoder_layers != c.num_layers:
        layers.update(n_encoder_layers=c.num_layers, n_decoder_layers=c.num_decoder_layers)
    return layers


def _heads(s: FamilySpec, where: str) -> dict:
    d, att = s.d_model, s.block.attention
    require(att.qk_size(d) == att.v_size(d), where, "block.attention.v_head_dim", att.v_size(d),
            f"T5's queries, keys and values have one head size, d_kv (head_dim is {att.qk_size(d)})")
    return {"d_kv": att.qk_size(d)}


def _dropout(s: FamilySpec, where: str) -> dict:
    for field in _DROPOUTS:
        rate = getattr(s.dropout, field)
        require(rate == s.dropout.residual, where, f"dropout.{field}", rate,
                f"T5 has one dropout_rate for embeddings, residuals, attention, FFN and the stacks' outputs "
                f"(dropout.residual is {s.dropout.residual})")
    return {"dropout_rate": s.dropout.residual}


class T5(Architecture):
    name = "T5ForConditionalGeneration"
    config_name = "T5Config"
    model_type = "t5"
    claims: ClassVar[Claims] = {
        **TEXT_CLAIMS, "family": one_of("encoder_decoder"), "n_encoder_layers": ANY, "n_decoder_layers": ANY, "src_vocab_size": ANY,
        "share_embeddings": one_of(True), "position.kind": one_of("relative_bias"), "position.num_buckets": ANY,
        "position.max_distance": ANY, "block.kind": one_of("pre"), "block.norm.kind": one_of("rmsnorm"),
        "block.attention.kind": one_of("mha"), "block.attention.bias": one_of(False),
        "block.attention.out_bias": one_of(None, False), "block.attention.scale_dim": one_of(1),
        "block.cross_attention": ANY, "block.ffn.bias": one_of(False), "head.scale_input": ANY,
        **{f"dropout.{d}": ANY for d in _DROPOUTS},
    }
    table = table(
        Derived("ffn", _ffn, lambda s, where: {"d_ff": s.block.ffn.hidden_size(s.d_model),
                                               "feed_forward_proj": act_name(s.block.ffn, _ACTS, where)}),
        Fixed("family", "encoder_decoder"), Field("vocab_size", "vocab_size"), Field("n_positions", "max_seq_len", default=512),
        Field("d_model", "d_model"),
        Derived("layers", _layers, lambda s, where: {"num_layers": s.encoder_layers, "num_decoder_layers": s.decoder_layers}),
        Fixed("share_embeddings", True), Fixed("embedding.scale", False), Fixed("embedding.norm", False),
        Fixed("head.kind", "lm"), Fixed("head.bias", False), Field("scale_decoder_outputs", "head.scale_input"),
        # released configs: v1.0 ties and scales, v1.1 does neither (a model says itself: spec)
        Derived("tie", lambda c, where: {"head.tied": c.scale_decoder_outputs}, lambda s, where: {"tie_word_embeddings": s.head.tied}),
        Fixed("position.kind", "relative_bias"), Field("relative_attention_num_buckets", "position.num_buckets"),
        Field("relative_attention_max_distance", "position.max_distance"),
        Fixed("block.kind", "pre"), Fixed("block.attention.kind", "mha"), Field("num_heads", "block.attention.n_heads"),
        Derived("heads", lambda c, where: {"block.attention.head_dim": c.d_kv, "block.attention.v_head_dim": c.d_kv}, _heads),
        Fixed("block.attention.bias", False), Fixed("block.attention.scale_dim", 1),  # T5 does not scale q.k (its init does)
        Check("block.cross_attention", lambda s: s.block.cross_attention in (None, s.block.attention),
              lambda s: "T5's cross-attention is shaped as its self-attention; leave it null"),
        Fixed("block.norm.kind", "rmsnorm"), Field("layer_norm_epsilon", "block.norm.eps"),
        Derived("dropout", lambda c, where: {f"dropout.{d}": c.dropout_rate for d in _DROPOUTS}, _dropout),  # one rate
        Fixed("init.scheme", "normal"),
        Derived("init", lambda c, where: {"init.std": c.initializer_factor * c.d_model**-0.5}, lambda s, where: {}),
        Tokens({"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}),
    )

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        s = super().spec(c, None)
        if hf is not None:
            require(hf.encoder.embed_tokens.weight is hf.shared.weight and hf.decoder.embed_tokens.weight is hf.shared.weight,
                    f"{cls.name} -> zoo", "encoder.embed_tokens", "untied",
                    "zoo's T5 layout shares one embedding between the stacks")
            s["head"]["tied"] = hf.lm_head.weight is hf.shared.weight
        return s

    @classmethod
    def made(cls, hf_model: nn.Module, s: FamilySpec) -> None:
        """transformers 5 ties T5's head to the embedding at construction; an untied spec unties it."""
        if not s.head.tied and hf_model.lm_head.weight is hf_model.shared.weight:
            hf_model.lm_head.weight = nn.Parameter(hf_model.shared.weight.detach().clone())
            getattr(hf_model, "all_tied_weights_keys", {}).pop("lm_head.weight", None)

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        rules = [rule("src_emb.weight", "encoder.embed_tokens.weight"), rule("tgt_emb.weight", "decoder.embed_tokens.weight"),
                 rule("tgt_emb.weight", "shared.weight")]
        gated = s.block.ffn.kind in ("geglu", "swiglu")
        for stack, n in (("encoder", s.encoder_layers), ("decoder", s.decoder_layers)):
            rules.append(rule(f"{stack}.positions.0.weight", f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"))
            for i in range(n):
                z, h = f"{stack}.blocks.{i}", f"{stack}.block.{i}.layer"
                att = f"{h}.0.SelfAttention"
                ffn = f"{h}.{2 if stack == 'decoder' else 1}"
                rules += [
                    rule(f"{z}.attn.qkv.weight", f"{att}.q.weight", f"{att}.k.weight", f"{att}.v.weight"),
                    *weights(f"{z}.attn.out", f"{att}.o", bias=False),
                    *weights(f"{z}.attn_norm", f"{h}.0.layer_norm", bias=False),
                    *weights(f"{z}.ffn_norm", f"{ffn}.layer_norm", bias=False),
                    *weights(f"{z}.ffn.fc2", f"{ffn}.DenseReluDense.wo", bias=False),
                    rule(f"{z}.ffn.fc1.weight", *([f"{ffn}.DenseReluDense.wi_0.weight", f"{ffn}.DenseReluDense.wi_1.weight"]
                                                  if gated else [f"{ffn}.DenseReluDense.wi.weight"])),
                ]
                if stack == "decoder":
                    cross = f"{h}.1.EncDecAttention"
                    rules += [
                        *weights(f"{z}.cross_attn.q", f"{cross}.q", bias=False),
                        rule(f"{z}.cross_attn.kv.weight", f"{cross}.k.weight", f"{cross}.v.weight"),
                        *weights(f"{z}.cross_attn.out", f"{cross}.o", bias=False),
                        *weights(f"{z}.cross_norm", f"{h}.1.layer_norm", bias=False),
                    ]
            rules += weights(f"{stack}.norm", f"{stack}.final_layer_norm", bias=False)
        return rules + [rule("head.weight", "lm_head.weight")]
