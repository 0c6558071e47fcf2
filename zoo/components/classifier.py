"""An encoder's sequence classifier (:class:`~zoo.spec.ClassifierSpec`, ``model.classify``).

    hidden states [B, T, D] -> first token, or the mean of the real tokens
        [-> dropout -> linear -> activation [-> norm]] -> dropout -> linear -> logits [B, num_labels]

The state-dict names: ``pooler.0`` (the pooler's linear), ``pooler.2`` (its norm, where it has one),
``out`` (the linear to the labels). A row whose first slot is padding is refused where the first
token is pooled: HF's reference classifies the padding token's state, computed with the token hidden
from itself, where zoo's lets a padding token attend to itself. Shapes: B batch, T tokens, D model width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.components.dropout import Dropout
from zoo.components.linear import Linear
from zoo.protocols import SummaryPart
from zoo.registry import registry

__all__ = ["ACTIVATIONS", "Classifier"]

ACTIVATIONS = {"tanh": nn.Tanh, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "relu": nn.ReLU,
               "silu": nn.SiLU}  # ClassifierSpec.activation -> its module


class Classifier(nn.Module, SummaryPart):
    """``spec`` (a ClassifierSpec) over ``dim``-wide hidden states; ``norm`` is the blocks' norm spec
    (the kind of the pooler's norm)."""

    summary_part = "head"

    def __init__(self, spec, dim: int, norm=None) -> None:
        super().__init__()
        self.mean = spec.pool == "mean"
        self.pre_drop = Dropout(spec.pooler_dropout)
        if spec.pooler:
            layers = [Linear(dim, dim, bias=spec.pooler_bias), ACTIVATIONS[spec.activation]()]
            if spec.norm:
                layers.append(registry("norm").builder(norm.kind)(norm, dim=dim))
            self.pooler = nn.Sequential(*layers)
        else:
            self.pooler = nn.Identity()
        self.drop = Dropout(spec.dropout)
        self.out = Linear(dim, spec.num_labels)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:  # (B, T, D) -> (B, num_labels)
        if not self.mean:
            if padding_mask is not None and not torch.compiler.is_compiling() and not bool(padding_mask[:, 0].all()):
                row = int((~padding_mask[:, 0].bool()).nonzero()[0])
                raise ValueError(f"padding_mask: the classifier pools the first token, a padding token in row {row}; "
                                 f"pad on the right (or set classifier.pool: mean)")
            pooled = x[:, 0]
        elif padding_mask is None:
            pooled = x.mean(1)
        else:
            m = padding_mask.to(x.dtype).unsqueeze(-1)
            pooled = (x * m).sum(1) / m.sum(1)
        return self.out(self.drop(self.pooler(self.pre_drop(pooled))))
