"""HF's ``*ForSequenceClassification`` classes: a backbone converted as its masked-LM class's (the same
spec, config and tensors but the LM head's, as :class:`~zoo.interop.hf.base.Headless`) with a
classification head, zoo's ``classifier`` (:class:`~zoo.spec.ClassifierSpec`) beside ``head: none``.

Each encoder's module makes its class with :func:`sequence_classifier`: its masked-LM converter, the
HF class's name, where the head's tensors live (the pooler's dense layer, its norm, the linear to the
labels) and the table entries of what the head reads from the config: its dropout rates
(:func:`dropout`), its activation (fixed, or :func:`activation`). Every one of them shares
:func:`labels`: ``id2label`` <-> ``classifier.num_labels`` and ``classifier.labels`` (null where HF's
default names), ``label2id`` <-> ``classifier.label_ids`` (null where it is their inverse; a config
without one is written with the inverse), ``problem_type`` <-> ``classifier.problem_type``."""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.interop.claims import ANY, one_of
from zoo.interop.common import Rule, unsupported
from zoo.interop.hf.base import Architecture, require, weights
from zoo.interop.hf.table import Derived, Drop, Entry, Fixed, apply_read, table, table_claims
from zoo.interop.hf.traits import who
from zoo.spec import FamilySpec, LMHeadSpec

__all__ = ["HF_ACTIVATIONS", "SequenceClassifier", "activation", "dropout", "fixed_pooler", "labels", "sequence_classifier"]

# HF's activation names <-> ClassifierSpec.activation
HF_ACTIVATIONS = {"tanh": "tanh", "gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh", "relu": "relu", "silu": "silu",
                  "swish": "silu"}
