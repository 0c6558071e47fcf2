"""A static KV cache: every buffer preallocated at its final size and written in place, so a decoding
step has the same shapes at every step and compiles once (``torch.compile(fullgraph=True)``, CUDA
graphs).

Each layer holds keys and values [B, G, C, K] for the whole capacity C (prompt + new tokens). The
write position is a tensor (``pos``: the slot after the last written one), never a Python int, and
attention reads the full buffer through a mask that hides the slots not written yet and the padding.
A layer with a sliding window W keeps the full capacity too (no ring buffer): its mask lets a query
see only the W - 1 slots before its own, counted in slots as :class:`zoo.components.cache.KVCache`
counts them, so both caches decode alike; its memory is that of a global layer.

Beam search reorders rows in place (``index_select`` copied back into the same buffers): the buffers'
addresses never change, as a captured CUDA graph needs. Cross-attention keys/values (encoder-decoders)
are computed at the first call and kept; beams of one source share them, so reordering leaves them.

Shapes: B rows (beams included), G key/value heads, C capacity, K head size, T new tokens, H heads.
"""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.kernels import PairBias

__all__ = ["StaticKVCache", "StaticLayerCache"]


def _static(t: Tensor) -> Tensor:
    """Mark a buffer as living at a fixed address (a compiled step then reads and writes it in place,
    and a CUDA graph may capture it)."""
    torch._dynamo.mark_static_address(t)
    return t


class StaticLayerCache:
    """One layer's keys and values, [B, G, C, *], allocated at the first write."""

    window = None  # the stack's mask applies a window; the buffers always span the capacity

    def __init__(self, parent: StaticKVCache) -> None:
        self.parent = parent
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.memory_kv: tuple[Tensor, Tensor] | None = None  # cross-attention (B, G, S, K), (B, G, S, V)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new keys/values [B, G, T, *] at their slots; return the whole buffers (the mask
        hides what the new tokens may not see)."""
        p = self.parent
        if self.k is None:
            B, G, _, K = k.shape
            if B != p.batch:
                raise ValueError(f"static cache: made for {p.batch} rows, the model gave {B}")
            # zeros, not empty: a masked slot's value still enters the weighted sum (times 0), and NaN * 0 is NaN
            self.k = _static(k.new_zeros(B, G, p.capacity, K))
            self.v = _static(v.new_zeros(B, G, p.capacity, v.shape[-1]))
        slots = p.slots(k.shape[2])
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        if self.k is not None:
            self.k.copy_(self.k.index_select(0, index))
            self.v.copy_(self.v.index_select(0, index))


class StaticKVCache:
    """Decoding state of a whole stack for ``batch`` rows and up to ``capacity`` slots: per-layer
    buffers, the write position ``pos`` ([1], the slot after the last written one), each slot's
    position and padding, and each row's count of real tokens. Made by
    :meth:`zoo.components.stack.Stack.new_static_cache`."""

    static = True

    def __init__(self, n_layers: int, capacity: int, batch: int, device: torch.device | str | None = None) -> None:
        if capacity < 1 or batch < 1:
            raise ValueError(f"static cache: capacity and batch must be >= 1, got capacity={capacity}, batch={batch}")
        self.capacity, self.batch = capacity, batch
        self.layers = [StaticLayerCache(self) for _ in range(n_layers)]
        self.pos = _static(torch.zeros(1, dtype=torch.long, device=device))
        self.real = _static(torch.zeros(batch, capacity, dtype=torch.bool, device=device))  # True = a real token
        self.key_positions = _static(torch.zeros(batch, capacity, dtype=torch.long, device=device))
        self.next_position = _static(torch.zeros(batch, dtype=torch.long, device=device))
        self.slot_ids = torch.arange(capacity, device=device)

    def slots(self, length: int) -> Tensor:
        """The slots [T] of the ``length`` newest tokens (``pos`` has moved past them)."""
        return self.pos - length + torch.arange(length, device=self.pos.device)

    def extend(self, padding_mask: Tensor | None, length: int, batch: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """Take the next ``length`` slots for new tokens ([B, T] ``padding_mask``, None: all real).
        Returns their positions [B, T], every slot's position [B, C] and whether it holds a real
        token [B, C]. No host sync and no shape that changes from step to step. Writing past the
        capacity fails in ``index_copy_`` (the caller sizes the cache)."""
        # checked eagerly only: under compilation a comparison with these Python ints would fix the
        # graph to this batch and capacity
        if not torch.compiler.is_compiling() and batch != self.batch:
            raise ValueError(f"static cache: made for {self.batch} rows, got {batch}")
        if not torch.compiler.is_compiling() and length > self.capacity:
            raise ValueError(f"static cache: {length} new tokens exceed its capacity ({self.capacity}); "
                             f"make the cache with a larger capacity")
        real = (torch.ones(batch, length, dtype=torch.bool, device=device) if padding_mask is None
                else padding_mask.to(torch.bool))
        positions = self.next_position[:, None] + (real.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
        self.next_position.add_(real.long().sum(dim=1))
        self.pos.add_(length)
        slots = self.slots(length)
        self.real.index_copy_(1, slots, real)
        self.key_positions.index_copy_(1, slots, positions)
        return positions, self.key_positions, self.real

    def offset(self, window: int | None) -> int:
        return 0  # the buffers always start at slot 0

    def mask(self, length: int, window: int | None, bias: Tensor | PairBias | None, *, chunk: int | None = None) -> Tensor:
        """The newest ``length`` tokens' mask over every slot, [B, 1, T, C] boolean (True = may attend),
        or with a score ``bias`` ([B|1, H, T, C]) the bias with -inf where not allowed. A query sees
        the real tokens in the slots up to its own and always its own slot (a padded query then has
        a finite output, as in :class:`zoo.kernels.Mask`); with a ``window`` only the ``window - 1``
        slots before its own; with a ``chunk`` only the slots whose position // chunk is its own."""
        q = self.slots(length)[:, None]  # (T, 1)
        j = self.slot_ids[None, :]  # (1, C)
        allowed = (j <= q) & self.real[:, None, :]  # (B, T, C)
        if window is not None:
            allowed = allowed & (q - j < window)
        if chunk is not None:  # (B, T, C): the keys of the query's chunk
            k_chunk = torch.div(self.key_positions, chunk, rounding_mode="floor")
            allowed = allowed & (k_chunk[:, None, :] == k_chunk[:, q[:, 0]][:, :, None])
        allowed = (allowed | (j == q))[:, None]  # (B, 1, T, C)
        if bias is None:
            return allowed
        dense = bias.dense() if isinstance(bias, PairBias) else bias
        return dense.masked_fill(~allowed, float("-inf"))

    def reorder(self, index: Tensor) -> None:
        """Row i becomes old row ``index[i]`` (beam search), in place: the buffers keep their addresses.
        Cross-attention keys are left as they are: beams of one source share them."""
        for layer in self.layers:
            layer.reorder(index)
        for t in (self.real, self.key_positions, self.next_position):
            t.copy_(t.index_select(0, index))
