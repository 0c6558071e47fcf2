"""BERT-style bidirectional encoder with a masked-LM head and an optional classification head.

    tokens [B, T] -> embed (+ positions, + segments) [-> norm] -> blocks -> MLM head -> logits [B, T, V]
"""

from __future__ import annotations

from torch import Tensor, nn

from zoo.components.dropout import Dropout
from zoo.components.linear import Linear
from zoo.models.common import (
    build_part,
    build_position,
    build_stack,
    check_mask,
    check_tokens,
    init_weights,
    self_attention_inputs,
    token_embedding,
)
from zoo.registry import register
from zoo.spec import EncoderSpec


class MLMHead(nn.Module):
    """[transform: linear -> GELU -> norm ->] projection to the vocabulary (+ bias)."""

    def __init__(self, dim: int, vocab_size: int, *, transform: bool, norm: nn.Module | None, bias: bool) -> None:
        super().__init__()
        if transform:
            self.transform = nn.Sequential(Linear(dim, dim), nn.GELU(), norm)
        else:
            self.transform = nn.Identity()
        self.proj = Linear(dim, vocab_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.transform(x))


class Classifier(nn.Module):
    """First token [-> linear -> tanh (BERT's pooler)] -> dropout -> linear to the labels."""

    def __init__(self, dim: int, num_labels: int, *, pooler: bool, dropout: float) -> None:
        super().__init__()
        self.pooler = nn.Sequential(Linear(dim, dim), nn.Tanh()) if pooler else nn.Identity()
        self.drop = Dropout(dropout)
        self.out = Linear(dim, num_labels)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, num_labels)
        return self.out(self.drop(self.pooler(x[:, 0])))


class Encoder(nn.Module):
    """``model(tokens[B,T], padding_mask=None, token_types=None) -> logits[B,T,V]`` (masked LM);
    ``model.classify(tokens, padding_mask=None, token_types=None) -> logits[B, num_labels]`` when the
    spec has a ``classifier``. ``padding_mask`` is True for real tokens."""

    is_causal = False

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.tok_emb = token_embedding(spec, spec.vocab_size)
        self.type_emb = nn.Embedding(spec.type_vocab_size, d) if spec.type_vocab_size else None
        self.position = build_position(spec, max_len=spec.max_seq_len)
        self.emb_norm = build_part("norm", spec.block.norm, dim=d) if spec.embedding.norm else nn.Identity()
        self.drop = Dropout(spec.dropout.embedding)
        self.stack = build_stack(spec, spec.n_layers)
        head_norm = build_part("norm", spec.block.norm, dim=d) if spec.mlm_head.transform else None
        self.head = MLMHead(d, spec.vocab_size, transform=spec.mlm_head.transform, norm=head_norm, bias=spec.head_bias)
        c = spec.classifier
        self.classifier = Classifier(d, c.num_labels, pooler=c.pooler, dropout=c.dropout) if c else None
        init_weights(self, spec)
        if spec.tie_embeddings:
            self.head.proj.weight = self.tok_emb.weight

    def encode(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None) -> Tensor:
        """Hidden states [B, T, D] after the last block (and final norm)."""
        check_tokens(tokens, "tokens", vocab_size=self.spec.vocab_size)
        padding_mask = check_mask(padding_mask, tokens, "padding_mask")
        n_heads = self.spec.block.attention.n_heads
        ctx = self_attention_inputs(self.position, n_heads, tokens, padding_mask, causal=False)
        x = self.position.add(self.tok_emb(tokens), ctx.positions)
        if self.type_emb is not None:
            if token_types is None:
                token_types = tokens.new_zeros(tokens.shape)
            check_tokens(token_types, "token_types", vocab_size=self.spec.type_vocab_size)
            x = x + self.type_emb(token_types)
        elif token_types is not None:
            raise ValueError("token_types: this encoder has no segment embeddings (type_vocab_size: 0)")
        x = self.drop(self.emb_norm(x))  # (B, T, D)
        return self.stack(x, ctx)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None) -> Tensor:
        return self.head(self.encode(tokens, padding_mask, token_types))  # (B, T, V)

    def classify(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None) -> Tensor:
        if self.classifier is None:
            raise ValueError("classify: this encoder has no classification head; set classifier: {num_labels: N} in its spec")
        return self.classifier(self.encode(tokens, padding_mask, token_types))


@register("family", "encoder")
def _build(spec: EncoderSpec) -> Encoder:
    return Encoder(spec)
