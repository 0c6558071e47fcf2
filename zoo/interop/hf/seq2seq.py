"""What HF's fairseq-style encoder-decoders (``MarianMTModel``, ``BartForConditionalGeneration``,
``MBartForConditionalGeneration``) share: one block spec for both stacks (heads and FFN sizes equal
in the encoder and the decoder), MHA with biases, a two-layer FFN, LayerNorm with eps 1e-5, one
dropout rate on embeddings and residuals, the same layer tensor names, the embeddings tied or not
as the model holds them, and ``final_logits_bias`` (a buffer) as the head's bias where it is not
all zeros."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    require,
    weights,
)
from zoo.interop.hf.table import Derived, Field, Fixed, Refuse
from zoo.interop.hf.traits import hidden_dropout, who
from zoo.spec import FamilySpec

__all__ = ["SEQ2SEQ_CLAIMS", "Seq2Seq", "seq2seq"]

SEQ2SEQ_CLAIMS: Claims = {
    **TEXT_CLAIMS, "family": one_of("encoder_decoder"), "n_encoder_layers": ANY, "n_decoder_layers": ANY,
    "share_embeddings": ANY, "block.norm.kind": one_of("layernorm"), "block.norm.bias": one_of(True),
    "block.attention.out_bias": ANY, "block.cross_attention": ANY, "embedding.scale": ANY, "head.bias": ANY,
    "dropout.embedding": ANY, "dropout.residual": ANY, "dropout.attention": ANY, "dropout.ffn": ANY,
}
_ACTS = {("relu", "none"): "relu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("silu", "none"): "swish"}


def _same(c: Any, where: str, enc: str, dec: str, what: str) -> None:
    if getattr(c, enc) != getattr(c, dec):
        raise unsupported(where, dec, getattr(c, dec), f"zoo's encoder and decoder share one block spec, so the {what} "
                          f"must equal {enc} ({getattr(c, enc)})")


def _layers(c: Any, where: str) -> dict:
    _same(c, where, "encoder_attention_heads", "decoder_attention_heads", "heads")
    _same(c, where, "encoder_ffn_dim", "decoder_ffn_dim", "FFN size")
    layers = {"n_layers": c.encoder_layers}
    if c.encoder_layers != c.decoder_layers:
        layers.update(n_encoder_layers=c.encoder_layers, n_decoder_layers=c.decoder_layers)
    return layers


def _heads(s: FamilySpec, where: str) -> dict:
    plain_attention(s, where, cross_too=True)
    return {"encoder_attention_heads": s.block.attention.n_heads, "decoder_attention_heads": s.block.attention.n_heads}


def _ffn(c: Any, where: str) -> dict:
    return {"block.ffn": {**ffn_of(TWO_LAYER, c.activation_function, where, "activation_function"),
                          "hidden": c.encoder_ffn_dim, "bias": True}}


def _write_ffn(s: FamilySpec, where: str) -> dict:
    require(s.block.ffn.bias, where, "block.ffn.bias", False, f"{who(where)}'s FFN has biases")
    hidden = s.block.ffn.hidden_size(s.d_model)
    return {"encoder_ffn_dim": hidden, "decoder_ffn_dim": hidden, "activation_function": act_name(s.block.ffn, _ACTS, where)}


def seq2seq(kind: str) -> tuple:
    """The table entries every one of these configs states alike, its blocks ``kind``: sizes (heads
    and FFN sizes one for both stacks), MHA with biases, a two-layer FFN, LayerNorm with eps 1e-5,
    dropout, init, scaled embeddings, the head's tying (which a model's ties refine)."""

    def norm(s: FamilySpec, where: str) -> dict:
        layernorm(s, where, kind)
        require(s.block.norm.eps == 1e-5, where, "block.norm.eps", s.block.norm.eps, f"{who(where)}'s LayerNorms have eps 1e-5")
        return {}

    return (
        Refuse("encoder_layerdrop", 0.0, "zoo has no layer drop", write=False),
        Refuse("decoder_layerdrop", 0.0, "zoo has no layer drop", write=False),
        Fixed("family", "encoder_decoder"), Field("max_position_embeddings", "max_seq_len"), Field("d_model", "d_model"),
        Derived("layers", _layers, lambda s, where: {"encoder_layers": s.encoder_layers, "decoder_layers": s.decoder_layers}),
        Derived("heads", lambda c, where: {"block.attention.kind": "mha", "block.attention.n_heads": c.encoder_attention_heads,
                                           "block.attention.bias": True}, _heads),
        Derived("ffn", _ffn, _write_ffn),
        Fixed("block.norm.kind", "layernorm"), Fixed("block.norm.eps", 1e-5),  # nn.LayerNorm's default eps
        Fixed("block.kind", kind), Derived("norm", lambda c, where: {}, norm),
        hidden_dropout("dropout"), Field("attention_dropout", "dropout.attention"), Field("activation_dropout", "dropout.ffn"),
        Fixed("init.scheme", "normal"), Field("init_std", "init.std"),
        Field("scale_embedding", "embedding.scale"), Field("tie_word_embeddings", "head.tied"),
    )


class Seq2Seq(Architecture):
    """The shared steps; a subclass's table adds its positions, embedding norms and vocabularies to
    :func:`seq2seq`'s entries, and its ``spec`` the ties its model holds."""

    @staticmethod
    def read_ties(hf: nn.Module) -> tuple[bool, bool, bool]:
        """(source and target embeddings shared, head tied to them, a logits bias not all zeros) as
        ``hf`` holds them."""
        emb = hf.model.decoder.embed_tokens.weight
        bias = hf.final_logits_bias.device.type != "meta" and bool(hf.final_logits_bias.any())
        return hf.model.encoder.embed_tokens.weight is emb, hf.lm_head.weight is emb, bias

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
        return rules + ([rule("head.bias", "final_logits_bias")] if getattr(s.head, "bias", False) else [])

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
