"""The original Transformer (Vaswani et al. 2017): an encoder over the source, a decoder over the
target that attends to it.

    src [B, S] -> embed -> encoder blocks -> memory [B, S, D]
    tgt_in [B, T] -> embed -> causal blocks with cross-attention to memory -> logits [B, T, V]

The paper shares one matrix between the source embedding, the target embedding and the output
projection (sec. 3.4), and multiplies embeddings by sqrt(d_model).
"""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor, nn

from zoo.components.cache import KVCache
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
from zoo.spec import EncoderDecoderSpec


class EncoderDecoder(nn.Module):
    """``model(src[B,S], tgt_in[B,T], src_padding_mask=None, tgt_padding_mask=None) -> logits[B,T,V]``.

    Masks are True for real tokens. ``encode`` and ``decode`` are the two halves, for decoding.
    """

    is_causal = True

    def __init__(self, spec: EncoderDecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.tgt_emb = token_embedding(spec, spec.vocab_size)
        if spec.share_embeddings:
            self.src_emb = self.tgt_emb
        else:
            self.src_emb = token_embedding(spec, spec.source_vocab_size)
        self.position = build_position(spec, max_len=spec.max_seq_len)
        self.src_emb_norm = build_part("norm", spec.block.norm, dim=d) if spec.embedding.norm else nn.Identity()
        self.tgt_emb_norm = build_part("norm", spec.block.norm, dim=d) if spec.embedding.norm else nn.Identity()
        self.drop = Dropout(spec.dropout.embedding)
        self.encoder = build_stack(spec, spec.encoder_layers)
        self.decoder = build_stack(spec, spec.decoder_layers, cross=True)
        self.head = Linear(d, spec.vocab_size, bias=spec.head_bias)
        init_weights(self, spec)
        if spec.tie_embeddings:
            self.head.weight = self.tgt_emb.weight

    @property
    def n_heads(self) -> int:
        return self.spec.block.attention.n_heads

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """Source ids [B, S] -> memory [B, S, D]."""
        check_tokens(src, "src", vocab_size=self.spec.source_vocab_size)
        src_padding_mask = check_mask(src_padding_mask, src, "src_padding_mask")
        ctx = self_attention_inputs(self.position, self.n_heads, src, src_padding_mask, causal=False, name="src")
        x = self.drop(self.src_emb_norm(self.position.add(self.src_emb(src), ctx.positions)))
        return self.encoder(x, ctx)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        *,
        last_only: bool = False,
    ) -> Tensor:
        """Target ids [B, T] and memory [B, S, D] -> logits [B, T, V] ([B, 1, V] with ``last_only``).

        With a ``cache`` (from :meth:`new_cache`), ``tgt_in`` continues the cached target tokens and
        the memory's keys/values are computed at the first call only."""
        check_tokens(tgt_in, "tgt_in", vocab_size=self.spec.vocab_size)
        tgt_padding_mask = check_mask(tgt_padding_mask, tgt_in, "tgt_padding_mask")
        ctx = self_attention_inputs(
            self.position, self.n_heads, tgt_in, tgt_padding_mask, causal=True, cache=cache, name="tgt_in"
        )
        x = self.drop(self.tgt_emb_norm(self.position.add(self.tgt_emb(tgt_in), ctx.positions)))
        memory_mask = None if src_padding_mask is None else src_padding_mask.to(bool)[:, None, None, :]  # (B, 1, 1, S)
        x = self.decoder(x, replace(ctx, memory=memory, memory_mask=memory_mask), cache=cache)
        return self.head(x[:, -1:] if last_only else x)

    def new_cache(self, capacity: int) -> KVCache:
        """An empty KV cache for up to ``capacity`` target positions."""
        return self.decoder.new_cache(capacity)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        memory = self.encode(src, src_padding_mask)
        return self.decode(tgt_in, memory, src_padding_mask, tgt_padding_mask)


@register("family", "encoder_decoder")
def _build(spec: EncoderDecoderSpec) -> EncoderDecoder:
    return EncoderDecoder(spec)