_WRITTEN = {"tanh": "tanh", "gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def _read_labels(c: Any, where: str) -> dict:
    id2label = {int(k): v for k, v in (c.id2label or {0: "LABEL_0", 1: "LABEL_1"}).items()}
    n = len(id2label)
    require(sorted(id2label) == list(range(n)), where, "id2label", id2label,
            f"the labels' ids are 0 to num_labels - 1 ({n} labels)")
    names = [str(id2label[i]) for i in range(n)]
    ids = None if c.label2id is None else {str(k): int(v) for k, v in c.label2id.items()}
    return {"classifier.num_labels": n, "classifier.labels": None if names == [f"LABEL_{i}" for i in range(n)] else names,
            "classifier.label_ids": None if ids == {name: i for i, name in enumerate(names)} else ids,
            "classifier.problem_type": c.problem_type}


def _write_labels(s: FamilySpec, where: str) -> dict:
    c = s.classifier
    return {"id2label": dict(enumerate(c.names())), "label2id": c.ids(), "problem_type": c.problem_type}


def labels() -> Derived:
    """``id2label``, ``label2id`` and ``problem_type`` <-> the classifier's labels (every such class's)."""
    return Derived("labels", _read_labels, _write_labels,
                   {"classifier.num_labels": ANY, "classifier.labels": ANY, "classifier.label_ids": ANY,
                    "classifier.problem_type": ANY})


def dropout(field: str | None, *, fallback: str | None = "hidden_dropout_prob", pooler: bool = False) -> Derived:
    """The head's dropout rate: the config's ``field``, or where it is null (or there is no ``field``)
    ``fallback``, the blocks' rate (``dropout.residual``); written as null where it is that rate. With
    ``pooler`` the head drops the first token at the same rate before its dense layer (RoBERTa's
    head: ``classifier.pooler_dropout`` equal to ``classifier.dropout``)."""

    def read(c: Any, where: str) -> dict:
        rate = getattr(c, field, None) if field else None
        rate = getattr(c, fallback) if rate is None and fallback else rate
        return {"classifier.dropout": rate, **({"classifier.pooler_dropout": rate} if pooler else {})}

    def write(s: FamilySpec, where: str) -> dict:
        c = s.classifier
        if pooler:
            require(c.pooler_dropout == c.dropout, where, "classifier.pooler_dropout", c.pooler_dropout,
                    f"{who(where)}'s head drops the first token and the pooled vector at one rate (classifier.dropout "
                    f"is {c.dropout})")
        if fallback and c.dropout == s.dropout.residual:
            return {}  # HF's null: the blocks' rate
        require(field is not None, where, "classifier.dropout", c.dropout,
                f"{who(where)}'s head drops at {fallback}, the blocks' rate (dropout.residual: {s.dropout.residual})")
        return {field: c.dropout}

    claims = {"classifier.dropout": ANY, **({"classifier.pooler_dropout": ANY} if pooler else {})}
    return Derived(f"classifier.dropout:{field}", read, write, claims)


def activation(field: str) -> Derived:
    """The pooler's activation, named by the config's ``field`` (DeBERTa's ``pooler_hidden_act``)."""

    def read(c: Any, where: str) -> dict:
        name = getattr(c, field)
        if name not in HF_ACTIVATIONS:
            raise unsupported(where, field, name, f"zoo's classifier activations are {', '.join(sorted(HF_ACTIVATIONS))}")
        return {"classifier.activation": HF_ACTIVATIONS[name]}

    return Derived(f"classifier.activation:{field}", read, lambda s, where: {field: _WRITTEN[s.classifier.activation]},
                   {"classifier.activation": ANY})


class SequenceClassifier(Architecture):
    """HF's ``*ForSequenceClassification`` for the masked-LM converter ``lm``: its backbone (the
    tensors under ``prefix``) and the head's tensors ``dense`` (the pooler's linear), ``norm`` (its
    norm, ModernBERT's) and ``out`` (the linear to the labels). Made by :func:`sequence_classifier`,
    which subclasses ``lm`` with this class first."""

    lm: ClassVar[type[Architecture]]
    dense: ClassVar[str | None] = None
    norm: ClassVar[str | None] = None
    out: ClassVar[str] = "classifier"

    @classmethod
    def check_claims(cls, s: FamilySpec, where: str) -> None:
        require(getattr(s, "classifier", None) is not None, where, "classifier", None,
                f"{cls.name} classifies; set classifier (num_labels, ...), or convert to {cls.lm.base or cls.lm.name}")
        super().check_claims(s, where)

    @classmethod
    def spec(cls, c: Any, hf: Any) -> dict:
        s = apply_read(cls.table, c, f"{cls.name} -> zoo")
        s["head"] = {"kind": "none"}  # the masked-LM table's head fields unread
        return s

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        c = super().config(s.model_copy(update={"head": LMHeadSpec(tied=False)}), given)  # the LM head's fields unread
        c.pop("tie_word_embeddings", None)
        return c

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        c = s.classifier
        rules = super().rules(s)  # the backbone's: head none, no pooler of its own
        if c.pooler:
            rules += weights("classifier.pooler.0", cls.dense, bias=c.pooler_bias)
        if c.norm:
            rules += weights("classifier.pooler.2", cls.norm, bias=s.block.norm.bias)
        return rules + weights("classifier.out", cls.out)


def sequence_classifier(lm: type[Architecture], name: str, *entries: Entry | Drop | tuple, dense: str | None,
                        out: str = "classifier", norm: str | None = None) -> type[Architecture]:
    """The converter of HF's class ``name``: ``lm``'s table and claims (but the LM head's) with
    :func:`labels` and the head's ``entries`` (its dropout, its activation, ...; a
    :class:`~zoo.interop.hf.table.Drop` removes an entry of ``lm``'s that the head reads otherwise);
    the tensors as :class:`SequenceClassifier` says."""
    claims = {p: claim for p, claim in lm.claims.items() if p.split(".")[0] != "head"}
    claims |= table_claims(table(labels(), *entries)) | {"head.kind": one_of("none")}
    attrs = {"name": name, "lm": lm, "base": None, "table": table(lm.table, labels(), *entries), "claims": claims,
             "dense": dense, "out": out, "norm": norm, "__module__": lm.__module__,
             "__doc__": f"{name}: {lm.name}'s backbone with a classifier (:class:`SequenceClassifier`)."}
    return type(name.replace("ForSequenceClassification", "Classifier"), (SequenceClassifier, lm), attrs)


def fixed_pooler(act: str) -> tuple:
    """A head whose pooler is always there with the activation ``act`` (BERT's tanh)."""
    return (Fixed("classifier.pooler", True, why="a dense layer and activation before the labels' linear (pooler: true)"),
            Fixed("classifier.activation", act, why=f"its pooler's activation, {act}"))
