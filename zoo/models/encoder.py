"""BERT-style bidirectional encoder with a masked-LM head and an optional classification head.

    tokens [B, T] -> embed (+ positions, + segments) [-> norm] -> blocks -> head -> logits [B, T, V]

Without a head (``head: none``) the model returns the hidden states [B, T, D] (HF's ``BertModel``
without its pooler). With ``pooler: true`` it also holds BERT's pooler, a linear layer and tanh on
the first token (``model.pool(...)`` -> [B, D], HF's ``pooler_output``).

A text tower (CLIP's, SigLIP's) pools otherwise: ``pool`` picks the token (``eos``: the
end-of-text token's hidden state, ``last``: the last slot's; or cls, mean) and ``projection`` maps
it (``model.pool(...)`` -> [B, projection.dim], HF's ``text_embeds`` or ``pooler_output``); with
``causal: true`` each token attends only to itself and the tokens before it (CLIP's causal mask).

Why the pooler is a spec field of its own and not the classifier's: HF's ``BertModel`` ships it
without any classifier (sentence-embedding and retrieval checkpoints keep the pre-training weights),
so a zoo model of such a checkpoint has a pooler and no labels to classify into; a ``classifier``
with ``num_labels`` would invent a layer the checkpoint lacks. The classifier keeps its own pooler
(``classifier.pooler``), which fine-tuning recipes train with the classifier; the state-dict names
differ (``pooler.dense.*`` here, HF's names; ``classifier.pooler.0.*`` there). The classifier
(:mod:`zoo.components.classifier`) is what HF's ``*ForSequenceClassification`` heads compute: BERT's
pooler and ALBERT's, RoBERTa's and ELECTRA's head, DeBERTa's ContextPooler, DistilBERT's, ModernBERT's.

Shapes: B batch, T tokens, D model width, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.components import parts
from zoo.components.classifier import Classifier
from zoo.components.dropout import Dropout
from zoo.components.linear import Linear
from zoo.models.common import (
    build_part,
    build_position,
    build_stack,
    check_mask,
    check_tokens,
    embedding_projection,
    init_weights,
    token_embedding,
)
from zoo.models.family import Family
from zoo.protocols import SummaryPart
from zoo.registry import register
from zoo.spec import EncoderSpec


class Pooler(nn.Module, SummaryPart):
    """BERT's pooler: the first token's hidden state -> linear -> tanh. [B, T, D] -> [B, D]."""

    summary_part = "head"

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dense = Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.dense(x[:, 0]))


class Encoder(Family):
    """``model(tokens[B,T], padding_mask=None, token_types=None) -> logits[B,T,V]`` (masked LM);
    ``model.classify(tokens, padding_mask=None, token_types=None) -> logits[B, num_labels]`` when the
    spec has a ``classifier``; ``model.pool(tokens, padding_mask=None, token_types=None) -> [B, D]`` when
    it has a ``pooler``. ``padding_mask`` is True for real tokens."""

    is_causal = False

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.tok_emb = token_embedding(spec, spec.vocab_size)
        self.type_emb = nn.Embedding(spec.type_vocab_size, spec.embedding_dim) if spec.type_vocab_size else None
        self.position = build_position(spec, max_len=spec.max_seq_len)
        self.emb_norm = build_part("norm", spec.block.norm, dim=spec.embedding_dim) if spec.embedding.norm else nn.Identity()
        self.drop = Dropout(spec.dropout.embedding)
        self.emb_proj = embedding_projection(spec)  # factorised embeddings (embedding.dim) -> d_model
        self.stack = build_stack(spec, max_len=spec.max_seq_len)
        self.head = build_part("head", spec.head, dim=d, vocab_size=spec.vocab_size, norm=spec.block.norm,
                               embedding=self.tok_emb, embedding_dim=spec.embedding_dim)
        self.pooler = Pooler(d) if spec.pooler else None
        self.pooling = build_part("pool", spec.pool, dim=d, block=spec.block) if spec.pool is not None else None
        p = spec.projection
        self.projection = Linear(d, p.dim, bias=p.bias) if p is not None else None
        c = spec.classifier
        self.classifier = Classifier(c, d, spec.block.norm) if c else None
        init_weights(self, spec)

    def encode(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None, *,
               documents: Tensor | None = None) -> Tensor:
        """Hidden states [B, T, D] after the last block (and final norm). ``documents`` ([B, T] ids):
        a packed row, each token attending within its own document (positions restart per document)."""
        check_tokens(tokens, "tokens", vocab_size=self.spec.vocab_size)
        padding_mask = check_mask(padding_mask, tokens, "padding_mask")
        ctx = self.stack.context(self.position, tokens, padding_mask, causal=self.spec.causal, documents=documents)
        x = self.position.add(self.tok_emb(tokens), self.position.added_positions(ctx.positions, padding_mask, tokens))
        if self.type_emb is not None:
            if token_types is None:
                token_types = tokens.new_zeros(tokens.shape)
            check_tokens(token_types, "token_types", vocab_size=self.spec.type_vocab_size)
            if token_types.shape != tokens.shape:
                raise ValueError(f"token_types: shape {tuple(token_types.shape)} does not fit tokens {tuple(tokens.shape)}; "
                                 f"give one segment id per token")
            x = x + self.type_emb(token_types)
        elif token_types is not None:
            raise ValueError("token_types: this encoder has no segment embeddings (type_vocab_size: 0)")
        x = self.emb_proj(self.drop(self.emb_norm(x)))  # (B, T, D)
        return self.stack(x, ctx)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None, *,
                documents: Tensor | None = None, targets: Tensor | None = None, label_smoothing: float = 0.0,
                reduction: str = "sum", return_nll: bool = False) -> Tensor:
        """Logits [B, T, V]; with ``targets`` ([B, T] ids of the masked tokens, -100 elsewhere) their
        cross-entropy instead, summed or ``reduction="mean"`` over the targets, computed by the head
        without the logits (:meth:`Family.head_out`; ``return_nll``: with the unsmoothed NLL beside it)."""
        x = self.encode(tokens, padding_mask, token_types, documents=documents)
        return self.head_out(x, targets, label_smoothing=label_smoothing, reduction=reduction, return_nll=return_nll)

    def classify(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None) -> Tensor:
        if self.classifier is None:
            raise ValueError("classify: this encoder has no classification head; set classifier: {num_labels: N} in its spec")
        return self.classifier(self.encode(tokens, padding_mask, token_types), padding_mask)

    def hidden_states_refused(self) -> str | None:
        return None

    def hidden_states(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return self.encode(tokens, padding_mask)

    def pool(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None) -> Tensor:
        """The pooled output: BERT's, tanh(linear(first token's hidden state)) [B, D]; or the spec's
        ``pool`` of the hidden states, through its ``projection`` where it has one [B, projection.dim]."""
        if self.pooler is None and self.pooling is None:
            raise ValueError("pool: this encoder has no pooled output; set pool (eos, last, cls or mean) or pooler: true "
                             "in its spec")
        x = self.encode(tokens, padding_mask, token_types)
        if self.pooler is not None:
            return self.pooler(x)
        mask = None if padding_mask is None else padding_mask.bool()
        y = self.pooling(x, 0, tokens=tokens, padding_mask=mask)  # (B, D)
        return y if self.projection is None else self.projection(y)

    def flops(self, seq: int) -> int:
        """The family's FLOPs, and the pooled output's projection and the classifier (once a sample each)."""
        return super().flops(seq) + parts.flops(self.projection, 1) + parts.flops(self.classifier, 1)


@register("family", "encoder")
def _build(spec: EncoderSpec) -> Encoder:
    return Encoder(spec)
