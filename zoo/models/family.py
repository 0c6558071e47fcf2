"""What a model family declares about itself, so summaries and memory plans never switch on family
names: its stacks, its FLOPs, the activations a training step keeps, its KV cache, and which
parameters are embeddings, attention, FFN, norms or head.

Every built-in family subclasses :class:`Family`; a family a user registers does too and gets
working defaults (its ``Stack`` attributes, a per-token count, a head's logits), overriding what it
does differently. Conventions are those of :mod:`zoo.summary`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from zoo.components import parts
from zoo.components.stack import Stack
from zoo.protocols import Generates, ModelCosts, SummaryPart, SummaryParts, VocabularyLoss

__all__ = ["Family"]


class Family(nn.Module, SummaryParts, ModelCosts, Generates):
    """The base of a model family's module. ``spec`` is set by the builder (``zoo.build``)."""

    is_causal: ClassVar[bool] = False  # position t sees tokens <= t only (and decodes with a KV cache)
    decodes_from: ClassVar[str | None] = None  # how zoo.generate feeds it: "prompt", "source" or not at all
    unit: ClassVar[str] = "token"  # costs per token of a sequence, or per "image"
    summary_parts: ClassVar[dict[str, str]] = {}  # top-level attributes' parts, beyond what modules declare

    def sequence(self, seq: int) -> int:
        """The tokens one sample has when a sequence is ``seq`` long (a ViT: fixed by its image)."""
        return seq

    def example_inputs(self, batch: int, seq: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """Random inputs of a ``batch`` of ``seq``-token samples, in the order ``forward`` takes them
        (what ``zoo kernels --measure`` runs a step on): token ids by default."""
        return (torch.randint(0, self.spec.vocab_size, (batch, seq), generator=generator),)

    def stacks(self, seq: int) -> list[tuple[Stack, int, int | None]]:
        """(stack, its tokens, its memory tokens or None) for one sample of ``seq`` tokens."""
        return [(m, seq, None) for m in self.children() if isinstance(m, Stack)]

    def flops(self, seq: int) -> int:
        """Forward FLOPs of one sample: the stacks, the head over every token, and factorised
        embeddings' projection (``emb_proj``) where there is one."""
        total = sum(stack.flops(tokens, memory) for stack, tokens, memory in self.stacks(seq))
        return total + parts.flops(getattr(self, "head", None), seq) + parts.flops(_projection(self), seq)

    def saved(self, seq: int) -> tuple[int, int]:
        """(elements, dropout-mask bytes) one sample keeps for the backward pass: the embedding's
        (:meth:`embedding_saved`), the stacks', and the head's input and outputs for every token."""
        rotates = getattr(getattr(self, "position", None), "rotates", False)
        elements, masks = self.embedding_saved(seq)
        for stack, tokens, memory in self.stacks(seq):
            e, m = stack.saved(tokens, memory, rotates=rotates)
            elements, masks = elements + e, masks + m
        return elements + seq * parts.saved_per_token(getattr(self, "head", nn.Identity())), masks

    def hidden_states_refused(self) -> str | None:
        """Why this model has no token hidden states for :func:`zoo.embed` to pool, or None."""
        return (f"a {self.spec.family} model has no token hidden states to pool; embeddings come from an encoder "
                f"or a decoder with head: none")

    def hidden_states(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Each token's hidden state after the last block (and final norm) [B, T, D]: what
        :func:`zoo.embed` pools. A family without them raises :meth:`hidden_states_refused`."""
        raise ValueError(f"hidden_states: {self.hidden_states_refused()}")

    def head_out(self, x: Tensor, targets: Tensor | None = None, *, label_smoothing: float = 0.0,
                 reduction: str = "sum", return_nll: bool = False):
        """The head on hidden states ``x`` [B, T, D]: its logits, or with ``targets`` ([B, T] class ids,
        -100 where none) their cross-entropy, summed or ``reduction="mean"`` over the targets, from the
        head's ``loss`` (zoo.kernels.linear_cross_entropy: chunk by chunk, never the [B, T, V] logits).
        ``return_nll``: (that loss, the unsmoothed NLL of the same logits, without gradient). A family's
        ``forward(..., targets=...)`` returns this loss instead of the logits."""
        if targets is None:
            return self.head(x)
        if not isinstance(self.head, VocabularyLoss):
            raise ValueError(f"targets: this model's head ({type(self.head).__name__}) has no vocabulary projection whose "
                             "cross-entropy it computes; pass no targets and score its output yourself")
        return self.head.loss(x, targets, label_smoothing=label_smoothing, reduction=reduction, return_nll=return_nll)

    def embedding_saved(self, tokens: int) -> tuple[int, int]:
        """(elements, mask bytes) of one embedding pass over ``tokens`` tokens: an ``emb_norm``'s
        input (and what it keeps), the embedding dropout's mask, a factorised embedding's projection
        input (all ``embedding.dim`` wide there)."""
        d = getattr(self.spec, "embedding_dim", self.spec.d_model)
        norm = getattr(self, "emb_norm", None)
        elements = tokens * (d + parts.norm_saved(norm)) if parts.has_parameters(norm) else 0
        elements += tokens * d if _projection(self) is not None else 0
        return elements, tokens * d if self.spec.dropout.embedding else 0

    def kv_cache(self) -> tuple[Stack, bool] | None:
        """The stack whose keys and values decoding caches, and whether it has cross-attention;
        None for a model that does not decode."""
        if not self.is_causal:
            return None
        found = self.stacks(1)
        return (found[-1][0], len(found) > 1) if found else None

    def parameter_part(self, name: str) -> str:
        """Which part (embeddings, attention, ffn, norms, head) the parameter ``name`` belongs to:
        walking its path, the first module that declares one decides (``summary_part`` for itself,
        ``summary_parts`` for a child); else a norm or embedding by its torch class; else head."""
        path = name.split(".")
        node: nn.Module = self
        for attr in path[:-1]:
            declared = node.summary_parts if isinstance(node, SummaryParts) else {}
            if attr in declared or "*" in declared:
                child = getattr(node, attr)
                return child.summary_part if isinstance(child, SummaryPart) else declared.get(attr, declared.get("*"))
            node = getattr(node, attr)
            if isinstance(node, SummaryPart):
                return node.summary_part
        if len(path) == 1:
            return self.summary_parts.get(path[0], "embeddings")  # a bare parameter: the class token
        if isinstance(node, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)):
            return "norms"
        if isinstance(node, nn.Embedding):
            return "embeddings"
        return "head"


def _projection(model: nn.Module) -> nn.Module | None:
    """The model's factorised-embedding projection (``emb_proj``), or None."""
    proj = getattr(model, "emb_proj", None)
    return proj if isinstance(proj, nn.Linear) else None
