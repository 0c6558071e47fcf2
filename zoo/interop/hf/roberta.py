"""RoBERTa and XLM-R: ``RobertaForMaskedLM`` / ``XLMRobertaForMaskedLM`` <-> a zoo encoder laid out
as BERT's (:mod:`zoo.interop.hf.bert`) but for the positions and the head's names; their backbones
``RobertaModel`` / ``XLMRobertaModel`` <-> ``head: none``, with or without the pooler (``pooler``).

fairseq's positions: HF numbers the real tokens from ``pad_token_id + 1`` and gives padding tokens
``pad_token_id`` (``create_position_ids_from_input_ids``), which zoo's learned table does with
``position.padding_idx``; the table has ``max_position_embeddings`` rows and serves
``max_position_embeddings - pad_token_id - 1`` tokens (``max_seq_len``: 512 for roberta-base's 514).
HF tells padding from the token ids (those equal to ``pad_token_id``), zoo from ``padding_mask``:
the same positions where the mask marks exactly the padding tokens.

``RobertaForSequenceClassification`` / ``XLMRobertaForSequenceClassification`` <-> ``head: none`` with
a ``classifier`` (:mod:`zoo.interop.hf.classification`): no pooler; the head ``classifier`` drops the
first token, maps it with ``dense`` and tanh, drops it again (both at ``classifier_dropout``, else
``hidden_dropout_prob``: ``classifier.pooler_dropout`` and ``classifier.dropout``) and ``out_proj``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.interop.claims import ANY, Claims
from zoo.interop.common import Rule
from zoo.interop.hf.base import require, weights
from zoo.interop.hf.classification import dropout, fixed_pooler, sequence_classifier
from zoo.interop.hf.bert import BERT, Bert, bert_embeddings, bert_layers
from zoo.interop.hf.table import Derived, Drop, Tokens, table
from zoo.interop.hf.traits import who
from zoo.spec import FamilySpec

__all__ = ["Roberta", "RobertaClassifier", "XLMRoberta", "XLMRobertaClassifier"]


def _positions(c: Any, where: str) -> dict:
    pad = c.pad_token_id
    require(pad is not None and pad >= 0, where, "pad_token_id", pad,
            "its positions start past the padding token's id (pad_token_id), so it needs one")
    rows = c.max_position_embeddings
    require(rows > pad + 1, where, "max_position_embeddings", rows,
            f"the position table's first pad_token_id + 1 = {pad + 1} rows are for no real token; it needs more")
    return {"max_seq_len": rows - pad - 1, "position": {"kind": "learned", "padding_idx": pad}}


def _write_positions(s: FamilySpec, where: str) -> dict:
    pad = s.position.padding_idx if s.position.kind == "learned" else None
    require(pad is not None, where, "position.padding_idx", None,
            f"{who(where)}'s positions start past the padding token's (pad_token_id); set position.padding_idx "
            f"(1 in RoBERTa), or convert to BertForMaskedLM")
    require(pad < s.vocab_size, where, "position.padding_idx", pad,
            f"it is the padding token's id (pad_token_id), so below vocab_size ({s.vocab_size})")
    return {"max_position_embeddings": s.max_seq_len + pad + 1, "pad_token_id": pad}


class Roberta(Bert):
    name = "RobertaForMaskedLM"
    config_name = "RobertaConfig"
    model_type = "roberta"
    base = "RobertaModel"
    prefix = "roberta"
    base_pooler = "pooler"
    tie = ("lm_head.decoder", "roberta.embeddings.word_embeddings")
    claims: ClassVar[Claims] = {**Bert.claims, "position.padding_idx": ANY}
    # BERT's, with the positions past the padding token's id
    table = table(BERT, Drop("max_seq_len"), Derived("positions", _positions, _write_positions),
                  Tokens({"bos_token_id": 0, "eos_token_id": 2}))

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        pad = s.position.padding_idx if s.position.kind == "learned" else None
        require(pad is None or given.get("pad_token_id", pad) == pad, f"zoo -> {cls.name}", "pad_token_id",
                given.get("pad_token_id"), f"the padding token's id is position.padding_idx ({pad}): its positions follow from it")
        return super().config(s, given)

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        rules = bert_embeddings(cls.prefix) + bert_layers(s, cls.prefix)
        if getattr(s, "pooler", False):
            rules += weights("pooler.dense", f"{cls.prefix}.pooler.dense")
        if s.head.kind != "mlm":
            return rules
        return rules + [*weights("head.transform.0", "lm_head.dense"), *weights("head.transform.2", "lm_head.layer_norm"),
                        *weights("head.proj", "lm_head.decoder")]

    @classmethod
    def check_from(cls, hf: nn.Module, s: FamilySpec, ref: Mapping[str, Tensor]) -> list[str]:
        # HF ties lm_head.bias to lm_head.decoder.bias, which the forward pass reads
        return ["lm_head.bias"] if s.head.kind == "mlm" else []

    @classmethod
    def extra_to(cls, state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        return {"lm_head.bias": state["head.proj.bias"].detach()} if s.head.kind == "mlm" else {}


class XLMRoberta(Roberta):
    """XLM-R: RoBERTa's classes under other names (a 250k vocabulary in the releases)."""

    name = "XLMRobertaForMaskedLM"
    config_name = "XLMRobertaConfig"
    model_type = "xlm-roberta"
    base = "XLMRobertaModel"


# RobertaClassificationHead: dropout, dense, tanh, dropout, out_proj
_HEAD = (fixed_pooler("tanh"), dropout("classifier_dropout", pooler=True))
RobertaClassifier = sequence_classifier(Roberta, "RobertaForSequenceClassification", *_HEAD, dense="classifier.dense",
                                        out="classifier.out_proj")
XLMRobertaClassifier = sequence_classifier(XLMRoberta, "XLMRobertaForSequenceClassification", *_HEAD,
                                           dense="classifier.dense", out="classifier.out_proj")
