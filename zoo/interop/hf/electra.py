"""ELECTRA: ``ElectraForMaskedLM`` (the generator) <-> a zoo encoder laid out as BERT's
(:mod:`zoo.interop.hf.bert`) with factorised embeddings; its backbone ``ElectraModel`` (what the
discriminator checkpoints hold beside their one-unit head) <-> the same encoder with ``head: none``.

Factorised embeddings (Clark et al. 2020): where ``embedding_size`` differs from ``hidden_size`` the
token, position and segment embeddings and their LayerNorm are ``embedding_size`` wide and
``embeddings_project`` maps their sum to the hidden size (``embedding.dim``, zoo's ``emb_proj``);
where they are equal there is no projection (``embedding.dim: null``). The generator's head maps the
hidden states to ``embedding_size`` (``generator_predictions.dense``), applies exact GELU whatever
``hidden_act`` is, and a LayerNorm, then the decoder ``generator_lm_head`` tied to the embeddings:
zoo's mlm head with its transform to ``embedding.dim``.

``ElectraForPreTraining`` (the discriminator with its head: a dense layer, ``hidden_act`` and a
one-unit projection per token) is not converted: zoo has no such head.
``ElectraForSequenceClassification`` <-> ``head: none`` with a ``classifier``
(:mod:`zoo.interop.hf.classification`): the head ``classifier`` drops the first token, maps it with
``dense`` and exact GELU (whatever ``hidden_act`` is), drops it again (both at ``classifier_dropout``,
else ``hidden_dropout_prob``) and ``out_proj``."""

from __future__ import annotations

from typing import Any

from zoo.interop.claims import ANY
from zoo.interop.common import Rule
from zoo.interop.hf.base import require, weights
from zoo.interop.hf.classification import dropout, fixed_pooler, sequence_classifier
from zoo.interop.hf.bert import BERT, Bert, bert_embeddings, bert_layers
from zoo.interop.hf.table import Derived, Drop, Fixed, table
from zoo.interop.hf.traits import two_layer_ffn, who
from zoo.spec import FamilySpec

__all__ = ["ACTS", "Electra", "ElectraClassifier", "factorised"]

# zoo's two-layer FFNs <-> HF's activation names
ACTS = {("gelu", "none"): "gelu", ("gelu", "tanh"): "gelu_new", ("relu", "none"): "relu", ("silu", "none"): "silu"}


def factorised(*, always: bool) -> Derived:
    """``embedding_size`` <-> ``embedding.dim``: with ``always`` (ALBERT) the projection is there even
    at the hidden size; else (ELECTRA) only where the sizes differ."""

    def read(c: Any, where: str) -> dict:
        e = c.embedding_size
        return {"embedding.dim": e} if always or e != c.hidden_size else {}

    def write(s: FamilySpec, where: str) -> dict:
        e = s.embedding.dim
        if always:
            require(e is not None, where, "embedding.dim", None,
                    f"{who(where)} maps its embeddings to the hidden size with a linear layer; set embedding.dim "
                    f"(ALBERT's embedding_size, 128 in the releases)")
        else:
            require(e != s.d_model, where, "embedding.dim", e,
                    f"{who(where)} has a projection only where embedding_size differs from hidden_size; set "
                    f"embedding.dim: null (no projection) or another width")
        return {"embedding_size": e or s.d_model}

    return Derived("embedding.dim", read, write, {"embedding.dim": ANY})


class Electra(Bert):
    name = "ElectraForMaskedLM"
    config_name = "ElectraConfig"
    model_type = "electra"
    base = "ElectraModel"
    prefix = "electra"
    base_pooler = None
    tie = ("generator_lm_head", "electra.embeddings.word_embeddings")
    # BERT's, with factorised embeddings, any two-layer FFN (the head's GELU is exact whatever hidden_act is)
    table = table(BERT, Drop("check:block.ffn.kind:"), two_layer_ffn(ACTS), factorised(always=False),
                  Fixed("head.approximate", "none", why="exact GELU in the generator's head (approximate: none)"))

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        rules = bert_embeddings(cls.prefix) + bert_layers(s, cls.prefix)
        if s.embedding.dim is not None:
            rules += weights("emb_proj", f"{cls.prefix}.embeddings_project")
        if s.head.kind != "mlm":
            return rules
        p = "generator_predictions"
        return rules + [*weights("head.transform.0", f"{p}.dense"), *weights("head.transform.2", f"{p}.LayerNorm"),
                        *weights("head.proj", "generator_lm_head")]

    @classmethod
    def check_from(cls, hf, s, ref) -> list[str]:
        return []  # no second name for the decoder's bias

    @classmethod
    def extra_to(cls, state, s, shapes) -> dict:
        return {}


# ElectraClassificationHead: dropout, dense, exact GELU, dropout, out_proj
ElectraClassifier = sequence_classifier(Electra, "ElectraForSequenceClassification", fixed_pooler("gelu"),
                                        dropout("classifier_dropout", pooler=True), dense="classifier.dense",
                                        out="classifier.out_proj")
