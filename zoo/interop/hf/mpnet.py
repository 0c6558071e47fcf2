"""MPNet: ``MPNetForMaskedLM`` <-> a zoo encoder laid out as RoBERTa's (:mod:`zoo.interop.hf.roberta`)
without segment embeddings, plus a relative position bias (Song et al. 2020); its backbone
``MPNetModel`` (what sentence-transformers' all-mpnet-base-v2 ships) <-> ``head: none``, with its
pooler (``pooler: true``) or without.

Positions: fairseq's learned table past the padding index, which MPNet fixes at 1 whatever
``pad_token_id`` says (``position.padding_idx: 1``, ``max_seq_len`` = ``max_position_embeddings - 2``);
and beside it, on every layer's scores, one table of T5's bidirectional relative buckets shared by
all layers (``encoder.relative_attention_bias``): each layer's own position ``relative_bias`` with
32 buckets and ``max_distance`` 128, one module in zoo as the layers' positions are alike
(``layers: [{at: "0:", position: {kind: relative_bias, num_buckets: 32, max_distance: 128}}]``).
HF computes 32 buckets whatever ``relative_attention_num_buckets`` says, so another value is
refused. The relative distances are the token slots' (HF's) where zoo's are the real tokens': the
same between the real tokens of a row padded on one side, which are all that attend to each other.

The head (``lm_head``): dense, exact GELU, LayerNorm, the decoder tied to the embeddings with its
bias (``lm_head.bias``, tied to the decoder's).

``MPNetForSequenceClassification`` <-> ``head: none`` with a ``classifier``
(:mod:`zoo.interop.hf.classification`): RoBERTa's head (dropout, ``dense``, tanh, dropout,
``out_proj``), both dropouts at ``hidden_dropout_prob``, the blocks' rate."""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import ANY
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.base import fused, require, weights
from zoo.interop.hf.classification import dropout, fixed_pooler, sequence_classifier
from zoo.interop.hf.bert import BERT
from zoo.interop.hf.roberta import Roberta
from zoo.interop.hf.table import Derived, Drop, Fixed, Tokens, table
from zoo.interop.hf.traits import who
from zoo.spec import FamilySpec

__all__ = ["MPNet", "MPNetClassifier"]

PAD = 1  # MPNetEmbeddings' padding_idx, fixed
BUCKETS, DISTANCE = 32, 128  # what HF's compute_position_bias uses
_BIAS = {"kind": "relative_bias", "num_buckets": BUCKETS, "max_distance": DISTANCE}


def _positions(c: Any, where: str) -> dict:
    rows = c.max_position_embeddings
    require(rows > PAD + 1, where, "max_position_embeddings", rows, "MPNet's first two rows are for no real token; it needs more")
    if c.relative_attention_num_buckets != BUCKETS:
        raise unsupported(where, "relative_attention_num_buckets", c.relative_attention_num_buckets,
                          f"HF's MPNet computes {BUCKETS} buckets whatever its table holds")
    return {"max_seq_len": rows - PAD - 1, "position": {"kind": "learned", "padding_idx": PAD},
            "layers": [{"at": "0:", "position": dict(_BIAS)}]}


def _write_positions(s: FamilySpec, where: str) -> dict:
    pad = s.position.padding_idx if s.position.kind == "learned" else None
    require(pad == PAD, where, "position.padding_idx", pad,
            f"{who(where)}'s positions start past padding index 1 (position: {{kind: learned, padding_idx: 1}})")
    require(s.vocab_size > PAD, where, "vocab_size", s.vocab_size,
            f"{who(where)}'s token embedding has a padding row {PAD}, so it needs at least {PAD + 1} rows")
    biased = all(layer.position is not None and layer.position.model_dump() == _BIAS for layer in s.stack_layers())
    changed = any(p.block is not None for p in s.layers)
    require(biased and not changed, where, "layers", [p.model_dump(mode="json", exclude_defaults=True) for p in s.layers],
            f"{who(where)} biases every layer's scores by one relative table: layers: [{{at: \"0:\", position: "
            f"{{kind: relative_bias, num_buckets: {BUCKETS}, max_distance: {DISTANCE}}}}}] and no other pattern")
    return {"max_position_embeddings": s.max_seq_len + PAD + 1, "relative_attention_num_buckets": BUCKETS}


class MPNet(Roberta):
    name = "MPNetForMaskedLM"
    config_name = "MPNetConfig"
    model_type = "mpnet"
    base = "MPNetModel"
    prefix = "mpnet"
    base_pooler = "pooler"
    tie = ("lm_head.decoder", "mpnet.embeddings.word_embeddings")
    # BERT's, with fairseq's positions past index 1, a relative bias on every layer, no segments
    table = table(BERT, Drop("max_seq_len"), Drop("segments"), Drop("config:position_embedding_type"),
                  Fixed("type_vocab_size", 0, why="no segment embeddings (type_vocab_size: 0)"),
                  Derived("positions", _positions, _write_positions, {"max_seq_len": ANY, "position.padding_idx": ANY, "layers": ANY}),
                  Tokens({"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": PAD}))

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        return super(Roberta, cls).config(s, given)  # the padding index is fixed, not pad_token_id

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        e, p = f"{cls.prefix}.embeddings", f"{cls.prefix}.encoder"
        rules = [
            rule("tok_emb.weight", f"{e}.word_embeddings.weight"), rule("position.weight", f"{e}.position_embeddings.weight"),
            *weights("emb_norm", f"{e}.LayerNorm"), rule("stack.positions.0.weight", f"{p}.relative_attention_bias.weight"),
        ]
        for i in range(s.n_layers):
            z, h = f"stack.blocks.{i}", f"{p}.layer.{i}"
            rules += [
                *fused(f"{z}.attn.qkv", [f"{h}.attention.attn.{n}" for n in "qkv"], bias=True),
                *weights(f"{z}.attn.out", f"{h}.attention.attn.o"), *weights(f"{z}.attn_norm", f"{h}.attention.LayerNorm"),
                *weights(f"{z}.ffn.fc1", f"{h}.intermediate.dense"), *weights(f"{z}.ffn.fc2", f"{h}.output.dense"),
                *weights(f"{z}.ffn_norm", f"{h}.output.LayerNorm"),
            ]
        if getattr(s, "pooler", False):
            rules += weights("pooler.dense", f"{cls.prefix}.pooler.dense")
        if s.head.kind != "mlm":
            return rules
        return rules + [*weights("head.transform.0", "lm_head.dense"), *weights("head.transform.2", "lm_head.layer_norm"),
                        *weights("head.proj", "lm_head.decoder")]


# RoBERTa's head, its dropout the blocks' (hidden_dropout_prob)
MPNetClassifier = sequence_classifier(MPNet, "MPNetForSequenceClassification", fixed_pooler("tanh"),
                                      dropout(None, pooler=True), dense="classifier.dense", out="classifier.out_proj")
