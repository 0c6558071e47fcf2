"""DeBERTa-v2/v3: ``DebertaV2ForMaskedLM`` <-> a zoo encoder laid out as BERT's
(:mod:`zoo.interop.hf.bert`) with disentangled attention (``attention.kind: disentangled``) over one
relative-embedding table the layers share (``position.kind: relative_embedding``: HF's
``encoder.rel_embeddings`` and, with ``norm_rel_ebd: layer_norm``, ``encoder.LayerNorm``); its
backbone ``DebertaV2Model`` <-> the same encoder with ``head: none`` (no pooler).

The table's rows: ``position_buckets`` log buckets (``position.buckets``; -1: none, the span
``max_relative_positions``), reaching ``max_relative_positions`` (else ``max_position_embeddings``,
``position.max_distance``). ``pos_att_type`` names the position terms (c2p, p2c), ``share_att_key``
whether the table goes through the content projections. v3 has no absolute positions
(``position_biased_input: false``) and no segments (``type_vocab_size: 0``); segments convert.

Refused by name: ``relative_attention: false``, ``position_biased_input: true`` (absolute positions
besides the relative table), ``conv_kernel_size`` (v2-xlarge's convolution beside the first layer),
``embedding_size`` other than ``hidden_size`` (HF projects the embeddings before their LayerNorm),
``legacy: false`` (the head under other names), ``norm_rel_ebd`` other than none or layer_norm, and
``pos_att_type`` entries other than c2p and p2c. The head is BERT's (``cls.predictions``): dense,
exact GELU (``hidden_act: gelu``), LayerNorm, the decoder tied to the embeddings with its bias.
Distances are between zoo's positions (real tokens counted) where HF's are between slots: the same
between the real tokens of a row padded on one side. HF zeroes padding tokens' embeddings, which
no real token reads.

``DebertaV2ForSequenceClassification`` <-> the same encoder with ``head: none`` and a ``classifier``
(:mod:`zoo.interop.hf.classification`): its ContextPooler drops the first token
(``pooler_dropout``: ``classifier.pooler_dropout``), maps it with ``pooler.dense`` and
``pooler_hidden_act`` (``classifier.activation``, exact GELU by default), then ``cls_dropout`` (else
``hidden_dropout_prob``) and the linear ``classifier``. Refused: ``pooler_hidden_size`` other than
``hidden_size`` (the classifier reads hidden_size features)."""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import ANY, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import require, weights
from zoo.interop.hf.bert import BERT, Bert
from zoo.interop.hf.classification import activation, dropout, sequence_classifier
from zoo.interop.hf.table import Derived, Drop, Field, Fixed, Refuse, table
from zoo.interop.hf.traits import who
from zoo.spec import FamilySpec

__all__ = ["DebertaV2", "DebertaV2Classifier"]

_TERMS = ("c2p", "p2c")


def _positions(c: Any, where: str) -> dict:
    require(getattr(c, "relative_attention", False), where, "relative_attention", False,
            "zoo's DeBERTa layout attends with its relative table (relative_attention: true)")
    require(not getattr(c, "position_biased_input", True), where, "position_biased_input", True,
            "zoo's DeBERTa layout has no absolute positions beside the relative table (v3's position_biased_input: false)")
    width = getattr(c, "embedding_size", c.hidden_size)
    require(width == c.hidden_size, where, "embedding_size", width,
            "HF projects DeBERTa's embeddings before their LayerNorm, which zoo's factorised embeddings do after; "
            "embedding_size must equal hidden_size")
    norms = [x.strip() for x in str(getattr(c, "norm_rel_ebd", "none")).lower().split("|")]
    if any(n not in ("none", "layer_norm") for n in norms):
        raise unsupported(where, "norm_rel_ebd", c.norm_rel_ebd, "zoo normalises the relative table with a LayerNorm "
                          "(layer_norm) or not at all (none)")
    buckets = getattr(c, "position_buckets", -1)
    most = getattr(c, "max_relative_positions", -1)
    return {"position": {"kind": "relative_embedding", "buckets": buckets if buckets > 0 else None,
                         "max_distance": most if most >= 1 else c.max_position_embeddings,
                         "norm": "layer_norm" in norms, "eps": c.layer_norm_eps, "dropout": c.hidden_dropout_prob}}


def _write_positions(s: FamilySpec, where: str) -> dict:
    p = s.position
    require(p.eps == s.block.norm.eps, where, "position.eps", p.eps,
            f"{who(where)} normalises the relative table with layer_norm_eps, the blocks' ({s.block.norm.eps})")
    require(p.dropout == s.dropout.residual, where, "position.dropout", p.dropout,
            f"{who(where)} drops the relative table at hidden_dropout_prob, the residuals' rate ({s.dropout.residual})")
    return {"relative_attention": True, "position_biased_input": False, "position_buckets": p.buckets or -1,
            "max_relative_positions": -1 if p.max_distance == s.max_seq_len else p.max_distance, "norm_rel_ebd": "layer_norm" if p.norm else "none"}


