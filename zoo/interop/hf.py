"""Two-way converters between zoo and HF transformers, exact in both directions.

    from_hf(hf_model) -> zoo model          to_hf(zoo_model, architecture=None, **config) -> HF model
    hf_spec(config)   -> zoo spec           hf_config(spec, architecture=None, **config) -> HF config

Reference classes (``ARCHITECTURES``): ``GPT2LMHeadModel`` (zoo decoder, learned positions,
LayerNorm), ``LlamaForCausalLM`` (zoo decoder: RoPE in the rotate-half layout, RMSNorm, gated FFN,
MHA/GQA/MQA), ``BertForMaskedLM`` (zoo encoder, Post-Norm, MLM head) and ``MarianMTModel`` (zoo
encoder-decoder: Post-Norm, sinusoidal positions in the concat layout, scaled embeddings).

The spec is read from the reference's config (and the config written from the spec); tensors are
then mapped by name (:mod:`zoo.interop.common`). Tying is read from the model itself, because HF
decides it from several config fields. Anything the target cannot express raises
:class:`ConversionError` naming the option. transformers is imported only when a converter runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from zoo.build import build
from zoo.components.position import sinusoid_table
from zoo.interop.common import (
    ConversionError, Rule, check_covered, check_used, device_dtype, load_exact, reference_state, rule, unsupported, zoo_state,
)
from zoo.spec import FamilySpec, parse_spec

__all__ = ["from_hf", "to_hf", "hf_spec", "hf_config", "ARCHITECTURES", "ARCHS", "by_model_type", "permute_model_dim"]

# HF activation names -> zoo FFNs. Two-layer FFNs (GPT-2, BERT, Marian) and gated ones (LLaMA's MLP).
_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh")
_TWO_LAYER = {
    "relu": {"kind": "relu"},
    "gelu": {"kind": "gelu", "approximate": "none"},
    "gelu_python": {"kind": "gelu", "approximate": "none"},
    **{name: {"kind": "gelu", "approximate": "tanh"} for name in _TANH},
    "silu": {"kind": "silu"},
    "swish": {"kind": "silu"},
}
_GATED = {
    "silu": {"kind": "swiglu"},
    "swish": {"kind": "swiglu"},
    "gelu": {"kind": "geglu", "approximate": "none"},
    "gelu_python": {"kind": "geglu", "approximate": "none"},
    **{name: {"kind": "geglu", "approximate": "tanh"} for name in _TANH},
}


def _ffn(table: dict, name: str, where: str, option: str) -> dict:
    if name not in table:
        raise unsupported(where, option, name, f"zoo's FFNs here have the activations {', '.join(sorted(table))}")
    return dict(table[name])


def _act_name(ffn, names: dict[tuple[str, str], str], where: str) -> str:
    """The HF activation name of a zoo FFN spec, from ``names`` {(kind, approximate): name}."""
    key = (ffn.kind, getattr(ffn, "approximate", "none"))
    if key not in names:
        known = ", ".join(f"{k}" + (f" (approximate {a})" if a != "none" else "") for k, a in names)
        raise unsupported(where, "block.ffn.kind", ffn.kind if key[1] == "none" else f"{key[0]} (approximate {key[1]})",
                          f"this architecture's FFN is one of: {known}")
    return names[key]


def _require(ok: bool, where: str, option: str, value: object, why: str) -> None:
    if not ok:
        raise unsupported(where, option, value, why)


def _refuse_config(c: Any, where: str, expected: dict[str, tuple[object, str]]) -> None:
    """Each config field must hold its expected value, else the option is unsupported (with the reason)."""
    for field, (want, why) in expected.items():
        value = getattr(c, field, want)
        if value != want:
            raise unsupported(where, field, value, why)


def _wb(z: str, h: str, *, bias: bool = True, transpose: bool = False) -> list[Rule]:
    """Rules for a weight (and its bias) named ``z`` in zoo and ``h`` in the reference."""
    rules = [rule(f"{z}.weight", f"{h}.weight", transpose=transpose)]
    return rules + [rule(f"{z}.bias", f"{h}.bias")] if bias else rules


def _fused(z: str, hs: list[str], *, bias: bool) -> list[Rule]:
    rules = [rule(f"{z}.weight", *[f"{h}.weight" for h in hs])]
    return rules + [rule(f"{z}.bias", *[f"{h}.bias" for h in hs])] if bias else rules


_BUILTIN_ATTENTION = ("mha", "gqa", "mqa")  # a registered kind may compute anything with the same tensors


def _plain_attention(spec: FamilySpec, where: str, *, cross_too: bool = False) -> None:
    """Checks for references with one MHA shape, biases on every projection (GPT-2, BERT, Marian)."""
    d, b = spec.d_model, spec.block
    for field, att in [("attention", b.attention)] + ([("cross_attention", b.cross_attention)] if cross_too else []):
        if att is None:
            continue
        _require(att.kind in _BUILTIN_ATTENTION, where, f"block.{field}.kind", att.kind, "only zoo's built-in attention converts")
        _require(att.kv_heads == att.n_heads, where, f"block.{field}.n_kv_heads", att.kv_heads,
                 "this architecture has multi-head attention only (n_kv_heads == n_heads)")
        sizes = (att.qk_size(d), att.v_size(d))
        _require(d % att.n_heads == 0 and sizes == (d // att.n_heads,) * 2, where, f"block.{field}.head_dim", sizes,
                 "this architecture's head size is d_model / n_heads for queries, keys and values")
        _require(att.bias, where, f"block.{field}.bias", att.bias, "this architecture has biases on every projection")
    if cross_too and b.cross_attention is not None:
        _require(b.cross_attention == b.attention, where, "block.cross_attention", b.cross_attention.kind,
                 "this architecture's cross-attention is shaped as its self-attention; leave cross_attention null")


def _layernorm(spec: FamilySpec, where: str, placement: str) -> None:
    n = spec.block.norm
    _require(n.kind == "layernorm", where, "block.norm.kind", n.kind, "this architecture uses LayerNorm")
    _require(n.bias, where, "block.norm.bias", n.bias, "this architecture's LayerNorms have biases")
    _require(n.placement == placement, where, "block.norm.placement", n.placement, f"this architecture is {placement}-norm")


def _no_dropout(spec: FamilySpec, where: str, fields: tuple[str, ...], why: str) -> None:
    for field in fields:
        rate = getattr(spec.dropout, field)
        _require(rate == 0, where, f"dropout.{field}", rate, why)


def _token_ids(c: dict, vocab: int, defaults: dict[str, int | None], given: dict) -> None:
    """Token ids the spec does not know: the caller's, else the HF default where it fits the vocabulary."""
    for field, default in defaults.items():
        if field not in given:
            c[field] = default if default is None or default < vocab else None


