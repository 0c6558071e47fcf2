"""What HF's fairseq-style encoder-decoders (``MarianMTModel``, ``BartForConditionalGeneration``,
``MBartForConditionalGeneration``) share: one block spec for both stacks (heads and FFN sizes equal
in the encoder and the decoder), MHA with biases, a two-layer FFN, LayerNorm with eps 1e-5, one
dropout rate on embeddings and residuals, the same layer tensor names, the embeddings tied or not
as the model holds them, and ``final_logits_bias`` (a buffer) as the head's bias where it is not
all zeros."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import (
    TEXT_CLAIMS,
    TWO_LAYER,
    Architecture,
    act_name,
    ffn_of,
    fused,
    layernorm,
    plain_attention,
    refuse_config,
    require,
    weights,
)
from zoo.spec import FamilySpec

__all__ = ["SEQ2SEQ_CLAIMS", "Seq2Seq"]

SEQ2SEQ_CLAIMS: Claims = {
    **TEXT_CLAIMS, "family": one_of("encoder_decoder"), "n_encoder_layers": ANY, "n_decoder_layers": ANY,
    "share_embeddings": ANY, "block.norm.kind": one_of("layernorm"), "block.norm.bias": one_of(True),
    "block.attention.out_bias": ANY, "block.cross_attention": ANY, "embedding.scale": ANY, "head.bias": ANY,
    "dropout.embedding": ANY, "dropout.residual": ANY, "dropout.attention": ANY, "dropout.ffn": ANY,
}


class Seq2Seq(Architecture):
    """The shared steps; a subclass adds its positions, embedding norms and vocabularies."""

    acts: ClassVar[dict[tuple[str, str], str]] = {  # (zoo FFN kind, approximate) -> HF activation
        ("relu", "none"): "relu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("silu", "none"): "swish",
    }
    block_kind: ClassVar[str] = "post"

    @classmethod
    def common_spec(cls, c: Any) -> dict:
        """The spec fields every one of these configs states alike (the block's ``kind`` is the class's)."""
        where = f"{cls.name} -> zoo"
        for enc, dec, what in (("encoder_attention_heads", "decoder_attention_heads", "heads"),
                               ("encoder_ffn_dim", "decoder_ffn_dim", "FFN size")):
            if getattr(c, enc) != getattr(c, dec):
                raise unsupported(where, dec, getattr(c, dec), f"zoo's encoder and decoder share one block spec, so the {what} must equal {enc} ({getattr(c, enc)})")
        refuse_config(c, where, {
            "encoder_layerdrop": (0.0, "zoo has no layer drop"), "decoder_layerdrop": (0.0, "zoo has no layer drop"),
        })
        layers = {"n_layers": c.encoder_layers}
        if c.encoder_layers != c.decoder_layers:
            layers.update(n_encoder_layers=c.encoder_layers, n_decoder_layers=c.decoder_layers)
        return {
            "family": "encoder_decoder", "max_seq_len": c.max_position_embeddings, "d_model": c.d_model, **layers,
            "block": {
                "attention": {"kind": "mha", "n_heads": c.encoder_attention_heads, "bias": True},
                "ffn": {**ffn_of(TWO_LAYER, c.activation_function, where, "activation_function"),
                        "hidden": c.encoder_ffn_dim, "bias": True},
                "norm": {"kind": "layernorm", "eps": 1e-5},  # nn.LayerNorm's default eps
                "kind": cls.block_kind,
            },
            "dropout": {"embedding": c.dropout, "residual": c.dropout, "attention": c.attention_dropout,
                        "ffn": c.activation_dropout},
            "init": {"scheme": "normal", "std": c.init_std},
        }

    @staticmethod
    def read_ties(hf: nn.Module) -> tuple[bool, bool, bool]:
        """(source and target embeddings shared, head tied to them, a logits bias not all zeros) as
        ``hf`` holds them."""
        emb = hf.model.decoder.embed_tokens.weight
        bias = hf.final_logits_bias.device.type != "meta" and bool(hf.final_logits_bias.any())
        return hf.model.encoder.embed_tokens.weight is emb, hf.lm_head.weight is emb, bias

    @classmethod
    def common_config(cls, s: FamilySpec) -> dict:
        """The config fields every one of these classes writes alike, after the checks they share."""
        where = f"zoo -> {cls.name}"
        layernorm(s, where, cls.block_kind)
        require(s.block.norm.eps == 1e-5, where, "block.norm.eps", s.block.norm.eps, f"{cls.name}'s LayerNorms have eps 1e-5")
        plain_attention(s, where, cross_too=True)
        require(s.block.ffn.bias, where, "block.ffn.bias", False, f"{cls.name}'s FFN has biases")
        require(s.dropout.embedding == s.dropout.residual, where, "dropout.embedding", s.dropout.embedding,
                f"{cls.name}'s dropout is one rate for embeddings and residuals (dropout.residual is {s.dropout.residual})")
        hidden = s.block.ffn.hidden_size(s.d_model)
        return {
            "d_model": s.d_model, "max_position_embeddings": s.max_seq_len, "encoder_layers": s.encoder_layers,
            "decoder_layers": s.decoder_layers, "encoder_attention_heads": s.block.attention.n_heads,
            "decoder_attention_heads": s.block.attention.n_heads, "encoder_ffn_dim": hidden, "decoder_ffn_dim": hidden,
            "activation_function": act_name(s.block.ffn, cls.acts, where), "dropout": s.dropout.residual,
            "attention_dropout": s.dropout.attention, "activation_dropout": s.dropout.ffn, "init_std": s.init.std,
            "scale_embedding": s.embedding.scale, "tie_word_embeddings": s.head.tied,
        }

    @staticmethod
    def common_rules(s: FamilySpec) -> list[Rule]:
        """The token embeddings (``model.shared`` where shared), every layer and the head."""
        rules = [rule("src_emb.weight", "model.encoder.embed_tokens.weight"),
                 rule("tgt_emb.weight", "model.decoder.embed_tokens.weight")]
        if s.share_embeddings:
            rules.append(rule("tgt_emb.weight", "model.shared.weight"))
        for stack, n in (("encoder", s.encoder_layers), ("decoder", s.decoder_layers)):
            for i in range(n):
                z, h = f"{stack}.blocks.{i}", f"model.{stack}.layers.{i}"
                rules += [
                    *fused(f"{z}.attn.qkv", [f"{h}.self_attn.{p}_proj" for p in "qkv"], bias=True),
                    *weights(f"{z}.attn.out", f"{h}.self_attn.out_proj"),
                    *weights(f"{z}.attn_norm", f"{h}.self_attn_layer_norm"),
                    *weights(f"{z}.ffn.fc1", f"{h}.fc1"), *weights(f"{z}.ffn.fc2", f"{h}.fc2"),
                    *weights(f"{z}.ffn_norm", f"{h}.final_layer_norm"),
                ]
                if stack == "decoder":
                    rules += [
                        *weights(f"{z}.cross_attn.q", f"{h}.encoder_attn.q_proj"),
                        *fused(f"{z}.cross_attn.kv", [f"{h}.encoder_attn.k_proj", f"{h}.encoder_attn.v_proj"], bias=True),
                        *weights(f"{z}.cross_attn.out", f"{h}.encoder_attn.out_proj"),
                        *weights(f"{z}.cross_norm", f"{h}.encoder_attn_layer_norm"),
                    ]
        rules.append(rule("head.weight", "lm_head.weight"))
        return rules + ([rule("head.bias", "final_logits_bias")] if s.head.bias else [])

    @staticmethod
    def unread(s: FamilySpec, ref: Mapping[str, Tensor]) -> list[str]:
        """Reference tensors zoo keeps no copy of: a zero logits bias, and ``model.shared`` of a model
        whose embeddings are not shared (its forward pass never reads it)."""
        handled = [] if s.head.bias else ["final_logits_bias"]
        if not s.share_embeddings and "model.shared.weight" in ref:
            handled.append("model.shared.weight")
        return handled

    @staticmethod
    def zero_bias(state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        """A zero ``final_logits_bias`` for a zoo head without a bias."""
        return {} if s.head.bias else {"final_logits_bias": state["head.weight"].new_zeros(shapes["final_logits_bias"])}

    @classmethod
    def check_from(cls, hf: nn.Module, s: FamilySpec, ref: Mapping[str, Tensor]) -> list[str]:
        return cls.unread(s, ref)

    @classmethod
    def extra_to(cls, state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        return cls.zero_bias(state, s, shapes)
