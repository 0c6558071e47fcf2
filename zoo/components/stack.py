"""A stack of blocks, whose layers may differ (per-layer windows, positions of their own).

:meth:`Stack.context` works out, once per forward pass, what each layer's attention reads: the
tokens' positions, and for each distinct (window, position, heads) of its layers the SDPA mask
(causality, key padding, the position's score bias, the sliding window folded together) and the
position module that rotates its queries and keys. A Gemma-2-like stack of alternating local and
global layers builds two masks per pass, not one per layer.

Shapes: B batch, T tokens, S keys, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from zoo.components import parts
from zoo.components.block import Block, BlockContext
from zoo.components.cache import KVCache
from zoo.components.dropout import Dropout
from zoo.components.position import Position
from zoo.components.static_cache import StaticKVCache
from zoo.kernels import Mask, document_positions
from zoo.protocols import LayerCosts, SummaryParts

__all__ = ["Stack", "StackContext", "positions_for"]


def positions_for(mask: Tensor | None, length: int, device: torch.device, documents: Tensor | None = None) -> Tensor:
    """Token positions: 0..T-1 ([T]), or with a padding mask the count of real tokens before each
    one ([B, T]), so a left-padded row gets the positions it would have unpadded; with ``documents``
    ([B, T] ids) the count restarts at each document (a packed row: each document as if alone)."""
    if documents is not None:
        return document_positions(documents, mask)
    if mask is None:
        return torch.arange(length, device=device)
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


@dataclass(frozen=True)
class StackContext:
    """What :meth:`Stack.forward` hands each block: ``positions`` of the new tokens ([T] or [B, T],
    for the model's ``position.add``), one :class:`BlockContext` per layer (shared by layers that
    attend alike) and the new tokens' ``padding_mask`` [B, T] (None: every token is real)."""

    positions: Tensor
    layers: tuple[BlockContext, ...]
    padding_mask: Tensor | None = None

    def with_memory(self, memory: Tensor, memory_mask: Tensor | None) -> StackContext:
        """The same, with cross-attention's ``memory`` [B, S, D] and its mask for every layer."""
        made: dict[int, BlockContext] = {}
        layers = tuple(made.setdefault(id(c), replace(c, memory=memory, memory_mask=memory_mask)) for c in self.layers)
        return replace(self, layers=layers)


