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
from zoo.interop.hf.base import GATED, TEXT_CLAIMS, TWO_LAYER, Architecture, act_name, ffn_of, require, token_ids, weights
from zoo.spec import FamilySpec

__all__ = ["T5"]

_DROPOUTS = ("embedding", "residual", "attention", "ffn", "final")


class T5(Architecture):
    name = "T5ForConditionalGeneration"
    config_name = "T5Config"
    model_type = "t5"
    acts: ClassVar[dict[tuple[str, str], str]] = {  # (zoo FFN kind, approximate) -> feed_forward_proj
        ("relu", "none"): "relu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("silu", "none"): "silu",
        ("geglu", "tanh"): "gated-gelu", ("geglu", "none"): "gated-gelu_python", ("swiglu", "none"): "gated-silu",
    }
    claims: ClassVar[Claims] = {
        **TEXT_CLAIMS, "family": one_of("encoder_decoder"), "n_encoder_layers": ANY, "n_decoder_layers": ANY, "src_vocab_size": ANY,
        "share_embeddings": one_of(True), "position.kind": one_of("relative_bias"), "position.num_buckets": ANY,
        "position.max_distance": ANY, "block.kind": one_of("pre"), "block.norm.kind": one_of("rmsnorm"),
        "block.attention.kind": one_of("mha"), "block.attention.bias": one_of(False),
        "block.attention.out_bias": one_of(None, False), "block.attention.scale_dim": one_of(1),
        "block.cross_attention": ANY, "block.ffn.bias": one_of(False), "head.scale_input": ANY,
        **{f"dropout.{d}": ANY for d in _DROPOUTS},
    }

    @staticmethod
    def spec(c: Any, hf: nn.Module | None) -> dict:
        where = "T5ForConditionalGeneration -> zoo"
        table = GATED if c.is_gated_act else TWO_LAYER
        if c.dense_act_fn not in table:
            raise unsupported(where, "feed_forward_proj", c.feed_forward_proj,
                              f"zoo's FFNs here are {', '.join(sorted(set(T5.acts.values())))}")
        ffn = ffn_of(table, c.dense_act_fn, where, "feed_forward_proj")
        if hf is None:  # released configs: v1.0 ties and scales, v1.1 does neither
            tied = c.scale_decoder_outputs
        else:
            require(hf.encoder.embed_tokens.weight is hf.shared.weight and hf.decoder.embed_tokens.weight is hf.shared.weight,
                    where, "encoder.embed_tokens", "untied", "zoo's T5 layout shares one embedding between the stacks")
            tied = hf.lm_head.weight is hf.shared.weight
        layers = {"n_layers": c.num_layers}
        if c.num_decoder_layers != c.num_layers:
            layers.update(n_encoder_layers=c.num_layers, n_decoder_layers=c.num_decoder_layers)
        rate = c.dropout_rate
        return {
            "family": "encoder_decoder", "vocab_size": c.vocab_size, "max_seq_len": getattr(c, "n_positions", 512),
            "d_model": c.d_model, **layers, "share_embeddings": True,
            "embedding": {"scale": False, "norm": False},
            "head": {"kind": "lm", "tied": tied, "bias": False, "scale_input": c.scale_decoder_outputs},
            "position": {"kind": "relative_bias", "num_buckets": c.relative_attention_num_buckets,
                         "max_distance": c.relative_attention_max_distance},
            "block": {
                "kind": "pre",
                "attention": {"kind": "mha", "n_heads": c.num_heads, "head_dim": c.d_kv, "v_head_dim": c.d_kv,
                              "bias": False, "scale_dim": 1},  # T5 does not scale q.k (its init does)
                "ffn": {**ffn, "hidden": c.d_ff, "bias": False},
                "norm": {"kind": "rmsnorm", "eps": c.layer_norm_epsilon},
            },
            "dropout": dict.fromkeys(_DROPOUTS, rate),  # T5's one rate, on the stacks' outputs too
            "init": {"scheme": "normal", "std": c.initializer_factor * c.d_model**-0.5},
        }

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = "zoo -> T5ForConditionalGeneration"
        d, att = s.d_model, s.block.attention
        require(att.qk_size(d) == att.v_size(d), where, "block.attention.v_head_dim", att.v_size(d),
                f"T5's queries, keys and values have one head size, d_kv (head_dim is {att.qk_size(d)})")
        require(s.block.cross_attention in (None, att), where, "block.cross_attention", s.block.cross_attention.kind
                if s.block.cross_attention else None, "T5's cross-attention is shaped as its self-attention; leave it null")
        rates = {f: getattr(s.dropout, f) for f in _DROPOUTS}
        for field, rate in rates.items():
            require(rate == s.dropout.residual, where, f"dropout.{field}", rate,
                    f"T5 has one dropout_rate for embeddings, residuals, attention, FFN and the stacks' outputs "
                    f"(dropout.residual is {s.dropout.residual})")
        c = {
            "vocab_size": s.vocab_size, "d_model": d, "d_kv": att.qk_size(d), "d_ff": s.block.ffn.hidden_size(d),
            "num_layers": s.encoder_layers, "num_decoder_layers": s.decoder_layers, "num_heads": att.n_heads,
            "relative_attention_num_buckets": s.position.num_buckets,
            "relative_attention_max_distance": s.position.max_distance, "dropout_rate": s.dropout.residual,
            "layer_norm_epsilon": s.block.norm.eps, "feed_forward_proj": act_name(s.block.ffn, cls.acts, where),
            "tie_word_embeddings": s.head.tied, "scale_decoder_outputs": s.head.scale_input, "n_positions": s.max_seq_len,
        }
        token_ids(c, s.vocab_size, {"pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}, given)
        return c

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
