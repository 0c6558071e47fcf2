"""An encoder's sequence classifier (``classifier:``, ``model.classify``): what HF's
``*ForSequenceClassification`` heads compute, one spec for all of them.

    hidden states [B, T, D] -> pool (first token, or the mean of the real tokens)
        [-> dropout (pooler_dropout) -> linear -> activation [-> norm]]   (pooler: true)
        -> dropout -> linear -> logits [B, num_labels]

BERT's and ALBERT's pooler is linear and tanh; RoBERTa's and MPNet's head drops the first token before
its dense layer too (``pooler_dropout``); ELECTRA's and DeBERTa's activation is GELU, DistilBERT's
ReLU; ModernBERT's normalises the pooled vector (``norm``, the blocks' kind), may leave out the
dense layer's bias (``pooler_bias``) and may pool the mean.
The labels' names (HF's ``id2label``), their ids where they are not the names' positions
(``label2id``) and the loss a trainer takes (``problem_type``) travel with the spec: they change no
logit, and an exported config states them as the checkpoint did."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from zoo.spec.base import Rate, Spec

__all__ = ["ClassifierSpec"]


class ClassifierSpec(Spec):
    """Sequence classification: pool the first token (or the mean), optionally through a ``pooler``
    (linear, ``activation``, optional ``norm``), dropout, linear to ``num_labels``."""

    num_labels: PositiveInt = 2
    pooler: bool = True
    dropout: Rate = 0.1
    activation: Literal["tanh", "gelu", "gelu_tanh", "relu", "silu"] = Field(
        "tanh", description="the pooler's activation: tanh (BERT, RoBERTa, ALBERT, MPNet), gelu (exact: ELECTRA, "
        "DeBERTa), gelu_tanh (its tanh approximation), relu (DistilBERT), silu")
    norm: bool = Field(False, description="a norm of the blocks' kind after the pooler's activation (ModernBERT)")
    pool: Literal["cls", "mean"] = Field("cls", description="what is classified: the first token's hidden state (cls) "
                                         "or the mean of the real tokens' (mean: ModernBERT's classifier_pooling)")
    pooler_dropout: Rate = Field(0.0, description="dropout on the pooled vector before the pooler's linear (RoBERTa, "
                                 "ELECTRA, MPNet: their classifier dropout; DeBERTa's pooler_dropout)")
    pooler_bias: bool = Field(True, description="a bias on the pooler's linear (ModernBERT's classifier_bias)")
    labels: list[str] | None = Field(None, description="the labels' names in id order (HF's id2label); null: "
                                     "LABEL_0, LABEL_1, ...")
    label_ids: dict[str, int] | None = Field(None, description="name -> id where it is not the labels' order (HF's "
                                             "label2id as a checkpoint states it); null: the inverse of labels")
    problem_type: Literal["regression", "single_label_classification", "multi_label_classification"] | None = Field(
        None, description="the loss a trainer takes (HF's problem_type); null: from the labels (HF's default)")

    @model_validator(mode="after")
    def _check(self) -> ClassifierSpec:
        problems = []
        if self.labels is not None and len(self.labels) != self.num_labels:
            problems.append(f"classifier.labels: {len(self.labels)} names for num_labels {self.num_labels}; give one "
                            f"name per label or leave labels null")
        if self.problem_type == "single_label_classification" and self.num_labels == 1:
            problems.append("classifier.problem_type: single_label_classification needs num_labels >= 2; use "
                            "regression for one output")
        if not self.pooler:
            changed = [f for f, default in (("activation", "tanh"), ("norm", False), ("pooler_dropout", 0.0),
                                                                     ("pooler_bias", True))
                       if getattr(self, f) != default]
            if changed:
                problems.append(f"classifier.{changed[0]}: belongs to the pooler, and pooler is false; set pooler: true "
                                f"or leave {changed[0]} at its default")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def names(self) -> list[str]:
        """The labels' names in id order (HF's default LABEL_i where ``labels`` is null)."""
        return list(self.labels) if self.labels is not None else [f"LABEL_{i}" for i in range(self.num_labels)]

    def ids(self) -> dict[str, int]:
        """Name -> id: ``label_ids``, else the inverse of :meth:`names`."""
        return dict(self.label_ids) if self.label_ids is not None else {n: i for i, n in enumerate(self.names())}
