"""DistilBERT (Sanh et al. 2019): ``DistilBertForMaskedLM`` <-> a zoo encoder laid out as BERT's
without segment embeddings (``type_vocab_size: 0``), every LayerNorm's eps 1e-12, and its head's
names (``vocab_transform``, ``vocab_layer_norm``, ``vocab_projector``); its backbone
``DistilBertModel`` (no pooler) <-> ``head: none``.

``sinusoidal_pos_embds: true`` stores a sinusoid table as the position embedding's weight, which
HF reads like a learned one: it converts as a learned table holding those values (and writes back
``sinusoidal_pos_embds: false`` with the same table, the same function).

Dropout: DistilBERT drops the embeddings and the FFN's output (``dropout``) but not the attention's
output; zoo's ``dropout.residual`` drops both sub-layers' outputs, so a model converted with
``dropout`` above 0 trains with the attention's output dropped too (evaluation is the same)."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from zoo.interop.claims import Claims
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import Architecture, fused, layernorm, plain_attention, require, token_ids, weights
from zoo.interop.hf.bert import Bert
from zoo.spec import FamilySpec

__all__ = ["DistilBert"]

EPS = 1e-12  # DistilBERT's LayerNorms, fixed in its code


class DistilBert(Architecture):
    name = "DistilBertForMaskedLM"
    config_name = "DistilBertConfig"
    model_type = "distilbert"
    base = "DistilBertModel"
    prefix = "distilbert"
    claims: ClassVar[Claims] = {k: v for k, v in Bert.claims.items() if k != "type_vocab_size"}  # BERT's, no segments

    @staticmethod
    def spec(c: Any, hf: nn.Module | None) -> dict:
        where = "DistilBertForMaskedLM -> zoo"
        if c.activation not in ("gelu", "gelu_python"):
            raise unsupported(where, "activation", c.activation,
                              "zoo's masked-LM head transform uses exact GELU, so only activation 'gelu' converts")
        tied = c.tie_word_embeddings if hf is None else hf.vocab_projector.weight is hf.distilbert.embeddings.word_embeddings.weight
        return {
            "family": "encoder", "vocab_size": c.vocab_size, "max_seq_len": c.max_position_embeddings, "type_vocab_size": 0,
            "d_model": c.dim, "n_layers": c.n_layers, "embedding": {"scale": False, "norm": True},
            "head": {"kind": "mlm", "transform": True, "bias": True, "tied": tied}, "position": {"kind": "learned"},
            "block": {
                "attention": {"kind": "mha", "n_heads": c.n_heads, "bias": True},
                "ffn": {"kind": "gelu", "approximate": "none", "hidden": c.hidden_dim, "bias": True},
                "norm": {"kind": "layernorm", "eps": EPS},
                "kind": "post",
            },
            "dropout": {"embedding": c.dropout, "residual": c.dropout, "attention": c.attention_dropout, "ffn": 0.0},
            "init": {"scheme": "normal", "std": c.initializer_range},
        }

    @staticmethod
    def config(s: FamilySpec, given: dict) -> dict:
        where = "zoo -> DistilBertForMaskedLM"
        require(s.position.kind == "learned" and getattr(s.position, "padding_idx", None) is None, where, "position.kind",
                s.position.kind, "DistilBERT has a table of positions 0, 1, ... (learned, or sinusoids stored as its weights)")
        layernorm(s, where, "post")
        plain_attention(s, where)
        ffn = s.block.ffn
        require((ffn.kind, getattr(ffn, "approximate", None)) == ("gelu", "none"), where, "block.ffn.kind", ffn.kind,
                "DistilBERT's activation is shared with the masked-LM head, which zoo computes with exact GELU")
        require(ffn.bias, where, "block.ffn.bias", False, "DistilBERT's FFN has biases")
        require(s.block.norm.eps == EPS, where, "block.norm.eps", s.block.norm.eps, f"DistilBERT's LayerNorms have eps {EPS}")
        require(s.embedding.norm, where, "embedding.norm", False, "DistilBERT normalises the embedding sum (norm: true)")
        require(s.type_vocab_size == 0, where, "type_vocab_size", s.type_vocab_size,
                "DistilBERT has no segment embeddings; set type_vocab_size: 0 (or convert to BertForMaskedLM)")
        require(s.dropout.embedding == s.dropout.residual, where, "dropout.embedding", s.dropout.embedding,
                f"DistilBERT's dropout is one rate for embeddings and residuals (dropout.residual is {s.dropout.residual})")
        c = {
            "vocab_size": s.vocab_size, "dim": s.d_model, "n_layers": s.n_layers, "n_heads": s.block.attention.n_heads,
            "hidden_dim": ffn.hidden_size(s.d_model), "activation": "gelu", "dropout": s.dropout.residual,
            "attention_dropout": s.dropout.attention, "max_position_embeddings": s.max_seq_len, "sinusoidal_pos_embds": False,
            "initializer_range": s.init.std, "tie_word_embeddings": s.head.tied,
        }
        token_ids(c, s.vocab_size, {"pad_token_id": 0}, given)
        return c

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        e = "distilbert.embeddings"
        rules = [rule("tok_emb.weight", f"{e}.word_embeddings.weight"), rule("position.weight", f"{e}.position_embeddings.weight"),
                 *weights("emb_norm", f"{e}.LayerNorm")]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"distilbert.transformer.layer.{i}"
            rules += [
                *fused(f"{z}.attn.qkv", [f"{h}.attention.{p}_lin" for p in "qkv"], bias=True),
                *weights(f"{z}.attn.out", f"{h}.attention.out_lin"), *weights(f"{z}.attn_norm", f"{h}.sa_layer_norm"),
                *weights(f"{z}.ffn.fc1", f"{h}.ffn.lin1"), *weights(f"{z}.ffn.fc2", f"{h}.ffn.lin2"),
                *weights(f"{z}.ffn_norm", f"{h}.output_layer_norm"),
            ]
        if s.head.kind != "mlm":
            return rules
        return rules + [*weights("head.transform.0", "vocab_transform"), *weights("head.transform.2", "vocab_layer_norm"),
                        *weights("head.proj", "vocab_projector")]
