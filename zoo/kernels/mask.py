"""What each query may attend to, as structure rather than a tensor: the one mask concept that the
models build and every attention backend reads.

A :class:`Mask` says which (query, key) pairs are allowed: causality, a sliding window (causal, or
bidirectional as ModernBERT's local layers), key padding, documents (packed rows: a token sees only
its own document), a bidirectional prefix (prefix-LM), and an additive score bias (ALiBi, relative
positions) on the allowed pairs: a [B|1, H, T, S] tensor, or computed from positions
(:class:`PairBias`: ALiBi's slopes, T5's table of buckets), so that no backend but the dense one
ever makes the [T, S] scores' worth of bias. The backends turn it into what they need:

* :meth:`Mask.dense` -- SDPA's ``attn_mask`` ([B|1, 1|H, T, S], boolean or additive) and ``is_causal``;
* :meth:`Mask.allowed` -- the rule itself on any broadcastable index tensors: the blocked CPU kernel
  (:mod:`zoo.kernels.blocked`) evaluates it on each query block's band of keys, FlexAttention
  (:mod:`zoo.kernels.flex`) as its ``mask_mod``;
* :meth:`Mask.reach` -- how far back and ahead any allowed key lies, which bounds the band.

Conventions: queries are the last ``q_len`` of ``k_len`` key slots (self-attention with a cache:
query t sits at key slot ``k_len - q_len + t``), unless ``q_documents`` is given (cross-attention,
where only documents pair queries with keys). ``padding`` is [B, S], True = real key. A padded
query of a square self-attention may attend to itself, so no row is empty (an empty row makes NaN);
real tokens' outputs do not change. A causal window of W lets a query see itself and the W - 1 keys
before it; a bidirectional window of W the keys within W // 2 on either side (ModernBERT's
``local_attention``). Chunks (Llama 4's chunked attention) let a query see only the keys of its own
chunk: ``chunks`` [B|1, S] holds each key's chunk id (position // ``chunk``; the queries', its last
T), so no allowed key lies more than ``chunk - 1`` slots away.

Shapes: B batch, H heads, T queries, S keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["AlibiBias", "Mask", "MaskError", "PairBias", "RelativeBias", "document_positions"]


class MaskError(ValueError):
    """A mask whose parts do not fit the batch or each other (the message names both shapes)."""


class PairBias:
    """A score bias computed from each pair's positions rather than stored: reads like the
    [B|1, H, T, S] tensor it stands for (``shape``, ``dim()``, ``dense()``, ``requires_grad``), and
    :meth:`at` computes any pairs' values without it: the blocked kernel on each block's band,
    FlexAttention in its ``score_mod``. Subclasses (dataclasses with ``q_positions`` [B|1, T] and
    ``k_positions`` [B|1, S], 1-D for one row) say the value of head ``h`` for positions ``qp``, ``kp``
    (:meth:`values`) and their head count."""

    q_positions: Tensor
    k_positions: Tensor

    def __post_init__(self) -> None:
        for name in ("q_positions", "k_positions"):
            t = getattr(self, name)
            if t.dim() == 1:
                object.__setattr__(self, name, t[None])
        rows = (self.q_positions.shape[0], self.k_positions.shape[0])
        if rows[0] != rows[1] and 1 not in rows:
            raise MaskError(f"{type(self).__name__}: q_positions {tuple(self.q_positions.shape)} and k_positions "
                            f"{tuple(self.k_positions.shape)} have different batches")

    heads: int

    def values(self, h: Tensor | int, qp: Tensor, kp: Tensor) -> Tensor:
        raise NotImplementedError

    @property
    def shape(self) -> torch.Size:
        rows = max(self.q_positions.shape[0], self.k_positions.shape[0])
        return torch.Size((rows, self.heads, self.q_positions.shape[1], self.k_positions.shape[1]))

    def dim(self) -> int:
        return 4

    @property
    def device(self) -> torch.device:
        return self.q_positions.device

    def at(self, b: Tensor | int, h: Tensor | int, t: Tensor, s: Tensor) -> Tensor:
        """The bias of query ``t`` (0..T-1) and key ``s`` (0..S-1) of row ``b``, head ``h``: any
        broadcastable index tensors."""
        qb = b if self.q_positions.shape[0] != 1 else 0  # one row broadcasts; none: an empty batch
        kb = b if self.k_positions.shape[0] != 1 else 0
        return self.values(h, self.q_positions[qb, t], self.k_positions[kb, s])

    def dense(self) -> Tensor:
        """The [B|1, H, T, S] tensor."""
        rows, heads, T, S = self.shape
        b, h, t, s = (torch.arange(n, device=self.device) for n in (rows, heads, T, S))
        return self.at(b.view(rows, 1, 1, 1), h.view(1, heads, 1, 1), t.view(T, 1), s.view(1, S))


@dataclass(frozen=True, eq=False)
class AlibiBias(PairBias):
    """ALiBi's score bias (Press et al. 2022): ``-slopes[h] * |q_positions[b, t] - k_positions[b, s]|``
    for query t and key s of row b, in fp32."""

    slopes: Tensor  # [H]
    q_positions: Tensor  # [B|1, T] (or [T])
    k_positions: Tensor  # [B|1, S] (or [S])
    requires_grad = False  # nothing in it is trained

    @property
    def heads(self) -> int:
        return self.slopes.shape[0]

    def values(self, h: Tensor | int, qp: Tensor, kp: Tensor) -> Tensor:
        return -self.slopes[h] * (qp - kp).abs().float()


@dataclass(frozen=True, eq=False)
class RelativeBias(PairBias):
    """T5's relative position bias: ``table[buckets(k_positions[b, s] - q_positions[b, t]), h]``, a
    learned scalar per bucket of relative position and head; ``buckets`` maps relative positions to
    bucket ids (zoo.components.position.relative_buckets). A trainable table gets its gradient
    through whichever pairs a backend computes."""

    table: Tensor  # [buckets, H]
    q_positions: Tensor  # [B|1, T] (or [T])
    k_positions: Tensor  # [B|1, S] (or [S])
    buckets: Callable[[Tensor], Tensor]

    @property
    def heads(self) -> int:
        return self.table.shape[1]

    @property
    def requires_grad(self) -> bool:
        return self.table.requires_grad

    def values(self, h: Tensor | int, qp: Tensor, kp: Tensor) -> Tensor:
        return self.table[self.buckets(kp - qp), h]


@dataclass(frozen=True, eq=False)
class Mask:
    """Which (query, key) pairs may attend; see the module docstring. Build one per distinct layer
    kind per forward pass: backends cache what they derive from it (the dense tensor, a block mask)."""

    q_len: int
    k_len: int
    causal: bool = False
    window: int | None = None
    padding: Tensor | None = None  # [B, S] bool, True = real key
    documents: Tensor | None = None  # [B, S] document id of each key (and of the queries: its last T)
    q_documents: Tensor | None = None  # [B, T] the queries' own document ids (cross-attention)
    prefix: Tensor | None = None  # [B]: keys before prefix[b] are visible to every query of row b (causal only)
    bias: Tensor | PairBias | None = None  # additive [B|1, H, T, S] on the allowed pairs
    chunk: int | None = None  # the chunks' size (chunked attention), with ``chunks``
    chunks: Tensor | None = None  # [B|1, S] each key's chunk id (the queries': its last T)
    device: torch.device | None = None  # where the dense form is made when no tensor above says
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        T, S = self.q_len, self.k_len
        if self.window is not None and self.window < 1:
            raise MaskError(f"window: a window covers at least the token itself, got {self.window}")
        if (self.chunk is None) != (self.chunks is None) or (self.chunk is not None and self.chunk < 1):
            raise MaskError(f"chunk: chunked attention needs both the size (>= 1, got {self.chunk}) and each key's "
                            f"chunk ids (chunks)")
        if self.chunks is not None and (self.chunks.dim() != 2 or self.chunks.shape[1] != S or self.q_documents is not None):
            raise MaskError(f"chunks: shape {tuple(self.chunks.shape)} does not fit {S} keys of self-attention "
                            f"(expected [B|1, {S}])")
        if self.prefix is not None and (not self.causal or self.window is not None):
            raise MaskError("prefix: a bidirectional prefix goes with a causal mask without a window")
        if self.q_documents is None and T > S:
            raise MaskError(f"mask: {T} queries against {S} keys; self-attention queries are the last keys")
        batch = first = None
        for name, t, want in (("padding", self.padding, S), ("documents", self.documents, S),
                              ("q_documents", self.q_documents, T)):
            if t is None:
                continue
            if t.dim() != 2 or t.shape[1] != want or (batch is not None and t.shape[0] != batch):
                got, b = tuple(t.shape), batch or "B"
                since = f" ({first} has {batch} rows)" if first else ""
                raise MaskError(f"{name}: shape {got} does not fit the batch: expected [{b}, {want}] for {T} queries "
                                f"and {S} keys{since}")
            batch, first = t.shape[0], first or f"{name} {tuple(t.shape)}"
        if self.q_documents is not None and self.documents is None:
            raise MaskError("q_documents: the keys' documents are needed too (documents=[B, S])")
        if self.bias is not None and (self.bias.dim() != 4 or tuple(self.bias.shape[-2:]) != (T, S)):
            raise MaskError(f"bias: shape {tuple(self.bias.shape)} does not fit {T} queries and {S} keys "
                            f"(expected [B|1, H, {T}, {S}])")

    # ------------------------------------------------------------------------------ the rule
    @property
    def offset(self) -> int:
        """The key slot of query 0 (``k_len - q_len`` for self-attention, 0 for cross-attention)."""
        return 0 if self.q_documents is not None else self.k_len - self.q_len

    @property
    def trivial(self) -> bool:
        """Nothing to combine beyond what SDPA's ``is_causal`` says (or no mask at all)."""
        local = self.window is not None and self.window_bound() < self.k_len - 1
        extra = self.chunks is not None or self.padding is not None or self.bias is not None or self.documents is not None or self.prefix is not None
        return not extra and not local and (not self.causal or self.q_len in (1, self.k_len))

    def window_bound(self) -> int:
        """How far a window reaches back: W - 1 causal, W // 2 bidirectional (a huge number without one)."""
        if self.window is None:
            return 1 << 40
        return self.window - 1 if self.causal else self.window // 2

    def allowed(self, b: Tensor | int, qi: Tensor, kj: Tensor) -> Tensor:
        """Whether query ``qi`` (in key-slot coordinates: query t is ``offset + t``) may attend to key
        ``kj`` in row ``b``: any broadcastable index tensors (FlexAttention's mask_mod calls it with
        scalars). Indices outside [0, S) are clamped for the lookups; callers mask them out."""
        S, T = self.k_len, self.q_len
        ok = kj <= qi if self.causal else kj >= -(1 << 40)
        if self.prefix is not None:
            ok = ok | (kj < self.prefix[b])
        if self.window is not None:
            ok = ok & ((kj > qi - self.window) if self.causal else ((qi - kj).abs() <= self.window // 2))
        kc = kj.clamp(0, S - 1)
        if self.chunks is not None:
            cb = b if self.chunks.shape[0] > 1 else 0
            ok = ok & (self.chunks[cb, qi.clamp(0, S - 1)] == self.chunks[cb, kc])
        if self.documents is not None:
            if self.q_documents is not None:
                qd = self.q_documents[b, qi.clamp(0, T - 1)]
            else:
                qd = self.documents[b, qi.clamp(0, S - 1)]
            ok = ok & (qd == self.documents[b, kc])
        if self.padding is not None:
            ok = ok & self.padding[b, kc]
            if T == S and self.q_documents is None:
                ok = ok | (qi == kj)
        return ok

    def bias_at(self, b: Tensor | int, h: Tensor | int, t: Tensor, s: Tensor) -> Tensor:
        """The bias of query ``t`` (0..T-1, query coordinates) and key ``s`` of row ``b``, head ``h``
        (broadcastable index tensors), read from the tensor or computed (:class:`PairBias`)."""
        bias = self.bias
        if isinstance(bias, PairBias):
            return bias.at(b, h, t, s)
        return bias[b if bias.shape[0] > 1 else 0, h if bias.shape[1] > 1 else 0, t, s]

    def reach(self) -> tuple[int | None, int | None]:
        """(back, ahead): the farthest any allowed key lies before / after its query's slot, or None
        where nothing bounds it. Documents bound both by the longest document (one host sync; not inside a
        compiled region, where only the causal flag and the window bound it)."""
        if self.prefix is not None or self.q_documents is not None:
            return None, None
        back = ahead = None
        if self.causal:
            ahead = 0
        if self.window is not None:
            back = self.window_bound()
            ahead = 0 if self.causal else self.window // 2
        if self.chunk is not None:  # a key of the query's chunk lies at most chunk - 1 slots away
            back = self.chunk - 1 if back is None else min(back, self.chunk - 1)
            ahead = self.chunk - 1 if ahead is None else min(ahead, self.chunk - 1)
        if self.documents is not None and not torch.compiler.is_compiling():  # compiled: no host sync
            longest = self._longest_document() - 1
            back = longest if back is None else min(back, longest)
            ahead = longest if ahead is None else min(ahead, longest)
        return back, ahead

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, called once per mask and ``key``: what a backend derives from the mask (its
        dense form, a FlexAttention block mask) is made once a forward pass, for every layer."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def _longest_document(self) -> int:
        def longest() -> int:
            d = self.documents
            change = torch.ones_like(d, dtype=torch.bool)
            change[:, 1:] = d[:, 1:] != d[:, :-1]
            starts = change.flatten().nonzero().squeeze(1)
            ends = torch.cat([starts[1:], starts.new_tensor([d.numel()])])
            row_ends = (starts // d.shape[1] + 1) * d.shape[1]  # a run never spans two rows
            lengths = torch.minimum(ends, row_ends) - starts
            return int(lengths.max()) if lengths.numel() else 0  # none: an empty batch

        return self.cached("longest", longest)

    # ------------------------------------------------------------------------------ dense form
    def dense(self) -> tuple[Tensor | None, bool]:
        """``(attn_mask, is_causal)`` for SDPA: None and SDPA's own causal flag where nothing needs
        combining; else a boolean [B|1, 1, T, S] (True = may attend), or with a bias the bias with
        -inf on the pairs not allowed. Computed once per mask."""
        return self.cached("dense", self._dense)

    def _dense(self) -> tuple[Tensor | None, bool]:
        T, S = self.q_len, self.k_len
        if self.trivial:
            return None, self.causal and (True if T > 1 else False)  # a bool, not a symbolic one (compiled)
        device = next((t.device for t in (self.padding, self.documents, self.bias, self.prefix, self.chunks)
                       if t is not None), self.device)
        qi = torch.arange(T, device=device)[:, None] + self.offset
        kj = torch.arange(S, device=device)[None, :]
        rows = [t for t in (self.padding, self.documents, self.prefix, self.chunks) if t is not None]
        per_row = bool(rows)
        if per_row:
            B = max(t.shape[0] for t in rows)
            b = torch.arange(B, device=device)[:, None, None]
            allowed = self.allowed(b, qi[None], kj[None])[:, None]  # (B, 1, T, S)
        else:
            allowed = self.allowed(0, qi, kj)[None, None]  # (1, 1, T, S)
        if self.bias is None:
            return allowed, False
        bias = self.bias.dense() if isinstance(self.bias, PairBias) else self.bias
        return bias.masked_fill(~allowed, float("-inf")), False


def document_positions(documents: Tensor, padding: Tensor | None = None) -> Tensor:
    """Each token's position within its document ([B, T] ids, a new document wherever the id
    changes): 0, 1, ... restarting at every document; with ``padding`` only real tokens count (a
    padded token takes the position of the real token before it, or 0)."""
    real = torch.ones_like(documents, dtype=torch.long) if padding is None else padding.long()
    count = real.cumsum(dim=1)
    start = torch.ones_like(documents, dtype=torch.bool)
    start[:, 1:] = documents[:, 1:] != documents[:, :-1]
    before = torch.where(start, count - real, torch.zeros_like(count))  # real tokens before each document's start
    before = before.cummax(dim=1).values
    return (count - before - 1).clamp(min=0)
