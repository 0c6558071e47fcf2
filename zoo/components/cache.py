"""KV cache for incremental decoding.

One :class:`KVCache` per model and sequence batch; one :class:`LayerCache` per decoder layer holds
that layer's self-attention keys/values (preallocated to ``capacity`` positions, written in place)
and its cross-attention keys/values (computed once per source). The cache also tracks which cached
keys are padding and each key's position, so left-padded batches and every position kind (added,
rotated or biased) decode exactly as a full recomputation would.

A layer with a sliding ``window`` W (shorter than the capacity) keeps only the last W - 1 keys and
values between steps, all a later token can see: new tokens attend to those and to each other, and
that layer's memory stays bounded by the window however long the sequence grows. Windows are per
layer (local and global layers in one stack: Gemma 2/3, Qwen2's ``max_window_layers``).

Shapes: B batch (rows, beams included), G key/value heads, C capacity, K head size, T new tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


class LayerCache:
    def __init__(self, parent: KVCache, window: int | None = None) -> None:
        self.parent = parent
        self.window = window  # a sliding window shorter than the capacity, else None
        self.k: Tensor | None = None  # (B, G, C, K)
        self.v: Tensor | None = None  # (B, G, C, V)
        self.memory_kv: tuple[Tensor, Tensor] | None = None  # cross-attention (B, G, S, K), (B, G, S, V)
        self.state: dict[str, Tensor] | None = None  # a linear-attention layer's fixed-size state, per row

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new keys/values [B, G, T, *] at the current step; return all the new tokens may
        see: every key so far, or with a window those from ``parent.offset(window)`` on."""
        p = self.parent
        if self.window is not None:
            return self._slide(k, v, self.window - 1)
        if self.k is None:
            B, G, _, K = k.shape
            self.k = k.new_empty(B, G, p.capacity, K)
            self.v = v.new_empty(B, G, p.capacity, v.shape[-1])
        self.k[:, :, p.start : p.end] = k
        self.v[:, :, p.start : p.end] = v
        return self.k[:, :, : p.end], self.v[:, :, : p.end]

    def _slide(self, k: Tensor, v: Tensor, keep: int) -> tuple[Tensor, Tensor]:
        """The held keys (those from ``offset`` to ``start``) and the new ones; hold the last ``keep``."""
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        n = k.shape[2]
        self.k, self.v = k[:, :, n - min(keep, n) :], v[:, :, n - min(keep, n) :]
        return k, v

    def reorder(self, index: Tensor) -> None:
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)
        if self.state is not None:
            self.state = {name: t.index_select(0, index) for name, t in self.state.items()}


class KVCache:
    """Decoding state of a whole stack: per-layer caches plus key padding and positions. ``windows``:
    each layer's sliding window, or None (see the module docstring)."""

    def __init__(self, n_layers: int, capacity: int, *, windows: list[int | None] | None = None) -> None:
        windows = list(windows) if windows is not None else [None] * n_layers
        if len(windows) != n_layers:
            raise ValueError(f"cache: {len(windows)} windows for {n_layers} layers; give one per layer")
        for w in windows:
            if w is not None and w < 1:
                raise ValueError(f"cache: a sliding window covers at least the token itself, got window={w}")
        self.capacity = capacity
        self.layers = [LayerCache(self, self.slides(w)) for w in windows]
        self.start = self.end = 0  # the new tokens occupy [start, end)
        self.rows = 0  # the batch's rows (beams included), once tokens are cached
        self.padding_mask: Tensor | None = None  # (B, C) True = real token; None: no padding seen
        self.key_positions: Tensor | None = None  # (B, C) with padding; else positions are 0..end-1
        self.next_position: Tensor | None = None  # (B,) real tokens so far, with padding

    def __len__(self) -> int:
        return self.end

    def slides(self, window: int | None) -> int | None:
        """``window`` if it is shorter than the capacity (the cache then slides), else None."""
        return window if window is not None and window < self.capacity else None

    def slots(self, length: int) -> Tensor:
        """The slots [T] of the ``length`` newest tokens (indices in the sequence, padding counted)."""
        return torch.arange(self.end - length, self.end)

    def offset(self, window: int | None) -> int:
        """The first key the new tokens of a layer with ``window`` may see: 0, or with a window
        shorter than the capacity the oldest key in the first new token's window."""
        window = self.slides(window)
        return 0 if window is None else max(0, self.start - window + 1)

    def extend(self, padding_mask: Tensor | None, length: int, batch: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor | None]:
        """Make room for ``length`` new tokens. Returns (their positions, the positions of every key
        so far, those keys' mask); a layer with a window sees them from ``offset(window)`` on.

        Positions are [T] and [S] while no padding has been seen, [B, T] and [B, S] after.
        """
        if self.end + length > self.capacity:
            raise ValueError(
                f"cache: {self.end} cached + {length} new tokens exceed its capacity ({self.capacity}); "
                f"make the cache with a larger capacity"
            )
        if self.end and batch != self.rows:
            raise ValueError(f"cache: it holds {self.rows} rows, and {batch} came to continue them; a cache continues "
                             f"the batch it began with (make a new_cache for another batch)")
        self.rows = batch
        self.start, self.end = self.end, self.end + length
        if padding_mask is None and self.padding_mask is None:
            positions = torch.arange(self.start, self.end, device=device)
            return positions, torch.arange(self.end, device=device), None
        if self.padding_mask is None:  # first padding: earlier tokens were all real
            self.padding_mask = torch.ones(batch, self.capacity, dtype=torch.bool, device=device)
            self.key_positions = torch.arange(self.capacity, device=device).expand(batch, -1).clone()
            self.next_position = torch.full((batch,), self.start, dtype=torch.long, device=device)
        if padding_mask is None:
            padding_mask = torch.ones(batch, length, dtype=torch.bool, device=device)
        positions = self.next_position[:, None] + (padding_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
        self.next_position = self.next_position + padding_mask.sum(dim=1)
        self.padding_mask[:, self.start : self.end] = padding_mask
        self.key_positions[:, self.start : self.end] = positions
        return positions, self.key_positions[:, : self.end], self.padding_mask[:, : self.end]

    def reorder(self, index: Tensor) -> None:
        """Select rows (beam search): row i becomes old row index[i]. Cross-attention keys are left as
        they are: beams of one source share them."""
        for layer in self.layers:
            layer.reorder(index)
        self.rows = len(index)
        if self.padding_mask is not None:
            self.padding_mask = self.padding_mask.index_select(0, index)
            self.key_positions = self.key_positions.index_select(0, index)
            self.next_position = self.next_position.index_select(0, index)
