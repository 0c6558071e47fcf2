"""DistilBERT (Sanh et al. 2019): ``DistilBertForMaskedLM`` <-> a zoo encoder laid out as BERT's
without segment embeddings (``type_vocab_size: 0``), every LayerNorm's eps 1e-12, and its head's
names (``vocab_transform``, ``vocab_layer_norm``, ``vocab_projector``); its backbone
``DistilBertModel`` (no pooler) <-> ``head: none``.

``sinusoidal_pos_embds: true`` stores a sinusoid table as the position embedding's weight, which
HF reads like a learned one: it converts as a learned table holding those values (and writes back
``sinusoidal_pos_embds: false`` with the same table, the same function).

Dropout: DistilBERT drops the embeddings and the FFN's output (``dropout``) but not the attention's
output; zoo's ``dropout.residual`` drops both sub-layers' outputs, so a model converted with
``dropout`` above 0 trains with the attention's output dropped too (evaluation is the same).

``DistilBertForSequenceClassification`` <-> ``head: none`` with a ``classifier``
(:mod:`zoo.interop.hf.classification`): the first token through ``pre_classifier`` and ReLU,
dropout (``seq_classif_dropout``), the linear ``classifier``."""

from __future__ import annotations

from typing import Any

from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import Architecture, fused, weights
from zoo.interop.hf.classification import dropout, fixed_pooler, sequence_classifier
from zoo.interop.hf.bert import BERT
from zoo.interop.hf.table import Check, Derived, Drop, Field, Fixed, Tokens, find, table
from zoo.interop.hf.traits import hidden_dropout, mha
from zoo.spec import FamilySpec

__all__ = ["DistilBert", "DistilBertClassifier"]

EPS = 1e-12  # DistilBERT's LayerNorms, fixed in its code


def _ffn(c: Any, where: str) -> dict:
    if c.activation not in ("gelu", "gelu_python"):
        raise unsupported(where, "activation", c.activation,
                          "zoo's masked-LM head transform uses exact GELU, so only activation 'gelu' converts")
    return {"block.ffn": {"kind": "gelu", "approximate": "none", "hidden": c.hidden_dim}}


class DistilBert(Architecture):
    name = "DistilBertForMaskedLM"
    config_name = "DistilBertConfig"
    model_type = "distilbert"
    base = "DistilBertModel"
    prefix = "distilbert"
    tie = ("vocab_projector", "distilbert.embeddings.word_embeddings")
    table = table(  # BERT's, with DistilBERT's names, no segments and a fixed eps
        BERT, Drop("config:is_decoder"), Drop("config:add_cross_attention"), Drop("config:position_embedding_type"),
        Drop("segments"), Fixed("type_vocab_size", 0, why="no segment embeddings (type_vocab_size: 0; BertForMaskedLM has them)"),
        Field("dim", "d_model"), Field("n_layers", "n_layers"), mha("n_heads"),
        Derived("ffn", _ffn, lambda s, where: {"hidden_dim": s.block.ffn.hidden_size(s.d_model), "activation": "gelu"},
                find(BERT, "ffn").claims),
        Check("block.ffn.kind", lambda s: (s.block.ffn.kind, getattr(s.block.ffn, "approximate", None)) == ("gelu", "none"),
              lambda s: "DistilBERT's activation is shared with the masked-LM head, which zoo computes with exact GELU", claim=None),
        Fixed("block.norm.eps", EPS, why=f"DistilBERT's LayerNorm eps, {EPS} in its code"),
        hidden_dropout("dropout"), Field("attention_dropout", "dropout.attention"),
        Derived("positions", lambda c, where: {}, lambda s, where: {"sinusoidal_pos_embds": False}),  # sinusoids read as weights
        Tokens({"pad_token_id": 0}),
    )

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


# pre_classifier, ReLU, dropout, classifier
DistilBertClassifier = sequence_classifier(DistilBert, "DistilBertForSequenceClassification", fixed_pooler("relu"),
                                           dropout("seq_classif_dropout", fallback=None), dense="pre_classifier")
