"""Transformer blocks and stacks: self-attention [+ cross-attention] + FFN, with residuals.

Post-Norm (the paper)::            Pre-Norm (GPT-2, LLaMA, ViT)::

    x = norm(x + drop(attn(x)))        x = x + drop(attn(norm(x)))
    x = norm(x + drop(ffn(x)))         x = x + drop(ffn(norm(x)))
                                       ... and the stack ends with a final norm

With layer scale (CaiT, DeiT III) each sub-layer's output is multiplied by a learned per-channel
vector before the add: ``x + ls(drop(attn(...)))``, in both placements.

Every block of a stack receives the same :class:`BlockContext` (masks, positions, the encoder's
memory) and its own layer's KV cache.

Shapes: B batch, T tokens, S memory tokens, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from zoo.components.attention import Attention
from zoo.components.cache import KVCache, LayerCache
from zoo.components.dropout import Dropout
from zoo.components.position import Position


@dataclass(frozen=True)
class BlockContext:
    """What every block of a stack reads besides its input.

    ``pos``, ``positions``: the model's position module and the tokens' positions ([T], or [B, T]
    with padding), for self-attention's ``pos.rotate``; ``mask``, ``is_causal``: self-attention's mask
    and causal flag (see ``attention_mask``); ``memory`` [B, S, D], ``memory_mask`` (broadcastable to
    [B, H, T, S], True = may attend): cross-attention's keys/values source and its padding.
    """

    pos: Position | None = None
    positions: Tensor | None = None
    mask: Tensor | None = None
    is_causal: bool = False
    memory: Tensor | None = None
    memory_mask: Tensor | None = None


class LayerScale(nn.Module):
    """x [..., D] -> x * gamma, a learned per-channel scale initialised to ``init`` (Touvron et al.
    2021, CaiT; timm's ``LayerScale``)."""

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.init = init
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma

    def extra_repr(self) -> str:
        return f"{self.gamma.shape[0]}, init={self.init}"


class Block(nn.Module):
    """The parts of one layer. ``cross_attn`` (with ``cross_norm``) only in encoder-decoder decoders.
    ``ls_attn``, ``ls_cross``, ``ls_ffn``: layer scales on the sub-layers' outputs (identities when None)."""

    def __init__(
        self,
        *,
        attn: Attention,
        ffn: nn.Module,
        attn_norm: nn.Module,
        ffn_norm: nn.Module,
        cross_attn: Attention | None = None,
        cross_norm: nn.Module | None = None,
        dropout: float = 0.0,
        ls_attn: nn.Module | None = None,
        ls_cross: nn.Module | None = None,
        ls_ffn: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.attn_norm, self.attn, self.ls_attn = attn_norm, attn, ls_attn or nn.Identity()
        if cross_attn is not None:
            self.cross_norm, self.cross_attn, self.ls_cross = cross_norm, cross_attn, ls_cross or nn.Identity()
        else:
            self.cross_attn = None
        self.ffn_norm, self.ffn, self.ls_ffn = ffn_norm, ffn, ls_ffn or nn.Identity()
        self.drop = Dropout(dropout)

    def parts(self) -> list[nn.Module]:
        """The sub-layers: self-attention, cross-attention (if any), FFN."""
        return [p for p in (self.attn, self.cross_attn, self.ffn) if p is not None]

    def _self(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None) -> Tensor:
        return self.attn(x, mask=ctx.mask, is_causal=ctx.is_causal, pos=ctx.pos, positions=ctx.positions, cache=cache)

    def _cross(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None) -> Tensor:
        return self.cross_attn(x, ctx.memory, mask=ctx.memory_mask, cache=cache)


class PreNormBlock(Block):
    def forward(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        x = x + self.ls_attn(self.drop(self._self(self.attn_norm(x), ctx, cache)))
        if self.cross_attn is not None:
            x = x + self.ls_cross(self.drop(self._cross(self.cross_norm(x), ctx, cache)))
        return x + self.ls_ffn(self.drop(self.ffn(self.ffn_norm(x))))


class PostNormBlock(Block):
    def forward(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        x = self.attn_norm(x + self.ls_attn(self.drop(self._self(x, ctx, cache))))
        if self.cross_attn is not None:
            x = self.cross_norm(x + self.ls_cross(self.drop(self._cross(x, ctx, cache))))
        return self.ffn_norm(x + self.ls_ffn(self.drop(self.ffn(x))))


class PostSublayerNormBlock(Block):
    """The norm on each sub-layer's output, inside the residual branch (OLMo 2; Swin V2's
    res-post-norm)::

        x = x + drop(norm(attn(x)))
        x = x + drop(norm(ffn(x)))      ... and the stack ends with a final norm

    (with layer scale: ``x + ls(drop(norm(...)))``)
    """

    def forward(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        x = x + self.ls_attn(self.drop(self.attn_norm(self._self(x, ctx, cache))))
        if self.cross_attn is not None:
            x = x + self.ls_cross(self.drop(self.cross_norm(self._cross(x, ctx, cache))))
        return x + self.ls_ffn(self.drop(self.ffn_norm(self.ffn(x))))


class ParallelBlock(Block):
    """Attention and FFN side by side on the same input (GPT-J, GPT-NeoX, PaLM)::

        x = x + drop(attn(attn_norm(x))) + drop(ffn(ffn_norm(x)))

    With ``ffn_norm=None`` one norm feeds both (GPT-J, PaLM): ``x + drop(attn(h)) + drop(ffn(h))``,
    ``h = attn_norm(x)``. Pre-norm only; no cross-attention. With layer scale each branch is scaled:
    ``x + ls_attn(drop(attn(...))) + ls_ffn(drop(ffn(...)))``.
    """

    def __init__(self, *, ffn_norm: nn.Module | None, cross_attn: Attention | None = None, **parts) -> None:
        if cross_attn is not None:
            raise ValueError("ParallelBlock: a parallel block has no cross-attention")
        super().__init__(ffn_norm=ffn_norm, **parts)

    def forward(self, x: Tensor, ctx: BlockContext, cache: LayerCache | None = None) -> Tensor:
        h = self.attn_norm(x)
        ffn_in = h if self.ffn_norm is None else self.ffn_norm(x)
        return x + self.ls_attn(self.drop(self._self(h, ctx, cache))) + self.ls_ffn(self.drop(self.ffn(ffn_in)))


class Stack(nn.Module):
    """Blocks in sequence, then the final norm (Pre-Norm) or nothing (Post-Norm).

    ``checkpointing``: in training, each block keeps only its input and recomputes the rest in the
    backward pass (``torch.utils.checkpoint``, non-reentrant; random draws such as dropout masks are
    replayed, so the gradients are the same). Set it with ``zoo.train.set_activation_checkpointing``.
    """

    def __init__(self, blocks: list[Block], norm: nn.Module | None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.norm = norm if norm is not None else nn.Identity()
        self.checkpointing = False

    def forward(self, x: Tensor, ctx: BlockContext, cache: KVCache | None = None) -> Tensor:
        """x [B, T, D] -> [B, T, D]; every block reads ``ctx``; ``cache`` holds earlier steps' keys
        and values (incremental decoding), one layer's to each block."""
        recompute = self.checkpointing and cache is None and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if recompute:
                x = checkpoint(block, x, ctx, use_reentrant=False)
            else:
                x = block(x, ctx, cache=cache.layers[i] if cache is not None else None)
        return self.norm(x)

    def new_cache(self, capacity: int) -> KVCache:
        """An empty cache for up to ``capacity`` positions."""
        return KVCache(len(self.blocks), capacity)
