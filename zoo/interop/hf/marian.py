"""Marian: ``MarianMTModel`` <-> a zoo encoder-decoder (Post-Norm, sinusoidal positions, scaled embeddings)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from zoo.components.position import sinusoid_table
from zoo.interop.claims import ANY, Claims, one_of
from zoo.interop.common import ConversionError, Rule, rule, unsupported
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

__all__ = ["Marian", "permute_model_dim"]


class Marian(Architecture):
    name = "MarianMTModel"
    config_name = "MarianConfig"
    model_type = "marian"
    acts: ClassVar[dict[tuple[str, str], str]] = {  # (zoo FFN kind, approximate) -> HF activation
        ("relu", "none"): "relu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("silu", "none"): "swish",
    }
    claims: ClassVar[Claims] = {
        **TEXT_CLAIMS, "family": one_of("encoder_decoder"), "n_encoder_layers": ANY, "n_decoder_layers": ANY, "src_vocab_size": ANY, "share_embeddings": ANY,
        "position.kind": one_of("sinusoidal"), "position.base": one_of(10000.0), "position.layout": ANY,
        "block.kind": one_of("post"), "block.norm.kind": one_of("layernorm"), "block.norm.bias": one_of(True),
        "block.attention.out_bias": ANY, "block.cross_attention": ANY, "embedding.scale": ANY, "head.bias": ANY,
        "dropout.embedding": ANY, "dropout.residual": ANY, "dropout.attention": ANY, "dropout.ffn": ANY,
    }

    @staticmethod
    def spec(c: Any, hf: nn.Module | None) -> dict:
        where = "MarianMTModel -> zoo"
        for enc, dec, what in (("encoder_attention_heads", "decoder_attention_heads", "heads"),
                               ("encoder_ffn_dim", "decoder_ffn_dim", "FFN size")):
            if getattr(c, enc) != getattr(c, dec):
                raise unsupported(where, dec, getattr(c, dec), f"zoo's encoder and decoder share one block spec, so the {what} must equal {enc} ({getattr(c, enc)})")
        refuse_config(c, where, {
            "encoder_layerdrop": (0.0, "zoo has no layer drop"), "decoder_layerdrop": (0.0, "zoo has no layer drop"),
        })
        if hf is None:
            shared, tied, bias = c.share_encoder_decoder_embeddings and c.tie_word_embeddings, c.tie_word_embeddings, False
        else:
            emb = hf.model.decoder.embed_tokens.weight
            shared, tied = hf.model.encoder.embed_tokens.weight is emb, hf.lm_head.weight is emb
            bias = hf.final_logits_bias.device.type != "meta" and bool(hf.final_logits_bias.any())
        layers = {"n_layers": c.encoder_layers}
        if c.encoder_layers != c.decoder_layers:
            layers.update(n_encoder_layers=c.encoder_layers, n_decoder_layers=c.decoder_layers)
        vocab = {"vocab_size": c.vocab_size} if shared else {"vocab_size": c.decoder_vocab_size, "src_vocab_size": c.vocab_size}
        return {
            "family": "encoder_decoder", **vocab, "max_seq_len": c.max_position_embeddings, "d_model": c.d_model, **layers,
            "embedding": {"scale": c.scale_embedding, "norm": False}, "share_embeddings": shared,
            "head": {"kind": "lm", "tied": tied, "bias": bias},  # final_logits_bias: a head bias where it is not zero
            "position": {"kind": "sinusoidal", "base": 10000.0, "layout": "concat"},
            "block": {
                "attention": {"kind": "mha", "n_heads": c.encoder_attention_heads, "bias": True},
                "ffn": {**ffn_of(TWO_LAYER, c.activation_function, where, "activation_function"),
                        "hidden": c.encoder_ffn_dim, "bias": True},
                "norm": {"kind": "layernorm", "eps": 1e-5},  # Marian: nn.LayerNorm's default eps
                "kind": "post",
            },
            "dropout": {"embedding": c.dropout, "residual": c.dropout, "attention": c.attention_dropout,
                        "ffn": c.activation_dropout},
            "init": {"scheme": "normal", "std": c.init_std},
        }

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = "zoo -> MarianMTModel"
        pos = s.position
        require(pos.kind == "sinusoidal" and pos.base == 10000.0, where, "position", pos.model_dump(),
                "Marian has fixed sinusoidal positions with base 10000")
        layernorm(s, where, "post")
        require(s.block.norm.eps == 1e-5, where, "block.norm.eps", s.block.norm.eps, "Marian's LayerNorms have eps 1e-5")
        plain_attention(s, where, cross_too=True)
        require(s.block.ffn.bias, where, "block.ffn.bias", False, "Marian's FFN has biases")
        require(s.head.tied or not s.share_embeddings, where, "head.tied", False,
                "HF Marian shares source and target embeddings only when it also ties the output projection; "
                "set share_embeddings: false or head.tied: true")
        require(s.dropout.embedding == s.dropout.residual, where, "dropout.embedding", s.dropout.embedding,
                f"Marian's dropout is one rate for embeddings and residuals (dropout.residual is {s.dropout.residual})")
        c = {
            "vocab_size": s.src_vocab_size, "decoder_vocab_size": s.vocab_size, "d_model": s.d_model,
            "max_position_embeddings": s.max_seq_len, "encoder_layers": s.encoder_layers,
            "decoder_layers": s.decoder_layers, "encoder_attention_heads": s.block.attention.n_heads,
            "decoder_attention_heads": s.block.attention.n_heads, "encoder_ffn_dim": s.block.ffn.hidden_size(s.d_model),
            "decoder_ffn_dim": s.block.ffn.hidden_size(s.d_model), "activation_function": act_name(s.block.ffn, cls.acts, where),
            "dropout": s.dropout.residual, "attention_dropout": s.dropout.attention, "activation_dropout": s.dropout.ffn,
            "init_std": s.init.std, "scale_embedding": s.embedding.scale,
            "share_encoder_decoder_embeddings": s.share_embeddings, "tie_word_embeddings": s.head.tied,
        }
        for field in ("pad_token_id", "decoder_start_token_id"):  # Marian's convention: the last id pads
            if field not in given:
                c[field] = min(s.vocab_size, s.src_vocab_size) - 1
        return c

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
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
    def table(s: FamilySpec, like: Tensor) -> Tensor:
        return sinusoid_table(s.max_seq_len, s.d_model, base=10000.0, layout="concat").to(like)

    @classmethod
    def check_from(cls, hf: nn.Module, s: FamilySpec, ref: dict[str, Tensor]) -> list[str]:
        """Tensors zoo holds no copy of, checked instead: the position tables and a zero logits bias."""
        handled = ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]
        for name in handled:
            t = ref[name]
            if t.device.type != "meta" and not torch.allclose(t.float(), cls.table(s, t).float(), atol=1e-6):
                raise ConversionError(f"MarianMTModel -> zoo: {name} is not the sinusoid table zoo computes "
                                      f"(max difference {(t.float() - cls.table(s, t).float()).abs().max().item():.3g})")
        if not s.head.bias:
            handled.append("final_logits_bias")  # all zeros, so no head bias
        if not s.share_embeddings and "model.shared.weight" in ref:
            handled.append("model.shared.weight")  # untied: the forward pass never reads it
        return handled

    @classmethod
    def extra_to(cls, state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        like = state["head.weight"]
        out = {f"model.{k}.embed_positions.weight": cls.table(s, like) for k in ("encoder", "decoder")}
        if not s.head.bias:
            out["final_logits_bias"] = like.new_zeros(shapes["final_logits_bias"])
        return out

    @staticmethod
    def prepare_to(state: dict[str, Tensor], s: FamilySpec) -> dict[str, Tensor]:
        """Interleaved sinusoids (the paper's layout) reach Marian's concat layout by permuting the
        model dimension everywhere: LayerNorm and attention do not depend on the order of the D axis,
        so the permuted model computes the same logits (and trains the same)."""
        if s.position.layout == "concat":
            return state
        return permute_model_dim(state, torch.cat([torch.arange(0, s.d_model, 2), torch.arange(1, s.d_model, 2)]))


_MODEL_AXES = (  # (name suffix, the axis of size d_model) for zoo encoder-decoder tensors; None: none
    ("emb.weight", 1), ("head.weight", 1), ("head.bias", None),
    ("attn.qkv.weight", 1), ("cross_attn.q.weight", 1), ("cross_attn.kv.weight", 1), ("ffn.fc1.weight", 1),
    ("attn.qkv.bias", None), ("cross_attn.q.bias", None), ("cross_attn.kv.bias", None), ("ffn.fc1.bias", None),
    ("attn.out.weight", 0), ("attn.out.bias", 0), ("ffn.fc2.weight", 0), ("ffn.fc2.bias", 0),
    ("_norm.weight", 0), ("_norm.bias", 0),
)


def permute_model_dim(state: dict[str, Tensor], perm: Tensor) -> dict[str, Tensor]:
    """A zoo encoder-decoder state dict with its d_model axis reordered by ``perm``."""
    out = {}
    for name, t in state.items():
        axis = next((a for suffix, a in _MODEL_AXES if name.endswith(suffix)), "unknown")
        if axis == "unknown":
            raise ConversionError(f"zoo -> MarianMTModel: no rule to reorder the model dimension of {name!r}")
        out[name] = t if axis is None else t.index_select(axis, perm.to(t.device))
    return out
