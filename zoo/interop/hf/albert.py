"""ALBERT: ``AlbertForMaskedLM`` <-> a zoo encoder laid out as BERT's (:mod:`zoo.interop.hf.bert`)
with factorised embeddings and shared layers (Lan et al. 2020); its backbone ``AlbertModel`` <->
the same encoder with ``head: none``, with its pooler (``pooler: true``) or without.

- Factorised embeddings: the token, position and segment embeddings and their LayerNorm are
  ``embedding_size`` wide, and ``encoder.embedding_hidden_mapping_in`` maps their sum to the hidden
  size, at any width (``embedding.dim``, zoo's ``emb_proj``).
- Shared layers: ``num_hidden_groups`` blocks of weights (``albert_layer_groups``), layer i running
  group int(i / (num_hidden_layers / num_hidden_groups)): zoo's ``shared_layers`` (null where every
  layer has its own group). A zoo state dict names every layer's tensors, tied to its group's first.
- The MLM head (``predictions``): dense to ``embedding_size``, ``hidden_act``, LayerNorm, the
  decoder tied to the embeddings with a bias: zoo's mlm head with its transform to ``embedding.dim``
  and its GELU as the FFN's (``head.approximate``: gelu_new is tanh).

Refused by name: ``inner_group_num`` other than 1 (several layers per group, which zoo's share
pattern does not express), a ``hidden_act`` that is not a GELU (the head applies it, and zoo's head
has GELU only), and ``hidden_dropout_prob`` other than 0 (ALBERT drops the embeddings and the
attention's output but not the FFN's, where zoo's ``dropout.residual`` drops both; the v2 releases
train without dropout).

``AlbertForSequenceClassification`` <-> ``head: none`` with a ``classifier``
(:mod:`zoo.interop.hf.classification`): the backbone's pooler (dense, tanh), dropout
(``classifier_dropout_prob``), the linear ``classifier``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from zoo.interop.claims import ANY, one_of
from zoo.interop.common import Rule, unsupported
from zoo.interop.hf.base import require, fused, weights
from zoo.interop.hf.classification import dropout, fixed_pooler, sequence_classifier
from zoo.interop.hf.bert import BERT, Bert, bert_embeddings
from zoo.interop.hf.electra import factorised
from zoo.interop.hf.table import Derived, Drop, Refuse, table
from zoo.interop.hf.traits import who
from zoo.spec import FamilySpec

__all__ = ["Albert", "AlbertClassifier"]

_GELUS = {"gelu": "none", "gelu_python": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def _ffn(c: Any, where: str) -> dict:
    if c.hidden_act not in _GELUS:
        raise unsupported(where, "hidden_act", c.hidden_act,
                          f"ALBERT's masked-LM head applies hidden_act too, and zoo's head has GELU only: one of "
                          f"{', '.join(_GELUS)}")
    approximate = _GELUS[c.hidden_act]
    return {"block.ffn": {"kind": "gelu", "approximate": approximate, "hidden": c.intermediate_size},
            "head.approximate": approximate}


def _write_ffn(s: FamilySpec, where: str) -> dict:
    ffn = s.block.ffn
    require(ffn.kind == "gelu", where, "block.ffn.kind", ffn.kind,
            f"{who(where)}'s hidden_act is one activation for the FFN and the masked-LM head, a GELU in zoo")
    if s.head.kind == "mlm":
        require(s.head.approximate == ffn.approximate, where, "head.approximate", s.head.approximate,
                f"{who(where)}'s hidden_act is one activation for the FFN and the head (block.ffn.approximate is "
                f"{ffn.approximate})")
    return {"intermediate_size": ffn.hidden_size(s.d_model), "hidden_act": "gelu" if ffn.approximate == "none" else "gelu_new"}


def _groups(c: Any, where: str) -> dict:
    if getattr(c, "inner_group_num", 1) != 1:
        raise unsupported(where, "inner_group_num", c.inner_group_num,
                          "zoo's shared layers run one block per group (inner_group_num 1, as the releases)")
    g, n = c.num_hidden_groups, c.num_hidden_layers
    require(1 <= g <= n, where, "num_hidden_groups", g, f"between 1 and num_hidden_layers ({n})")
    return {} if g == n else {"shared_layers": g}


def _write_groups(s: FamilySpec, where: str) -> dict:
    return {"num_hidden_groups": s.shared_layers or s.n_layers, "inner_group_num": 1}


def _group(s: FamilySpec, i: int) -> int:
    """The group whose weights layer ``i`` runs (HF's formula)."""
    g = s.shared_layers or s.n_layers
    return int(i / (s.n_layers / g))


class Albert(Bert):
    name = "AlbertForMaskedLM"
    config_name = "AlbertConfig"
    model_type = "albert"
    base = "AlbertModel"
    prefix = "albert"
    base_pooler = "pooler"
    tie = ("predictions.decoder", "albert.embeddings.word_embeddings")
    # BERT's, with factorised embeddings, shared layers, the head's activation and no residual dropout
    table = table(
        BERT, Drop("check:block.ffn.kind:"), Drop("dropout"),
        Derived("ffn", _ffn, _write_ffn, {"block.ffn.kind": one_of("gelu"), "block.ffn.approximate": ANY,
                                          "block.ffn.hidden": ANY, "head.approximate": ANY}),
        factorised(always=True), Derived("groups", _groups, _write_groups, {"shared_layers": ANY}),
        Refuse("hidden_dropout_prob", 0.0, "ALBERT drops the attention's output but not the FFN's, where zoo's "
               "dropout.residual drops both; zoo converts it without dropout (as the v2 releases train)"),
    )

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        p = f"{cls.prefix}.encoder"
        rules = [*bert_embeddings(cls.prefix), *weights("emb_proj", f"{p}.embedding_hidden_mapping_in")]
        for i in range(s.n_layers):  # a shared group's tensors for each layer that runs it
            z, h = f"stack.blocks.{i}", f"{p}.albert_layer_groups.{_group(s, i)}.albert_layers.0"
            rules += [
                *fused(f"{z}.attn.qkv", [f"{h}.attention.{n}" for n in ("query", "key", "value")], bias=True),
                *weights(f"{z}.attn.out", f"{h}.attention.dense"), *weights(f"{z}.attn_norm", f"{h}.attention.LayerNorm"),
                *weights(f"{z}.ffn.fc1", f"{h}.ffn"), *weights(f"{z}.ffn.fc2", f"{h}.ffn_output"),
                *weights(f"{z}.ffn_norm", f"{h}.full_layer_layer_norm"),
            ]
        if getattr(s, "pooler", False):
            rules += weights("pooler.dense", f"{cls.prefix}.pooler")
        if s.head.kind != "mlm":
            return rules
        return rules + [*weights("head.transform.0", "predictions.dense"), *weights("head.transform.2", "predictions.LayerNorm"),
                        *weights("head.proj", "predictions.decoder")]

    @classmethod
    def check_from(cls, hf: nn.Module, s: FamilySpec, ref: Mapping[str, Tensor]) -> list[str]:
        # HF ties predictions.bias to predictions.decoder.bias, which the forward pass reads
        return ["predictions.bias"] if s.head.kind == "mlm" else []

    @classmethod
    def extra_to(cls, state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        return {"predictions.bias": state["head.proj.bias"].detach()} if s.head.kind == "mlm" else {}


# the backbone's pooler (dense, tanh), dropout, the labels' linear
AlbertClassifier = sequence_classifier(Albert, "AlbertForSequenceClassification", fixed_pooler("tanh"),
                                       dropout("classifier_dropout_prob", fallback=None), dense="albert.pooler")