# --------------------------------------------------------------------------------------------- GPT-2
class _GPT2:
    name = "GPT2LMHeadModel"
    config_name = "GPT2Config"
    model_type = "gpt2"
    acts = {("relu", "none"): "relu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("silu", "none"): "silu"}

    @staticmethod
    def spec(c: Any, hf: nn.Module | None) -> dict:
        where = "GPT2LMHeadModel -> zoo"
        _refuse_config(c, where, {
            "scale_attn_weights": (True, "zoo always scales attention scores by 1/sqrt(head size)"),
            "scale_attn_by_inverse_layer_idx": (False, "zoo has no per-layer attention scaling"),
            "add_cross_attention": (False, "zoo decoders have no cross-attention"),
        })
        tied = c.tie_word_embeddings if hf is None else hf.lm_head.weight is hf.transformer.wte.weight
        return {
            "family": "decoder", "vocab_size": c.vocab_size, "max_seq_len": c.n_positions, "d_model": c.n_embd,
            "n_layers": c.n_layer, "tie_embeddings": tied, "head_bias": False,
            "embedding": {"scale": False, "norm": False}, "position": {"kind": "learned"},
            "block": {
                "attention": {"kind": "mha", "n_heads": c.n_head, "bias": True},
                "ffn": {**_ffn(_TWO_LAYER, c.activation_function, where, "activation_function"),
                        "hidden": c.n_inner or 4 * c.n_embd, "bias": True},
                "norm": {"kind": "layernorm", "placement": "pre", "eps": c.layer_norm_epsilon},
            },
            "dropout": {"embedding": c.embd_pdrop, "residual": c.resid_pdrop, "attention": c.attn_pdrop, "ffn": 0.0},
            "init": {"scheme": "normal", "std": c.initializer_range, "scaled_residual": True},
        }

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = "zoo -> GPT2LMHeadModel"
        _require(s.position.kind == "learned", where, "position.kind", s.position.kind,
                 "GPT-2 has learned absolute positions (a decoder with rope converts to LlamaForCausalLM)")
        _layernorm(s, where, "pre")
        _plain_attention(s, where)
        _require(s.block.ffn.bias, where, "block.ffn.bias", False, "GPT-2's MLP has biases")
        _require(not s.embedding.scale and not s.embedding.norm, where, "embedding", s.embedding.model_dump(),
                 "GPT-2 neither scales nor normalises its embeddings")
        _require(not s.head_bias, where, "head_bias", True, "GPT-2's output projection has no bias")
        _no_dropout(s, where, ("ffn",), "GPT-2 has no dropout inside its MLP")
        c = {
            "vocab_size": s.vocab_size, "n_positions": s.max_seq_len, "n_embd": s.d_model, "n_layer": s.n_layers,
            "n_head": s.block.attention.n_heads, "n_inner": s.block.ffn.hidden_size(s.d_model),
            "activation_function": _act_name(s.block.ffn, cls.acts, where), "layer_norm_epsilon": s.block.norm.eps,
            "embd_pdrop": s.dropout.embedding, "resid_pdrop": s.dropout.residual, "attn_pdrop": s.dropout.attention,
            "initializer_range": s.init.std, "tie_word_embeddings": s.tie_embeddings,
        }
        _token_ids(c, s.vocab_size, {"bos_token_id": 50256, "eos_token_id": 50256}, given)
        return c

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        rules = [rule("tok_emb.weight", "transformer.wte.weight"), rule("position.weight", "transformer.wpe.weight")]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"transformer.h.{i}"
            rules += [
                *_wb(f"{z}.attn_norm", f"{h}.ln_1"),
                *_wb(f"{z}.attn.qkv", f"{h}.attn.c_attn", transpose=True),  # Conv1D: [in, out]
                *_wb(f"{z}.attn.out", f"{h}.attn.c_proj", transpose=True),
                *_wb(f"{z}.ffn_norm", f"{h}.ln_2"),
                *_wb(f"{z}.ffn.fc1", f"{h}.mlp.c_fc", transpose=True),
                *_wb(f"{z}.ffn.fc2", f"{h}.mlp.c_proj", transpose=True),
            ]
        return rules + [*_wb("stack.norm", "transformer.ln_f"), rule("head.weight", "lm_head.weight")]


# ---------------------------------------------------------------------------------------------- BERT
class _Bert:
    name = "BertForMaskedLM"
    config_name = "BertConfig"
    model_type = "bert"

    @staticmethod
    def spec(c: Any, hf: nn.Module | None) -> dict:
        where = "BertForMaskedLM -> zoo"
        _refuse_config(c, where, {
            "is_decoder": (False, "zoo encoders are bidirectional"),
            "add_cross_attention": (False, "zoo encoders have no cross-attention"),
            "position_embedding_type": ("absolute", "zoo's BERT layout has absolute learned positions"),
        })
        if c.hidden_act not in ("gelu", "gelu_python"):
            raise unsupported(where, "hidden_act", c.hidden_act,
                              "zoo's masked-LM head transform uses exact GELU, so only hidden_act 'gelu' converts")
        _require(c.type_vocab_size > 0, where, "type_vocab_size", c.type_vocab_size, "BERT needs at least one segment type")
        tied = c.tie_word_embeddings if hf is None else hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight
        return {
            "family": "encoder", "vocab_size": c.vocab_size, "max_seq_len": c.max_position_embeddings,
            "type_vocab_size": c.type_vocab_size, "d_model": c.hidden_size, "n_layers": c.num_hidden_layers,
            "embedding": {"scale": False, "norm": True}, "tie_embeddings": tied, "head_bias": True,
            "mlm_head": {"transform": True}, "position": {"kind": "learned"},
            "block": {
                "attention": {"kind": "mha", "n_heads": c.num_attention_heads, "bias": True},
                "ffn": {"kind": "gelu", "approximate": "none", "hidden": c.intermediate_size, "bias": True},
                "norm": {"kind": "layernorm", "placement": "post", "eps": c.layer_norm_eps},
            },
            "dropout": {"embedding": c.hidden_dropout_prob, "residual": c.hidden_dropout_prob,
                        "attention": c.attention_probs_dropout_prob, "ffn": 0.0},
            "init": {"scheme": "normal", "std": c.initializer_range},
        }

    @staticmethod
    def config(s: FamilySpec, given: dict) -> dict:
        where = "zoo -> BertForMaskedLM"
        _require(s.position.kind == "learned", where, "position.kind", s.position.kind, "BERT has learned absolute positions")
        _layernorm(s, where, "post")
        _plain_attention(s, where)
        ffn = s.block.ffn
        _require((ffn.kind, getattr(ffn, "approximate", None)) == ("gelu", "none"), where, "block.ffn.kind", ffn.kind,
                 "BERT's hidden_act is shared with the masked-LM head, which zoo computes with exact GELU")
        _require(ffn.bias, where, "block.ffn.bias", False, "BERT's FFN has biases")
        _require(s.embedding.norm and not s.embedding.scale, where, "embedding", s.embedding.model_dump(),
                 "BERT normalises the embedding sum (norm: true) and does not scale it (scale: false)")
        _require(s.mlm_head.transform, where, "mlm_head.transform", False, "BERT's MLM head has the dense-GELU-LayerNorm transform")
        _require(s.head_bias, where, "head_bias", False, "BERT's MLM decoder has a bias")
        _require(s.classifier is None, where, "classifier", "set", "BertForMaskedLM has no sequence-classification head")
        _require(s.type_vocab_size > 0, where, "type_vocab_size", 0, "BERT has segment embeddings; set type_vocab_size >= 1")
        _require(s.dropout.embedding == s.dropout.residual, where, "dropout.embedding", s.dropout.embedding,
                 f"BERT's hidden_dropout_prob is one rate for embeddings and residuals (dropout.residual is {s.dropout.residual})")
        _no_dropout(s, where, ("ffn",), "BERT has no dropout inside its FFN")
        return {
            "vocab_size": s.vocab_size, "hidden_size": s.d_model, "num_hidden_layers": s.n_layers,
            "num_attention_heads": s.block.attention.n_heads, "intermediate_size": ffn.hidden_size(s.d_model),
            "hidden_act": "gelu", "hidden_dropout_prob": s.dropout.residual,
            "attention_probs_dropout_prob": s.dropout.attention, "max_position_embeddings": s.max_seq_len,
            "type_vocab_size": s.type_vocab_size, "layer_norm_eps": s.block.norm.eps, "initializer_range": s.init.std,
            "tie_word_embeddings": s.tie_embeddings,
        }

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        e = "bert.embeddings"
        rules = [
            rule("tok_emb.weight", f"{e}.word_embeddings.weight"), rule("position.weight", f"{e}.position_embeddings.weight"),
            rule("type_emb.weight", f"{e}.token_type_embeddings.weight"), *_wb("emb_norm", f"{e}.LayerNorm"),
        ]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"bert.encoder.layer.{i}"
            qkv = [f"{h}.attention.self.{p}" for p in ("query", "key", "value")]
            rules += [
                *_fused(f"{z}.attn.qkv", qkv, bias=True),
                *_wb(f"{z}.attn.out", f"{h}.attention.output.dense"),
                *_wb(f"{z}.attn_norm", f"{h}.attention.output.LayerNorm"),
                *_wb(f"{z}.ffn.fc1", f"{h}.intermediate.dense"),
                *_wb(f"{z}.ffn.fc2", f"{h}.output.dense"),
                *_wb(f"{z}.ffn_norm", f"{h}.output.LayerNorm"),
            ]
        p = "cls.predictions"
        return rules + [
            *_wb("head.transform.0", f"{p}.transform.dense"), *_wb("head.transform.2", f"{p}.transform.LayerNorm"),
            *_wb("head.proj", f"{p}.decoder"),
        ]

    @staticmethod
    def check_from(hf: nn.Module, s: FamilySpec, ref: dict[str, Tensor]) -> list[str]:
        # The forward pass reads cls.predictions.decoder.bias; HF ties cls.predictions.bias to it,
        # or (untied embeddings) leaves it unread.
        return ["cls.predictions.bias"]

    @staticmethod
    def extra_to(zoo_model: nn.Module, s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        return {"cls.predictions.bias": zoo_model.head.proj.bias.detach()}


# --------------------------------------------------------------------------------------------- LLaMA
class _Llama:
    name = "LlamaForCausalLM"
    config_name = "LlamaConfig"
    model_type = "llama"
    acts = {("swiglu", "none"): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh"}

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
                "ffn": {**_ffn(_GATED, c.hidden_act, where, "hidden_act"), "hidden": c.intermediate_size, "bias": c.mlp_bias},
                "norm": {"kind": "rmsnorm", "placement": "pre", "eps": c.rms_norm_eps},
            },
            "dropout": {"attention": c.attention_dropout},
            "init": {"scheme": "normal", "std": c.initializer_range},
        }

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = "zoo -> LlamaForCausalLM"
        att, d = s.block.attention, s.d_model
        _require(s.position.kind == "rope", where, "position.kind", s.position.kind,
                 "LLaMA has rotary positions (a decoder with learned positions converts to GPT2LMHeadModel)")
        _require(s.block.norm.kind == "rmsnorm", where, "block.norm.kind", s.block.norm.kind, "LLaMA uses RMSNorm")
        _require(s.norm_placement == "pre", where, "block.norm.placement", s.norm_placement, "LLaMA is pre-norm")
        _require(att.kind in _BUILTIN_ATTENTION, where, "block.attention.kind", att.kind, "only zoo's built-in attention converts")
        _require(att.qk_size(d) == att.v_size(d), where, "block.attention.v_head_dim", att.v_size(d),
                 f"LLaMA has one head size for queries, keys and values (head_dim {att.qk_size(d)})")
        _require(not s.embedding.scale and not s.embedding.norm, where, "embedding", s.embedding.model_dump(),
                 "LLaMA neither scales nor normalises its embeddings")
        _require(not s.head_bias, where, "head_bias", True, "LLaMA's output projection has no bias")
        _no_dropout(s, where, ("embedding", "residual", "ffn"), "LLaMA's only dropout is on the attention weights")
        c = {
            "vocab_size": s.vocab_size, "hidden_size": d, "intermediate_size": s.block.ffn.hidden_size(d),
            "num_hidden_layers": s.n_layers, "num_attention_heads": att.n_heads, "num_key_value_heads": att.kv_heads,
            "head_dim": att.qk_size(d), "hidden_act": _act_name(s.block.ffn, cls.acts, where),
            "max_position_embeddings": s.max_seq_len, "rms_norm_eps": s.block.norm.eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": s.position.base},
            "attention_bias": att.bias, "mlp_bias": s.block.ffn.bias, "attention_dropout": s.dropout.attention,
            "initializer_range": s.init.std, "tie_word_embeddings": s.tie_embeddings,
        }
        _token_ids(c, s.vocab_size, {"bos_token_id": 1, "eos_token_id": 2}, given)
        return c

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        ab, fb = s.block.attention.bias, s.block.ffn.bias
        rules = [rule("tok_emb.weight", "model.embed_tokens.weight")]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"model.layers.{i}"
            rules += [
                rule(f"{z}.attn_norm.weight", f"{h}.input_layernorm.weight"),
                *_fused(f"{z}.attn.qkv", [f"{h}.self_attn.{p}_proj" for p in "qkv"], bias=ab),
                *_wb(f"{z}.attn.out", f"{h}.self_attn.o_proj", bias=ab),
                rule(f"{z}.ffn_norm.weight", f"{h}.post_attention_layernorm.weight"),
                *_fused(f"{z}.ffn.fc1", [f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"], bias=fb),  # [gate | up]
                *_wb(f"{z}.ffn.fc2", f"{h}.mlp.down_proj", bias=fb),
            ]
        return rules + [rule("stack.norm.weight", "model.norm.weight"), rule("head.weight", "lm_head.weight")]


# -------------------------------------------------------------------------------------------- Marian
class _Marian:
    name = "MarianMTModel"
    config_name = "MarianConfig"
    model_type = "marian"
    acts = {("relu", "none"): "relu", ("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("silu", "none"): "swish"}

    @staticmethod
    def spec(c: Any, hf: nn.Module | None) -> dict:
        where = "MarianMTModel -> zoo"
        for enc, dec, what in (("encoder_attention_heads", "decoder_attention_heads", "heads"),
                               ("encoder_ffn_dim", "decoder_ffn_dim", "FFN size")):
            if getattr(c, enc) != getattr(c, dec):
                raise unsupported(where, dec, getattr(c, dec), f"zoo's encoder and decoder share one block spec, so the {what} must equal {enc} ({getattr(c, enc)})")
        _refuse_config(c, where, {
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
            "tie_embeddings": tied, "head_bias": bias,  # final_logits_bias: a head bias where it is not zero
            "position": {"kind": "sinusoidal", "base": 10000.0, "layout": "concat"},
            "block": {
                "attention": {"kind": "mha", "n_heads": c.encoder_attention_heads, "bias": True},
                "ffn": {**_ffn(_TWO_LAYER, c.activation_function, where, "activation_function"),
                        "hidden": c.encoder_ffn_dim, "bias": True},
                "norm": {"kind": "layernorm", "placement": "post", "eps": 1e-5},  # Marian: nn.LayerNorm's default eps
            },
            "dropout": {"embedding": c.dropout, "residual": c.dropout, "attention": c.attention_dropout,
                        "ffn": c.activation_dropout},
            "init": {"scheme": "normal", "std": c.init_std},
        }

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        where = "zoo -> MarianMTModel"
        pos = s.position
        _require(pos.kind == "sinusoidal" and pos.base == 10000.0, where, "position", pos.model_dump(),
                 "Marian has fixed sinusoidal positions with base 10000")
        _layernorm(s, where, "post")
        _require(s.block.norm.eps == 1e-5, where, "block.norm.eps", s.block.norm.eps, "Marian's LayerNorms have eps 1e-5")
        _plain_attention(s, where, cross_too=True)
        _require(s.block.ffn.bias, where, "block.ffn.bias", False, "Marian's FFN has biases")
        _require(not s.embedding.norm, where, "embedding.norm", True, "Marian has no norm after the embedding sum")
        _require(s.tie_embeddings or not s.share_embeddings, where, "tie_embeddings", False,
                 "HF Marian shares source and target embeddings only when it also ties the output projection; "
                 "set share_embeddings: false or tie_embeddings: true")
        _require(s.dropout.embedding == s.dropout.residual, where, "dropout.embedding", s.dropout.embedding,
                 f"Marian's dropout is one rate for embeddings and residuals (dropout.residual is {s.dropout.residual})")
        c = {
            "vocab_size": s.source_vocab_size, "decoder_vocab_size": s.vocab_size, "d_model": s.d_model,
            "max_position_embeddings": s.max_seq_len, "encoder_layers": s.encoder_layers,
            "decoder_layers": s.decoder_layers, "encoder_attention_heads": s.block.attention.n_heads,
            "decoder_attention_heads": s.block.attention.n_heads, "encoder_ffn_dim": s.block.ffn.hidden_size(s.d_model),
            "decoder_ffn_dim": s.block.ffn.hidden_size(s.d_model), "activation_function": _act_name(s.block.ffn, cls.acts, where),
            "dropout": s.dropout.residual, "attention_dropout": s.dropout.attention, "activation_dropout": s.dropout.ffn,
            "init_std": s.init.std, "scale_embedding": s.embedding.scale,
            "share_encoder_decoder_embeddings": s.share_embeddings, "tie_word_embeddings": s.tie_embeddings,
        }
        for field in ("pad_token_id", "decoder_start_token_id"):  # Marian's convention: the last id pads
            if field not in given:
                c[field] = min(s.vocab_size, s.source_vocab_size) - 1
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
                    *_fused(f"{z}.attn.qkv", [f"{h}.self_attn.{p}_proj" for p in "qkv"], bias=True),
                    *_wb(f"{z}.attn.out", f"{h}.self_attn.out_proj"),
                    *_wb(f"{z}.attn_norm", f"{h}.self_attn_layer_norm"),
                    *_wb(f"{z}.ffn.fc1", f"{h}.fc1"), *_wb(f"{z}.ffn.fc2", f"{h}.fc2"),
                    *_wb(f"{z}.ffn_norm", f"{h}.final_layer_norm"),
                ]
                if stack == "decoder":
                    rules += [
                        *_wb(f"{z}.cross_attn.q", f"{h}.encoder_attn.q_proj"),
                        *_fused(f"{z}.cross_attn.kv", [f"{h}.encoder_attn.k_proj", f"{h}.encoder_attn.v_proj"], bias=True),
                        *_wb(f"{z}.cross_attn.out", f"{h}.encoder_attn.out_proj"),
                        *_wb(f"{z}.cross_norm", f"{h}.encoder_attn_layer_norm"),
                    ]
        rules.append(rule("head.weight", "lm_head.weight"))
        return rules + ([rule("head.bias", "final_logits_bias")] if s.head_bias else [])

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
        if not s.head_bias:
            handled.append("final_logits_bias")  # all zeros, so no head bias
        if not s.share_embeddings and "model.shared.weight" in ref:
            handled.append("model.shared.weight")  # untied: the forward pass never reads it
        return handled

    @classmethod
    def extra_to(cls, zoo_model: nn.Module, s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        like = zoo_model.head.weight
        out = {f"model.{k}.embed_positions.weight": cls.table(s, like) for k in ("encoder", "decoder")}
        if not s.head_bias:
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


# -------------------------------------------------------------------------------------------- public
ARCHS = {a.name: a for a in (_GPT2, _Bert, _Llama, _Marian)}
ARCHITECTURES = tuple(ARCHS)


def by_model_type(model_type: str | None):
    """The architecture whose HF ``model_type`` (gpt2, bert, llama, marian) is ``model_type``, or None."""
    return next((a for a in ARCHS.values() if a.model_type == model_type), None)


def _arch_of_model(hf_model: nn.Module):
    name = type(hf_model).__name__
    if name not in ARCHS:
        raise ConversionError(f"from_hf: {name} does not convert; supported: {', '.join(ARCHITECTURES)}")
    return ARCHS[name]


def _arch_for_spec(spec: FamilySpec, architecture: str | None):
    if architecture is not None:
        if architecture not in ARCHS:
            raise ConversionError(f"to_hf: unknown architecture {architecture!r}; choose from {', '.join(ARCHITECTURES)}")
        return ARCHS[architecture]
    default = {"encoder": _Bert, "encoder_decoder": _Marian,
               "decoder": _Llama if spec.position.kind == "rope" else _GPT2}.get(spec.family)
    if default is None:
        raise ConversionError(f"to_hf: family {spec.family!r} has no HF counterpart here (a vit converts with zoo.interop.timm.to_timm)")
    return default


def hf_spec(config: Any) -> FamilySpec:
    """The zoo spec of the model an HF config describes (``model_type`` gpt2, bert, llama or marian).
    Tying follows the config; :func:`from_hf` reads it from the model instead."""
    arch = by_model_type(getattr(config, "model_type", None))
    if arch is None:
        types = ", ".join(a.model_type for a in ARCHS.values())
        raise ConversionError(f"hf_spec: model_type {getattr(config, 'model_type', None)!r} does not convert; supported: {types}")
    return parse_spec(arch.spec(config, None), source=f"from {arch.name} config")


def hf_config(spec: FamilySpec, architecture: str | None = None, **config: Any):
    """The HF config of ``spec`` for ``architecture`` (default: by family). ``config`` adds fields
    the spec does not decide (token ids, generation settings); fields the spec decides are refused."""
    import transformers

    arch = _arch_for_spec(spec, architecture)
    fields = arch.config(spec, config)
    clash = sorted(set(config) & set(fields) - {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"})
    if clash:
        raise ConversionError(f"to_hf: {', '.join(clash)} follow from the zoo spec; change the spec instead")
    return getattr(transformers, arch.config_name)(**{**fields, **config})


def from_hf(hf_model: nn.Module) -> nn.Module:
    """A zoo model computing what ``hf_model`` computes: its spec from the config, its tensors copied."""
    arch = _arch_of_model(hf_model)
    where = f"{arch.name} -> zoo"
    spec = parse_spec(arch.spec(hf_model.config, hf_model), source=f"from {arch.name}")
    device, dtype = device_dtype(hf_model)
    model = build(spec, device=device, dtype=dtype)
    ref = hf_model.state_dict()
    rules = arch.rules(spec)
    handled = arch.check_from(hf_model, spec, ref) if hasattr(arch, "check_from") else []
    check_covered(ref, rules, where, handled=handled)
    shapes = {name: t.shape for name, t in model.state_dict().items()}
    load_exact(model, zoo_state(ref, rules, shapes, where), where)
    return model.train(hf_model.training)


def to_hf(zoo_model: nn.Module, architecture: str | None = None, **config: Any) -> nn.Module:
    """The HF model computing what ``zoo_model`` computes (see :func:`hf_config` for ``config``)."""
    import transformers

    spec = zoo_model.spec
    arch = _arch_for_spec(spec, architecture)
    where = f"zoo -> {arch.name}"
    device, dtype = device_dtype(zoo_model)
    hf_model = getattr(transformers, arch.name)(hf_config(spec, arch.name, **config)).to(device=device, dtype=dtype)
    state = zoo_model.state_dict()
    if hasattr(arch, "prepare_to"):
        state = arch.prepare_to(state, spec)
    shapes = {name: t.shape for name, t in hf_model.state_dict().items()}
    rules = arch.rules(spec)
    check_used(state, rules, where)
    out = reference_state(state, rules, shapes, where)
    if hasattr(arch, "extra_to"):
        out.update(arch.extra_to(zoo_model, spec, shapes))
    load_exact(hf_model, out, where)
    return hf_model.train(zoo_model.training)
