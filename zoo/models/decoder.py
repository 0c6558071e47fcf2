"""GPT-style decoder-only language model (GPT-2, LLaMA-style presets).

    tokens [B, T] -> embed (+ absolute positions) -> causal blocks -> final norm -> head -> logits [B, T, V]

Without a head (``head: none``) the model returns the hidden states [B, T, D] (HF's ``*Model``).
"""

from __future__ import annotations

from torch import Tensor, nn

from zoo.components.cache import KVCache
from zoo.components.dropout import Dropout
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
from zoo.registry import register
from zoo.spec import DecoderSpec


class DecoderLM(Family):
    """``model(tokens[B,T], padding_mask=None) -> logits[B,T,V]``; position t sees tokens <= t only.

    ``padding_mask`` ([B, T], True = real token) allows left-padded batches: each row's real tokens
    get the positions and outputs they would have unpadded.
    """

    is_causal = True
    decodes_from = "prompt"  # generate continues the prompt

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.tok_emb = token_embedding(spec, spec.vocab_size)
        self.position = build_position(spec, max_len=spec.max_seq_len)
        self.emb_norm = build_part("norm", spec.block.norm, dim=spec.embedding_dim) if spec.embedding.norm else nn.Identity()
        self.drop = Dropout(spec.dropout.embedding)
        self.emb_proj = embedding_projection(spec)  # factorised embeddings (embedding.dim) -> d_model
        self.stack = build_stack(spec, max_len=spec.max_seq_len, causal=True)
        self.head = build_part("head", spec.head, dim=d, vocab_size=spec.vocab_size, norm=spec.block.norm,
                               embedding=self.tok_emb, embedding_dim=spec.embedding_dim)
        init_weights(self, spec)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None, cache: KVCache | None = None, *,
                last_only: bool = False, documents: Tensor | None = None, positions: Tensor | None = None,
                targets: Tensor | None = None, label_smoothing: float = 0.0, reduction: str = "sum",
                return_nll: bool = False) -> Tensor:
        """With a ``cache`` (from :meth:`new_cache`), ``tokens`` continue the cached ones: pass the
        prompt first (with its padding mask), then each new token; the logits equal a full pass.
        ``last_only``: logits of the last position only ([B, 1, V]), what generation needs; a long
        prompt then skips its [B, T, V] vocabulary projection.

        Packed rows: ``documents`` ([B, T] ids, a new document wherever the id changes) keeps each
        token to its own document, with positions restarting at each one, so a packed row's logits
        equal each document's run alone; ``positions`` ([B, T]) overrides them (a document continued
        from the row before).

        ``targets`` ([B, T] ids of the next tokens, -100 where none): the loss instead of the logits,
        the cross-entropy summed (or ``reduction="mean"``) over the targets, with ``label_smoothing``,
        computed by the head without the [B, T, V] logits (:meth:`Family.head_out`; ``return_nll``: with the
        unsmoothed NLL beside it)."""
        if targets is not None and (last_only or cache is not None):
            raise ValueError("targets: a loss scores every position of a full pass; pass no cache and last_only=False")
        check_tokens(tokens, "tokens", vocab_size=self.spec.vocab_size)
        padding_mask = check_mask(padding_mask, tokens, "padding_mask")
        ctx = self.stack.context(self.position, tokens, padding_mask, causal=True, cache=cache, documents=documents,
                                 positions=positions)
        positions = self.position.added_positions(ctx.positions, padding_mask, tokens)
        x = self.emb_proj(self.drop(self.emb_norm(self.position.add(self.tok_emb(tokens), positions))))  # (B, T, D)
        x = self.stack(x, ctx, cache=cache)
        if targets is not None:
            return self.head_out(x, targets, label_smoothing=label_smoothing, reduction=reduction, return_nll=return_nll)
        return self.head(x[:, -1:] if last_only else x)  # (B, T, V)

    def hidden_states_refused(self) -> str | None:
        if self.spec.head.passes_hidden_states:
            return None
        return (f"this decoder's {self.spec.head.kind} head gives logits, not hidden states; embeddings come from "
                f"a decoder with head: none (a backbone such as HF's LlamaModel)")

    def hidden_states(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        if self.hidden_states_refused():
            raise ValueError(f"hidden_states: {self.hidden_states_refused()}")
        return self(tokens, padding_mask)  # (B, T, D): head none is the identity

    def new_cache(self, capacity: int) -> KVCache:
        """An empty KV cache for up to ``capacity`` positions (prompt + new tokens); a layer with a
        sliding window holds at most the window's keys between steps."""
        return self.stack.new_cache(capacity)


@register("family", "decoder")
def _build(spec: DecoderSpec) -> DecoderLM:
    return DecoderLM(spec)
