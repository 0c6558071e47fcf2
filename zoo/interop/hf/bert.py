"""BERT: ``BertForMaskedLM`` <-> a zoo encoder (Post-Norm, masked-LM head); its backbone ``BertModel``
(what sentence-embedding, retrieval and reranking checkpoints ship) <-> the same encoder with
``head: none``, and with HF's pooler (``add_pooling_layer``, the default) as ``pooler: true``
(:class:`~zoo.interop.hf.base.Headless`); ``BertForSequenceClassification`` <-> ``head: none`` with a
``classifier`` (:mod:`zoo.interop.hf.classification`): the pooler's dense layer and tanh, dropout
(``classifier_dropout``, else ``hidden_dropout_prob``), the linear ``classifier``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from zoo.interop.claims import ANY, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import Architecture, fused, require, weights
from zoo.interop.hf.classification import dropout, fixed_pooler, sequence_classifier
from zoo.interop.hf.table import Check, Claim, Derived, Field, Fixed, Refuse, table
from zoo.interop.hf.traits import hidden_dropout, layernorm, mha
from zoo.spec import FamilySpec

__all__ = ["BERT", "Bert", "BertClassifier", "bert_layers"]



def _ffn(c: Any, where: str) -> dict:
    if c.hidden_act not in ("gelu", "gelu_python"):
        raise unsupported(where, "hidden_act", c.hidden_act,
                          "zoo's masked-LM head transform uses exact GELU, so only hidden_act 'gelu' converts")
    return {"block.ffn": {"kind": "gelu", "approximate": "none", "hidden": c.intermediate_size}}


def _segments(c: Any, where: str) -> dict:
    require(c.type_vocab_size > 0, where, "type_vocab_size", c.type_vocab_size, "BERT needs at least one segment type")
    return {"type_vocab_size": c.type_vocab_size}


def _write_segments(s: FamilySpec, where: str) -> dict:
    require(s.type_vocab_size > 0, where, "type_vocab_size", 0, "BERT has segment embeddings; set type_vocab_size >= 1")
    return {"type_vocab_size": s.type_vocab_size}


# BertConfig <-> a zoo encoder, field by field
BERT = table(
    Refuse("is_decoder", False, "zoo encoders are bidirectional", write=False),
    Refuse("add_cross_attention", False, "zoo encoders have no cross-attention", write=False),
    Refuse("position_embedding_type", "absolute", "zoo's BERT layout has absolute learned positions", write=False),
    Fixed("family", "encoder"), Field("vocab_size", "vocab_size"), Field("max_position_embeddings", "max_seq_len"),
    Derived("segments", _segments, _write_segments, {"type_vocab_size": ANY}),
    Field("hidden_size", "d_model"), Field("num_hidden_layers", "n_layers"),
    Fixed("embedding.scale", False), Fixed("embedding.norm", True, why="a normalised embedding sum (norm: true)"),
    Fixed("head.kind", "mlm"), Fixed("head.transform", True), Fixed("head.bias", True), Field("tie_word_embeddings", "head.tied"),
    Fixed("position.kind", "learned", why="learned absolute positions"),
    mha(), Fixed("block.attention.bias", True), Claim("block.attention.out_bias", one_of(None, True)),
    Derived("ffn", _ffn, lambda s, where: {"intermediate_size": s.block.ffn.hidden_size(s.d_model), "hidden_act": "gelu"},
            {"block.ffn.kind": one_of("relu", "gelu", "silu", "swiglu", "geglu"), "block.ffn.approximate": ANY,
             "block.ffn.hidden": ANY}),
    Check("block.ffn.kind", lambda s: (s.block.ffn.kind, getattr(s.block.ffn, "approximate", None)) == ("gelu", "none"),
          lambda s: "BERT's hidden_act is shared with the masked-LM head, which zoo computes with exact GELU", claim=None),
    Fixed("block.ffn.bias", True),
    layernorm(), Fixed("block.kind", "post"),
    hidden_dropout("hidden_dropout_prob"), Field("attention_probs_dropout_prob", "dropout.attention"), Fixed("dropout.ffn", 0.0),
    Fixed("init.scheme", "normal"), Field("initializer_range", "init.std"),
)


class Bert(Architecture):
    name = "BertForMaskedLM"
    config_name = "BertConfig"
    model_type = "bert"
    base = "BertModel"
    prefix = "bert"
    base_pooler = "pooler"
    tie = ("cls.predictions.decoder", "bert.embeddings.word_embeddings")
    table = BERT

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        rules = bert_embeddings("bert") + bert_layers(s, "bert")
        if getattr(s, "pooler", False):  # BertModel's (the backbone's claims alone take it)
            rules += weights("pooler.dense", "bert.pooler.dense")
        if s.head.kind != "mlm":
            return rules
        p = "cls.predictions"
        return rules + [
            *weights("head.transform.0", f"{p}.transform.dense"), *weights("head.transform.2", f"{p}.transform.LayerNorm"),
            *weights("head.proj", f"{p}.decoder"),
        ]

    @staticmethod
    def check_from(hf: nn.Module, s: FamilySpec, ref: dict[str, Tensor]) -> list[str]:
        # The forward pass reads cls.predictions.decoder.bias; HF ties cls.predictions.bias to it,
        # or (untied embeddings) leaves it unread.
        return ["cls.predictions.bias"] if s.head.kind == "mlm" else []

    @staticmethod
    def extra_to(state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        return {"cls.predictions.bias": state["head.proj.bias"].detach()} if s.head.kind == "mlm" else {}


def bert_embeddings(prefix: str) -> list[Rule]:
    """The embeddings of BERT's layout (RoBERTa's, ELECTRA's and ALBERT's too), under ``{prefix}.embeddings``:
    tokens, positions, segments and their LayerNorm."""
    e = f"{prefix}.embeddings"
    return [rule("tok_emb.weight", f"{e}.word_embeddings.weight"), rule("position.weight", f"{e}.position_embeddings.weight"),
            rule("type_emb.weight", f"{e}.token_type_embeddings.weight"), *weights("emb_norm", f"{e}.LayerNorm")]


def bert_layers(s: FamilySpec, prefix: str) -> list[Rule]:
    """The encoder layers of BERT's layout (RoBERTa's too), under ``{prefix}.encoder.layer``."""
    rules = []
    for i in range(s.n_layers):
        z, h = f"stack.blocks.{i}", f"{prefix}.encoder.layer.{i}"
        qkv = [f"{h}.attention.self.{p}" for p in ("query", "key", "value")]
        rules += [
            *fused(f"{z}.attn.qkv", qkv, bias=True),
            *weights(f"{z}.attn.out", f"{h}.attention.output.dense"),
            *weights(f"{z}.attn_norm", f"{h}.attention.output.LayerNorm"),
            *weights(f"{z}.ffn.fc1", f"{h}.intermediate.dense"),
            *weights(f"{z}.ffn.fc2", f"{h}.output.dense"),
            *weights(f"{z}.ffn_norm", f"{h}.output.LayerNorm"),
        ]
    return rules


# the backbone's pooler (dense, tanh), dropout, the labels' linear
BertClassifier = sequence_classifier(Bert, "BertForSequenceClassification", fixed_pooler("tanh"), dropout("classifier_dropout"),
                                     dense="bert.pooler.dense")
