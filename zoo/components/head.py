"""Heads: what a model puts after its last block, registered in the ``head`` registry.

    lm      a linear projection of each token to the vocabulary (GPT-2, LLaMA, the paper), its
            logits multiplied by ``scale`` (Cohere), divided by ``divisor`` (Granite), soft-capped
            with ``softcap`` (Gemma 2)
    mlm     BERT's masked-LM head: [linear -> GELU -> norm ->] projection to the vocabulary (the
            linear maps to the embeddings' width where they are factorised: ALBERT, ELECTRA)
    linear  a ViT's classifier of its pooled tokens
    none    no head (an identity): the model returns its hidden states, or a ViT its pooled features

A builder receives ``dim``, ``vocab_size``, ``norm`` (the block's norm spec, for a head that
normalises), ``embedding`` (the token embedding, which a ``tied`` projection shares) and
``embedding_dim`` (its width: ``embedding.dim`` where the embeddings are factorised). The heads
keep the state-dict names zoo has always used (``head.weight``; ``head.transform.*`` and
``head.proj.*``), and declare their FLOPs and saved activations like the blocks' parts.

A head that projects to the vocabulary (``lm``, ``mlm``) also has ``loss(x, targets, ...)``: the
cross-entropy of its logits computed by :func:`zoo.kernels.linear_cross_entropy`, chunk by chunk,
without the [B, T, V] logits (what a family's ``forward(..., targets=...)`` returns).

Shapes: B batch, T tokens, D model width, V vocabulary, C classes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.components.linear import Linear
from zoo.kernels.loss import linear_cross_entropy
from zoo.protocols import SavesPerToken, SummaryPart, VocabularyLoss
from zoo.registry import register, registry

__all__ = ["ClassifierHead", "LMHead", "MLMHead"]


class LMHead(Linear, SummaryPart, VocabularyLoss, SavesPerToken):
    """[..., D] -> [..., V] logits; with ``input_scale``, of the input times that number (T5 v1.0's
    d_model^-0.5); then times ``logit_scale`` (Cohere), divided by ``logit_divisor`` (Granite), and
    with ``softcap``, ``softcap * tanh(logits / softcap)``."""

    summary_part = "head"

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, softcap: float | None = None,
                 input_scale: float | None = None, logit_scale: float | None = None,
                 logit_divisor: float | None = None) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.softcap, self.input_scale = softcap, input_scale
        self.logit_scale, self.logit_divisor = logit_scale, logit_divisor

    def forward(self, x: Tensor) -> Tensor:
        if self.input_scale is not None:
            x = x * self.input_scale
        logits = super().forward(x)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        if self.logit_divisor is not None:
            logits = logits / self.logit_divisor
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap

    def _logit_factor(self) -> float | None:
        """What the loss multiplies the projection's logits by (``logit_scale`` / ``logit_divisor``)."""
        if self.logit_scale is None and self.logit_divisor is None:
            return None
        return (self.logit_scale or 1.0) / (self.logit_divisor or 1.0)

    def loss(self, x: Tensor, targets: Tensor, *, label_smoothing: float = 0.0, reduction: str = "sum",
             ignore_index: int = -100, chunk_rows: int | None = None,
             return_nll: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``F.cross_entropy(self(x).float(), targets, ...)`` for x [..., D] and targets [...], without
        the logits (:func:`zoo.kernels.linear_cross_entropy`): summed, or ``reduction="mean"`` over the
        targets that are not ``ignore_index``; ``return_nll``: (loss, its unsmoothed NLL without gradient)."""
        return linear_cross_entropy(x, self.weight, targets, self.bias, ignore_index=ignore_index,
                                    label_smoothing=label_smoothing, reduction=reduction, softcap=self.softcap,
                                    scale=self.input_scale, logit_scale=self._logit_factor(), chunk_rows=chunk_rows,
                                    return_nll=return_nll)

    def saved_per_token(self) -> int:
        """The input and the logits the loss reads (with a cap, the tanh's output too)."""
        return self.in_features + self.out_features * (1 if self.softcap is None else 2)

    def extra_repr(self) -> str:
        return (super().extra_repr() + ("" if self.softcap is None else f", softcap={self.softcap}")
                + ("" if self.input_scale is None else f", input_scale={self.input_scale:.6g}")
                + ("" if self.logit_scale is None else f", logit_scale={self.logit_scale}")
                + ("" if self.logit_divisor is None else f", logit_divisor={self.logit_divisor}"))


class ClassifierHead(LMHead):
    """[B, D] pooled tokens -> [B, C] logits."""


class MLMHead(nn.Module, SummaryPart, VocabularyLoss, SavesPerToken):
    """[transform: linear -> GELU -> norm ->] projection to the vocabulary (+ bias). The transform maps
    ``dim`` to ``out_dim`` (default ``dim``; factorised embeddings' width), which ``norm`` normalises."""

    summary_part = "head"

    def __init__(self, dim: int, vocab_size: int, *, transform: bool, norm: nn.Module | None, bias: bool,
                 transform_bias: bool = True, out_dim: int | None = None, approximate: str = "none") -> None:
        super().__init__()
        out_dim = out_dim or dim
        if transform:
            self.transform = nn.Sequential(Linear(dim, out_dim, bias=transform_bias), nn.GELU(approximate=approximate), norm)
        else:
            self.transform = nn.Identity()
        self.proj = Linear(out_dim if transform else dim, vocab_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.transform(x))

    def loss(self, x: Tensor, targets: Tensor, *, label_smoothing: float = 0.0, reduction: str = "sum",
             ignore_index: int = -100, chunk_rows: int | None = None,
             return_nll: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """The transform, then the projection's cross-entropy without its logits (as :meth:`LMHead.loss`)."""
        return linear_cross_entropy(self.transform(x), self.proj.weight, targets, self.proj.bias,
                                    ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction,
                                    chunk_rows=chunk_rows, return_nll=return_nll)

    def saved_per_token(self) -> int:
        """The input, and with the transform its linear's output, GELU's output and the norm's
        input (and what the norm keeps); then the logits."""
        d = self.proj.in_features
        kept = d
        if isinstance(self.transform, nn.Sequential):
            norm = self.transform[-1]
            kept = self.transform[0].in_features + 3 * d + (norm.saved_per_token() if isinstance(norm, SavesPerToken) else 0)
        return kept + self.proj.out_features


class NoHead(nn.Identity, SummaryPart, SavesPerToken):
    """The hidden states themselves."""

    summary_part = "head"

    def saved_per_token(self) -> int:
        return 0


def _tie(linear: nn.Linear, embedding: nn.Module | None, tied: bool) -> None:
    if tied:
        if embedding is None:
            raise ValueError("head.tied: this model has no token embedding to share; set head.tied: false")
        linear.weight = embedding.weight


@register("head", "none")
def _none(spec, **_) -> nn.Module:
    return NoHead()


@register("head", "lm")
def _lm(spec, *, dim: int, vocab_size: int, embedding: nn.Module | None = None, **_) -> nn.Module:
    head = LMHead(dim, vocab_size, bias=spec.bias, softcap=spec.softcap, input_scale=dim**-0.5 if spec.scale_input else None,
                  logit_scale=spec.scale, logit_divisor=spec.divisor)
    _tie(head, embedding, spec.tied)
    return head


@register("head", "mlm")
def _mlm(spec, *, dim: int, vocab_size: int, norm, embedding: nn.Module | None = None, embedding_dim: int | None = None,
         **_) -> nn.Module:
    out = embedding_dim or dim
    layer = registry("norm").builder(norm.kind)(norm, dim=out) if spec.transform else None
    head = MLMHead(dim, vocab_size, transform=spec.transform, norm=layer, bias=spec.bias, transform_bias=spec.transform_bias,
                   out_dim=out, approximate=spec.approximate)
    _tie(head.proj, embedding, spec.tied)
    return head


@register("head", "linear")
def _linear(spec, *, dim: int, **_) -> nn.Module:
    return ClassifierHead(dim, spec.num_classes)