class Stack(nn.Module, SummaryParts, LayerCosts):
    """Blocks in sequence, then the final norm (or nothing, where the block kind ends in a norm).

    ``windows``: each layer's sliding window (None: every token it may see; see ``zoo.kernels.Mask``);
    ``chunks``: each layer's chunk size (chunked attention: a token sees only the keys whose position
    // chunk is its own; a cache then keeps the last chunk - 1 keys of that layer, as a window would);
    ``positions``: each layer's own position module (None: the model's, passed to :meth:`context`);
    ``dropout``: a dropout rate on the output, after the final norm (T5's).

    ``checkpointing``: in training, each block keeps only its input and recomputes the rest in the
    backward pass (``torch.utils.checkpoint``, non-reentrant; random draws such as dropout masks are
    replayed, so the gradients are the same). Set it with ``zoo.train.set_activation_checkpointing``.
    """

    summary_parts = {"norm": "norms"}  # the final norm; the blocks declare their own parts

    def __init__(self, blocks: list[Block], norm: nn.Module | None, *, windows: list[int | None] | None = None,
                 positions: list[Position | None] | None = None, dropout: float = 0.0,
                 chunks: list[int | None] | None = None) -> None:
        super().__init__()
        n = len(blocks)
        self.blocks = nn.ModuleList(blocks)
        self.norm = norm if norm is not None else nn.Identity()
        self.drop = Dropout(dropout)  # after the final norm (T5's); identity at 0
        self.checkpointing = False
        self.padding_mask: Tensor | None = None  # the last forward pass's (see forward)
        self.windows = list(windows) if windows is not None else [None] * n
        own = list(positions) if positions is not None else [None] * n
        self.chunks = list(chunks) if chunks is not None else [None] * n
        if len(self.windows) != n or len(own) != n or len(self.chunks) != n:
            raise ValueError(f"Stack: {n} blocks need {n} windows, {n} positions and {n} chunks")
        # the keys a layer's cache keeps: its window's, or its chunk's (which a chunk never reaches past)
        self.kept = [w if c is None else c if w is None else min(w, c) for w, c in zip(self.windows, self.chunks)]
        distinct = list({id(p): p for p in own if p is not None}.values())
        self.positions = nn.ModuleList(distinct)  # layers' own positions (derived tables; a dynamic rope's longest length)
        index = {id(p): i for i, p in enumerate(distinct)}
        heads = [parts.head_sizes(b.attn, 0)[0] for b in blocks]
        keys = [(w, -1 if p is None else index[id(p)], h, c) for w, p, h, c in zip(self.windows, own, heads, self.chunks)]
        self.variants = list(dict.fromkeys(keys))  # (window, own position or -1, query heads, chunk)
        self.variant_of = [self.variants.index(k) for k in keys]

    def context(self, position: Position, tokens: Tensor, padding_mask: Tensor | None, *, causal: bool,
                cache: KVCache | StaticKVCache | None = None, name: str = "tokens", check_length: bool = True,
                documents: Tensor | None = None, positions: Tensor | None = None) -> StackContext:
        """Each layer's attention inputs for ``tokens`` [B, T] (only their shape and device are read)
        and the cache: the model's ``position`` serves layers without their own. ``check_length``:
        refuse a sequence longer than a position table (``name`` names the input).

        ``documents`` ([B, T] ids, a packed row): each token attends only within its document, whose
        positions restart at 0, unless ``positions`` ([B, T]) gives them (a document continued from an
        earlier row). Each layer's mask is a :class:`zoo.kernels.Mask`, which the attention backends
        compute at the cost it allows (see :func:`zoo.kernels.attention`)."""
        B, T = tokens.shape[:2]
        device = tokens.device
        if documents is not None or positions is not None:
            if cache is not None:
                raise ValueError("documents/positions: packed rows are for full passes; decode each document with "
                                 "its own cache")
            for what, t in (("documents", documents), ("positions", positions)):
                if t is not None and tuple(t.shape) != (B, T):
                    raise ValueError(f"{what}: shape {tuple(t.shape)} does not fit {name} {tuple(tokens.shape[:2])}; "
                                     f"give one {'id' if what == 'documents' else 'position'} per token, [B, T]")
            if positions is not None and (positions.dtype.is_floating_point or positions.dtype == torch.bool):
                raise ValueError(f"positions: expected integer positions, got {positions.dtype}")
            if positions is not None and positions.numel() and not torch.compiler.is_compiling() and int(positions.min()) < 0:
                raise ValueError(f"positions: a token's position counts from 0 in its document, got {int(positions.min())}; "
                                 f"give positions >= 0")
        if cache is None:
            # given positions, or a packed row's (which may outrun a position table its documents fit), set
            # the length the tables must hold; otherwise the row's
            read_length = positions is not None or documents is not None
            if positions is None:
                positions = positions_for(padding_mask, T, device, documents)
            # (a compiled pass cannot read it without a host sync: there the row's length stands, and a
            # packed row longer than a table is for eager passes only)
            length = int(positions.max()) + 1 if read_length and positions.numel() and not torch.compiler.is_compiling() else T
            key_positions = positions
            key_padding = padding_mask
        else:
            positions, key_positions, key_padding = cache.extend(padding_mask, T, B, device)
            length = key_positions.shape[-1]
        static = isinstance(cache, StaticKVCache)  # its capacity was checked against the tables when it was made
        for pos in [position, *self.positions] if check_length and not static else []:
            if pos.max_len is not None and length > pos.max_len:
                raise ValueError(
                    f"{name}: length {length} exceeds max_seq_len ({pos.max_len}) of the position table; "
                    f"truncate the input or build the model with a larger max_seq_len"
                )
        made = []
        for window, own, heads, chunk in self.variants:
            pos = position if own < 0 else self.positions[own]
            kept = window if chunk is None else chunk if window is None else min(window, chunk)
            start = cache.offset(kept) if cache is not None else 0
            keys = key_positions[..., start:]
            padding = None if key_padding is None else key_padding[:, start:]
            bias = pos.bias(heads, positions, keys)
            rotation = pos.rotation(positions) if pos.rotates else None  # RoPE's cos/sin: once a pass
            if static:  # the whole buffer, the unwritten slots hidden: the same shapes at every step
                mask = cache.mask(T, window, bias, chunk=chunk)
            else:
                chunks = None if chunk is None else torch.div(keys if keys.dim() == 2 else keys[None], chunk,
                                                              rounding_mode="floor")
                mask = Mask(T, keys.shape[-1], causal=causal, window=window, padding=padding, documents=documents,
                            bias=bias, device=device, chunk=chunk, chunks=chunks)
            made.append(BlockContext(pos=pos, positions=positions, rotation=rotation, mask=mask, is_causal=False))
        return StackContext(positions=positions, layers=tuple(made[v] for v in self.variant_of), padding_mask=padding_mask)

    def forward(self, x: Tensor, ctx: StackContext, cache: KVCache | None = None) -> Tensor:
        """x [B, T, D] -> [B, T, D]; block i reads ``ctx.layers[i]``; ``cache`` holds earlier steps'
        keys and values (incremental decoding), one layer's to each block. The pass's padding mask stays
        on the stack (``padding_mask``), which a mixture of experts' router losses leave out."""
        self.padding_mask = ctx.padding_mask
        recompute = self.checkpointing and cache is None and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if recompute:
                x = checkpoint(block, x, ctx.layers[i], use_reentrant=False)
            else:
                x = block(x, ctx.layers[i], cache=cache.layers[i] if cache is not None else None)
        return self.drop(self.norm(x))

    def new_cache(self, capacity: int) -> KVCache:
        """An empty cache for up to ``capacity`` positions; a layer with a window holds at most the
        window's keys between steps."""
        return KVCache(len(self.blocks), capacity, windows=self.kept)

    def new_static_cache(self, capacity: int, batch: int, device: torch.device | str | None = None) -> StaticKVCache:
        """A preallocated cache of ``capacity`` slots for ``batch`` rows, written in place (see
        :mod:`zoo.components.static_cache`); a layer with a window masks its keys to the window."""
        return StaticKVCache(len(self.blocks), capacity, batch, device)

    # ------------------------------------------------------------------------------ costs
    def flops(self, tokens: int, memory: int | None = None) -> int:
        """Forward FLOPs of every block over ``tokens`` tokens (cross-attention: ``memory`` keys)."""
        return sum(parts.flops(block, tokens, memory) for block in self.blocks)

    def saved(self, tokens: int, memory: int | None = None, *, rotates: bool = False,
              final_norm: bool = True) -> tuple[int, int]:
        """(elements, dropout-mask bytes) one sample keeps in the stack for the backward pass (see
        :meth:`Block.saved`); ``rotates``: the model's position rotates q and k (layers with their
        own position ask theirs)."""
        elements = masks = 0
        for i, block in enumerate(self.blocks):
            own = self.variants[self.variant_of[i]][1]
            turns = rotates if own < 0 else self.positions[own].rotates
            e, m = block.saved(tokens, memory, rotates=turns)
            elements, masks = elements + e, masks + m
        if final_norm and parts.has_parameters(self.norm):
            elements += tokens * (_dim(self.norm) + parts.norm_saved(self.norm))
        if self.drop.p:  # the final dropout's mask, a byte per element
            masks += tokens * (_dim(self.norm) if parts.has_parameters(self.norm) else self.blocks[-1].attn.out.out_features)
        return elements, masks

    def kv_elements(self, *, cross: bool = False) -> int:
        """Key and value elements each layer caches per token (cross: per source token)."""
        total = 0
        for block in self.blocks:
            att = block.cross_attn if cross else block.attn
            total += parts.cache_elements(att)
        return total


def _dim(norm: nn.Module) -> int:
    return next(iter(norm.parameters())).shape[0]
