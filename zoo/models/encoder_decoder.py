"""The original Transformer (Vaswani et al. 2017): an encoder over the source, a decoder over the
target that attends to it.

    src [B, S] -> embed -> encoder blocks -> memory [B, S, D]
    tgt_in [B, T] -> embed -> causal blocks with cross-attention to memory -> logits [B, T, V]

The paper shares one matrix between the source embedding, the target embedding and the output
projection (sec. 3.4), and multiplies embeddings by sqrt(d_model).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.components import parts
from zoo.components.cache import KVCache
from zoo.components.dropout import Dropout
from zoo.components.stack import Stack
from zoo.kernels import Mask
from zoo.models.common import build_part, build_position, build_stack, check_mask, check_tokens, init_weights, token_embedding
from zoo.models.family import Family
from zoo.registry import register
from zoo.spec import EncoderDecoderSpec


class EncoderDecoder(Family):
    """``model(src[B,S], tgt_in[B,T], src_padding_mask=None, tgt_padding_mask=None) -> logits[B,T,V]``.

    Masks are True for real tokens. ``encode`` and ``decode`` are the two halves, for decoding.
    """

    is_causal = True
    decodes_from = "source"  # generate encodes the source, then decodes from bos_id

    def __init__(self, spec: EncoderDecoderSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.tgt_emb = token_embedding(spec, spec.vocab_size)
        if spec.share_embeddings:
            self.src_emb = self.tgt_emb
        else:
            self.src_emb = token_embedding(spec, spec.src_vocab_size)
        self.position = build_position(spec, max_len=spec.max_seq_len)  # the decoder's, and the encoder's where shared
        self.src_position = None if spec.share_positions else build_position(spec, max_len=spec.max_seq_len)
        self.src_emb_norm = build_part("norm", spec.block.norm, dim=d) if spec.embedding.norm else nn.Identity()
        self.tgt_emb_norm = build_part("norm", spec.block.norm, dim=d) if spec.embedding.norm else nn.Identity()
        self.drop = Dropout(spec.dropout.embedding)
        self.encoder = build_stack(spec, "encoder", max_len=spec.max_seq_len)
        self.decoder = build_stack(spec, "decoder", max_len=spec.max_seq_len, causal=True)
        self.head = build_part("head", spec.head, dim=d, vocab_size=spec.vocab_size, norm=spec.block.norm,
                               embedding=self.tgt_emb)
        init_weights(self, spec)

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None, *, src_documents: Tensor | None = None) -> Tensor:
        """Source ids [B, S] -> memory [B, S, D]; ``src_documents`` ([B, S] ids): packed sources, each
        attending only within itself."""
        check_tokens(src, "src", vocab_size=self.spec.src_vocab_size)
        src_padding_mask = check_mask(src_padding_mask, src, "src_padding_mask")
        position = self.position if self.src_position is None else self.src_position
        ctx = self.encoder.context(position, src, src_padding_mask, causal=False, name="src", documents=src_documents)
        positions = position.added_positions(ctx.positions, src_padding_mask, src)
        x = self.drop(self.src_emb_norm(position.add(self.src_emb(src), positions)))
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
        src_documents: Tensor | None = None,
        tgt_documents: Tensor | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
        reduction: str = "sum",
        return_nll: bool = False,
    ) -> Tensor:
        """Target ids [B, T] and memory [B, S, D] -> logits [B, T, V] ([B, 1, V] with ``last_only``);
        with ``targets`` ([B, T] gold ids, -100 where none) their cross-entropy instead, summed or
        ``reduction="mean"``, with ``label_smoothing``, without the logits (:meth:`Family.head_out`;
        ``return_nll``: with the unsmoothed NLL beside it).

        With a ``cache`` (from :meth:`new_cache`), ``tgt_in`` continues the cached target tokens and
        the memory's keys/values are computed at the first call only. Packed pairs: ``tgt_documents``
        ([B, T]) and ``src_documents`` ([B, S]) pair each target with the source of the same id."""
        if targets is not None and (last_only or cache is not None):
            raise ValueError("targets: a loss scores every position of a full pass; pass no cache and last_only=False")
        check_tokens(tgt_in, "tgt_in", vocab_size=self.spec.vocab_size)
        tgt_padding_mask = check_mask(tgt_padding_mask, tgt_in, "tgt_padding_mask")
        if memory is None and (cache is None or (isinstance(cache, KVCache) and not len(cache))):
            raise ValueError("memory: None reads the source's keys from the cache, which holds none yet; pass "
                             "encode(src) (at least at the first step)")
        if memory is not None and (memory.dim() != 3 or memory.shape[0] != tgt_in.shape[0]):  # None: a cache holds it
            raise ValueError(f"tgt_in: {tgt_in.shape[0]} target rows, but the source (memory) is {tuple(memory.shape)}: "
                             f"one source row per target row; give src and tgt_in the same batch")
        if memory is not None and src_padding_mask is not None and tuple(src_padding_mask.shape) != tuple(memory.shape[:2]):
            raise ValueError(f"src_padding_mask: expected the source's shape {tuple(memory.shape[:2])}, got "
                             f"{tuple(src_padding_mask.shape)}")
        if (src_documents is None) != (tgt_documents is None):
            raise ValueError("src_documents/tgt_documents: packed pairs need both (each target sees the source of its "
                             "own id), or neither")
        ctx = self.decoder.context(self.position, tgt_in, tgt_padding_mask, causal=True, cache=cache, name="tgt_in",
                                   documents=tgt_documents)
        positions = self.position.added_positions(ctx.positions, tgt_padding_mask, tgt_in)
        x = self.drop(self.tgt_emb_norm(self.position.add(self.tgt_emb(tgt_in), positions)))
        if src_documents is not None:
            padding = None if src_padding_mask is None else src_padding_mask.to(bool)
            memory_mask = Mask(tgt_in.shape[1], memory.shape[1], padding=padding, documents=src_documents,
                               q_documents=tgt_documents)
        else:
            memory_mask = None if src_padding_mask is None else src_padding_mask.to(bool)[:, None, None, :]  # (B, 1, 1, S)
        x = self.decoder(x, ctx.with_memory(memory, memory_mask), cache=cache)
        if targets is not None:
            return self.head_out(x, targets, label_smoothing=label_smoothing, reduction=reduction, return_nll=return_nll)
        return self.head(x[:, -1:] if last_only else x)

    def new_cache(self, capacity: int) -> KVCache:
        """An empty KV cache for up to ``capacity`` target positions."""
        return self.decoder.new_cache(capacity)

    def example_inputs(self, batch: int, seq: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """Source and target token ids."""
        src_vocab = self.spec.src_vocab_size or self.spec.vocab_size
        return (torch.randint(0, src_vocab, (batch, seq), generator=generator),
                torch.randint(0, self.spec.vocab_size, (batch, seq), generator=generator))

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
        *,
        src_documents: Tensor | None = None,
        tgt_documents: Tensor | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
        reduction: str = "sum",
        return_nll: bool = False,
    ) -> Tensor:
        """Packed pairs: ``src_documents`` [B, S] and ``tgt_documents`` [B, T] ids; ``targets``: the
        loss instead of the logits (see :meth:`decode`)."""
        memory = self.encode(src, src_padding_mask, src_documents=src_documents)
        return self.decode(tgt_in, memory, src_padding_mask, tgt_padding_mask, src_documents=src_documents,
                           tgt_documents=tgt_documents, targets=targets, label_smoothing=label_smoothing,
                           reduction=reduction, return_nll=return_nll)


    def stacks(self, seq: int) -> list[tuple[Stack, int, int | None]]:
        return [(self.encoder, seq, None), (self.decoder, seq, seq)]

    def saved(self, seq: int) -> tuple[int, int]:
        """As every family's, with two embedding passes and the encoder's memory, which the
        decoder's cross-attention keeps."""
        elements, masks = super().saved(seq)
        e, m = self.embedding_saved(seq)
        return elements + e + seq * self.spec.d_model, masks + m

    def embedding_saved(self, tokens: int) -> tuple[int, int]:
        d = self.spec.d_model
        norm = self.src_emb_norm
        elements = tokens * (d + parts.norm_saved(norm)) if parts.has_parameters(norm) else 0
        return elements, tokens * d if self.spec.dropout.embedding else 0


@register("family", "encoder_decoder")
def _build(spec: EncoderDecoderSpec) -> EncoderDecoder:
    return EncoderDecoder(spec)