def _attention(c: Any, where: str) -> dict:
    kinds = c.pos_att_type or []
    kinds = [x.strip() for x in kinds.lower().split("|")] if isinstance(kinds, str) else list(kinds)
    if any(k not in _TERMS for k in kinds):
        raise unsupported(where, "pos_att_type", kinds, "zoo's disentangled attention has the c2p and p2c terms")
    att = {"kind": "disentangled", "n_heads": c.num_attention_heads, "c2p": "c2p" in kinds, "p2c": "p2c" in kinds,
           "share_key": bool(getattr(c, "share_att_key", False))}
    size = getattr(c, "attention_head_size", None)
    require(size in (None, c.hidden_size // c.num_attention_heads), where, "attention_head_size", size,
            "HF's attention output maps hidden_size features, so its heads are hidden_size / heads wide")
    return {"block.attention": att}


def _write_attention(s: FamilySpec, where: str) -> dict:
    att, d = s.block.attention, s.d_model
    require(d % att.n_heads == 0 and att.qk_size(d) == d // att.n_heads, where, "block.attention.head_dim",
            att.qk_size(d), f"{who(where)}'s heads are hidden_size / heads wide ({d} / {att.n_heads})")
    return {"num_attention_heads": att.n_heads, "pos_att_type": [k for k in ("p2c", "c2p") if getattr(att, k)],
            "share_att_key": att.share_key}


def _segments(c: Any, where: str) -> dict:
    return {"type_vocab_size": c.type_vocab_size}


# BERT's, with the relative table for the positions, disentangled attention, segments optional
DEBERTA = table(
    BERT, Drop("config:position_embedding_type"), Drop("position.kind"),
    Derived("segments", _segments, lambda s, where: {"type_vocab_size": s.type_vocab_size}, {"type_vocab_size": ANY}),
    Derived("positions", _positions, _write_positions,
            {"position.kind": one_of("relative_embedding"), "position.buckets": ANY, "position.max_distance": ANY,
             "position.norm": ANY, "position.eps": ANY, "position.dropout": ANY}),
    Drop("heads"),
    Derived("disentangled", _attention, _write_attention,
            {"block.attention.kind": one_of("disentangled"), "block.attention.n_heads": ANY, "block.attention.n_kv_heads": ANY,
             "block.attention.head_dim": ANY, "block.attention.v_head_dim": ANY, "block.attention.c2p": ANY,
             "block.attention.p2c": ANY, "block.attention.share_key": ANY}),
    Refuse("conv_kernel_size", 0, "zoo's DeBERTa layout has no convolution beside the first layer (v2-xlarge's)", falsy=True),
    Refuse("legacy", True, "zoo reads DeBERTa's masked-LM head under its legacy names (cls.predictions)"),
)


class DebertaV2(Bert):
    name = "DebertaV2ForMaskedLM"
    config_name = "DebertaV2Config"
    model_type = "deberta-v2"
    base = "DebertaV2Model"
    prefix = "deberta"
    base_pooler = None
    tie = ("cls.predictions.decoder", "deberta.embeddings.word_embeddings")
    table = DEBERTA

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        e, p = f"{cls.prefix}.embeddings", f"{cls.prefix}.encoder"
        rules = [rule("tok_emb.weight", f"{e}.word_embeddings.weight"), *weights("emb_norm", f"{e}.LayerNorm"),
                 rule("stack.positions.0.weight", f"{p}.rel_embeddings.weight")]
        if s.type_vocab_size:
            rules.append(rule("type_emb.weight", f"{e}.token_type_embeddings.weight"))
        if s.position.norm:
            rules += weights("stack.positions.0.norm", f"{p}.LayerNorm")
        att = s.block.attention
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"{p}.layer.{i}"
            a = f"{h}.attention.self"
            rules += [*weights(f"{z}.attn.q", f"{a}.query_proj"), *weights(f"{z}.attn.k", f"{a}.key_proj"),
                      *weights(f"{z}.attn.v", f"{a}.value_proj"),
                      *weights(f"{z}.attn.out", f"{h}.attention.output.dense"),
                      *weights(f"{z}.attn_norm", f"{h}.attention.output.LayerNorm"),
                      *weights(f"{z}.ffn.fc1", f"{h}.intermediate.dense"), *weights(f"{z}.ffn.fc2", f"{h}.output.dense"),
                      *weights(f"{z}.ffn_norm", f"{h}.output.LayerNorm")]
            if not att.share_key:
                rules += [*(weights(f"{z}.attn.pos_k", f"{a}.pos_key_proj") if att.c2p else []),
                          *(weights(f"{z}.attn.pos_q", f"{a}.pos_query_proj") if att.p2c else [])]
        if s.head.kind != "mlm":
            return rules
        q = "cls.predictions"
        return rules + [*weights("head.transform.0", f"{q}.transform.dense"),
                        *weights("head.transform.2", f"{q}.transform.LayerNorm"), *weights("head.proj", f"{q}.decoder")]


def _pooler_size(c: Any, where: str) -> dict:
    size = getattr(c, "pooler_hidden_size", c.hidden_size)
    require(size == c.hidden_size, where, "pooler_hidden_size", size,
            f"the classifier reads hidden_size ({c.hidden_size}) features, so the pooler is hidden_size wide")
    return {}


# the ContextPooler: dropout, dense, pooler_hidden_act; then cls_dropout and the labels' linear
DebertaV2Classifier = sequence_classifier(
    DebertaV2, "DebertaV2ForSequenceClassification",
    Fixed("classifier.pooler", True, why="the ContextPooler's dense layer and activation (pooler: true)"),
    activation("pooler_hidden_act"), Field("pooler_dropout", "classifier.pooler_dropout"), dropout("cls_dropout"),
    Derived("pooler_hidden_size", _pooler_size, lambda s, where: {}),
    dense="pooler.dense")
